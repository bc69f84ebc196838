//! `copy_out` and `copy_in` of [`crate::store::copy`] on PostgreSQL. Cells are typed by the
//! column: `bigint` and `boolean` (0 and 1, as SQLite stores it) cross as integers, `text` as
//! text, `bytea` as bytes.

use postgres::types::{ToSql, Type};

use super::session::Db;
use crate::store::copy::{Cell, Row, Table};
use crate::store::{StoreError, StoreResult};

fn cell(row: &postgres::Row, i: usize) -> StoreResult<Cell> {
    let ty = row.columns()[i].type_().clone();
    Ok(match ty {
        Type::INT8 => row
            .try_get::<_, Option<i64>>(i)?
            .map_or(Cell::Null, Cell::Int),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)?
            .map_or(Cell::Null, |v| Cell::Int(v.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)?
            .map_or(Cell::Null, |v| Cell::Int(v.into())),
        Type::BYTEA => row
            .try_get::<_, Option<Vec<u8>>>(i)?
            .map_or(Cell::Null, Cell::Bytes),
        Type::TEXT => row
            .try_get::<_, Option<String>>(i)?
            .map_or(Cell::Null, Cell::Text),
        other => {
            return Err(StoreError::Internal(anyhow::anyhow!(
                "column {} has type {other}, which the copy does not carry",
                row.columns()[i].name()
            )));
        }
    })
}

/// A cell as a parameter of the column's type (`ty`, from the prepared statement).
fn value(cell: &Cell, ty: &Type) -> StoreResult<Box<dyn ToSql + Sync>> {
    let mismatch = || {
        StoreError::Internal(anyhow::anyhow!(
            "a copied value {cell:?} does not fit a column of type {ty}"
        ))
    };
    Ok(match (cell, ty) {
        (Cell::Null, &Type::INT8) => Box::new(None::<i64>),
        (Cell::Null, &Type::BOOL) => Box::new(None::<bool>),
        (Cell::Null, &Type::BYTEA) => Box::new(None::<Vec<u8>>),
        (Cell::Null, _) => Box::new(None::<String>),
        (Cell::Int(i), &Type::INT8) => Box::new(*i),
        (Cell::Int(i), &Type::BOOL) => Box::new(*i != 0),
        (Cell::Text(t), &Type::TEXT) => Box::new(t.clone()),
        (Cell::Bytes(b), &Type::BYTEA) => Box::new(b.clone()),
        // SQLite is loosely typed: text in a bytea column is its bytes.
        (Cell::Text(t), &Type::BYTEA) => Box::new(t.as_bytes().to_vec()),
        _ => return Err(mismatch()),
    })
}

/// Up to `limit` rows after the key `after` (empty: from the first), in key order.
pub(super) fn rows(
    db: &mut Db<'_>,
    table: &Table,
    after: &[Cell],
    limit: usize,
) -> StoreResult<Vec<Row>> {
    let key = table.key_columns().join(", ");
    let from = if after.is_empty() {
        String::new()
    } else {
        let marks: Vec<String> = (1..=after.len()).map(|i| format!("${i}")).collect();
        format!("WHERE ({key}) > ({})", marks.join(", "))
    };
    // The key's values are typed like the table's own columns (SQLite's key types are text
    // and integer only).
    let after_values: Vec<Box<dyn ToSql + Sync>> = after
        .iter()
        .map(|c| -> Box<dyn ToSql + Sync> {
            match c {
                Cell::Int(i) => Box::new(*i),
                Cell::Text(t) => Box::new(t.clone()),
                Cell::Bytes(b) => Box::new(b.clone()),
                Cell::Null => Box::new(None::<String>),
            }
        })
        .collect();
    let params: Vec<&(dyn ToSql + Sync)> = after_values.iter().map(|v| v.as_ref()).collect();
    let sql = format!(
        "SELECT {} FROM {} {from} ORDER BY {key} LIMIT {limit}",
        table.columns.join(", "),
        table.name
    );
    db.query(&sql, &params)?
        .iter()
        .map(|r| (0..table.columns.len()).map(|i| cell(r, i)).collect())
        .collect()
}

pub(super) fn count(db: &mut Db<'_>, table: &Table) -> StoreResult<u64> {
    let n: i64 = db
        .query_one(&format!("SELECT count(*) FROM {}", table.name), &[])?
        .try_get(0)?;
    Ok(n as u64)
}

/// Insert rows as they are; a row whose key (or any unique column) is present is skipped,
/// but a seeded one ([`Table::seeded`]) is replaced.
pub(super) fn insert(db: &mut Db<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    let marks: Vec<String> = (1..=table.columns.len()).map(|i| format!("${i}")).collect();
    // A secret's id is generated always (migration 0009): the copy keeps the source's.
    let overriding = if table.name == "subscription_secrets" {
        "OVERRIDING SYSTEM VALUE"
    } else {
        ""
    };
    let sql = format!(
        "INSERT INTO {} ({}) {overriding} VALUES ({}) {}",
        table.name,
        table.columns.join(", "),
        marks.join(", "),
        table.on_conflict()
    );
    let types = db.param_types(&sql)?;
    let mut written = 0;
    for row in rows {
        let values = row
            .iter()
            .zip(&types)
            .map(|(cell, ty)| value(cell, ty))
            .collect::<StoreResult<Vec<_>>>()?;
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
        written += db.execute(&sql, &params)?;
    }
    Ok(written)
}

pub(super) fn forget(db: &mut Db<'_>, table: &Table, key: i64) -> StoreResult<()> {
    if table.seeded.contains(&key) {
        db.execute(
            &format!("DELETE FROM {} WHERE {} = $1", table.name, table.columns[0]),
            &[&key],
        )?;
    }
    Ok(())
}

pub(super) fn cursor(db: &mut Db<'_>) -> StoreResult<i64> {
    Ok(db
        .query_one("SELECT after_seq FROM queue_cursor", &[])?
        .try_get(0)?)
}

/// After a copy: the source's fan-out cursor (the copied lane-0 events up to it have their
/// states, those after it are fanned out by the target's first claim); new rows get keys after
/// every copied one (events, rejections, subscriptions, secrets, notices); the registry's
/// version moved on.
pub(super) fn finished(db: &mut Db<'_>, cursor: i64) -> StoreResult<()> {
    db.execute("UPDATE queue_cursor SET after_seq = $1", &[&cursor])?;
    for (table, column) in [
        ("event_log", "seq"),
        ("rejections", "id"),
        ("subscriptions", "id"),
        ("subscription_secrets", "id"),
        ("alert_notices", "id"),
    ] {
        db.batch(&format!(
            "SELECT setval(pg_get_serial_sequence('{table}', '{column}'),
                           greatest((SELECT max({column}) FROM {table}), 1),
                           (SELECT max({column}) FROM {table}) IS NOT NULL)"
        ))?;
    }
    crate::store::sql::registry::bump(db)
}

/// Mark a copy into this database as started, or clear the mark.
pub(super) fn mark(db: &mut Db<'_>, started_at: Option<i64>) -> StoreResult<()> {
    match started_at {
        Some(at) => db.execute(
            "INSERT INTO copy_in_progress (id, started_at) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at",
            &[&at],
        )?,
        None => db.execute("DELETE FROM copy_in_progress", &[])?,
    };
    Ok(())
}

pub(super) fn unfinished(db: &mut Db<'_>) -> StoreResult<Option<i64>> {
    Ok(db
        .query_opt("SELECT started_at FROM copy_in_progress", &[])?
        .map(|r| r.try_get(0))
        .transpose()?)
}
