//! The copy's reads of a table ([`crate::store::copy`]) and its bookkeeping, on either store.
//! Writing the rows stays per store: SQLite puts a body into its event's log row, PostgreSQL
//! types each value by its column and keeps the source's generated ids.

use super::{Conn, Value};
use crate::store::StoreResult;
use crate::store::copy::{Cell, Row, Table};

fn cell(value: Value) -> Cell {
    match value {
        Value::Null => Cell::Null,
        Value::Int(i) => Cell::Int(i),
        Value::Text(t) => Cell::Text(t),
        Value::Bytes(b) => Cell::Bytes(b),
        // No column is read as a list.
        Value::Ints(list) => Cell::Text(format!("{list:?}")),
    }
}

fn value(cell: &Cell) -> Value {
    match cell {
        Cell::Null => Value::Null,
        Cell::Int(i) => Value::Int(*i),
        Cell::Text(t) => Value::Text(t.clone()),
        Cell::Bytes(b) => Value::Bytes(b.clone()),
    }
}

/// Up to `limit` rows after the key `after` (empty: from the first), in key order.
pub fn rows(
    conn: &mut impl Conn,
    table: &Table,
    after: &[Cell],
    limit: usize,
) -> StoreResult<Vec<Row>> {
    let key = table.key_columns().join(", ");
    let from = if after.is_empty() {
        String::new()
    } else {
        let marks: Vec<String> = (1..=after.len()).map(|i| format!("?{i}")).collect();
        format!("WHERE ({key}) > ({})", marks.join(", "))
    };
    let sql = format!(
        "SELECT {} FROM {} {from} ORDER BY {key} LIMIT {limit}",
        table.columns.join(", "),
        table.name
    );
    let after: Vec<Value> = after.iter().map(value).collect();
    Ok(conn
        .query(&sql, &after)?
        .into_iter()
        .map(|row| row.into_values().into_iter().map(cell).collect())
        .collect())
}

pub fn count(conn: &mut impl Conn, table: &Table) -> StoreResult<u64> {
    let n = conn
        .query_one(&format!("SELECT count(*) FROM {}", table.name), &[])?
        .int(0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The fan-out's cursor: the copied webhooks' events up to it have their states.
pub fn cursor(conn: &mut impl Conn) -> StoreResult<i64> {
    conn.query_one(&format!("SELECT {}", super::CURSOR), &[])?
        .int(0)
}

/// Mark a copy into this database as started, or clear the mark.
pub fn mark(conn: &mut impl Conn, started_at: Option<i64>) -> StoreResult<()> {
    match started_at {
        Some(at) => conn.execute(
            "INSERT INTO copy_in_progress (id, started_at) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at",
            &[Value::Int(at)],
        )?,
        None => conn.execute("DELETE FROM copy_in_progress", &[])?,
    };
    Ok(())
}

pub fn unfinished(conn: &mut impl Conn) -> StoreResult<Option<i64>> {
    conn.query_opt("SELECT started_at FROM copy_in_progress", &[])?
        .map(|r| r.int(0))
        .transpose()
}
