//! `copy_out` and `copy_in` of [`crate::store::copy`] on SQLite.

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, Transaction, params_from_iter};

use crate::store::StoreResult;
use crate::store::copy::{Cell, Row, Table};

fn cell(value: ValueRef<'_>) -> Cell {
    match value {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(i) => Cell::Int(i),
        // No column holds a REAL (balances are CHECKed integers); kept rather than lost.
        ValueRef::Real(f) => Cell::Text(f.to_string()),
        ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
    }
}

fn value(cell: &Cell) -> Value {
    match cell {
        Cell::Null => Value::Null,
        Cell::Int(i) => Value::Integer(*i),
        Cell::Text(t) => Value::Text(t.clone()),
        Cell::Bytes(b) => Value::Blob(b.clone()),
    }
}

/// Up to `limit` rows after the key `after` (empty: from the first), in key order.
pub(super) fn rows(
    conn: &Connection,
    table: &Table,
    after: &[Cell],
    limit: usize,
) -> StoreResult<Vec<Row>> {
    let key = table.key_columns().join(", ");
    let from = if after.is_empty() {
        String::new()
    } else {
        let marks = vec!["?"; after.len()].join(", ");
        format!("WHERE ({key}) > ({marks})")
    };
    let sql = format!(
        "SELECT {} FROM {} {from} ORDER BY {key} LIMIT {limit}",
        table.columns.join(", "),
        table.name
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let width = table.columns.len();
    let rows = stmt
        .query_map(params_from_iter(after.iter().map(value)), |r| {
            (0..width).map(|i| r.get_ref(i).map(cell)).collect()
        })?
        .collect::<Result<Vec<Row>, _>>()?;
    Ok(rows)
}

pub(super) fn count(conn: &Connection, table: &Table) -> StoreResult<u64> {
    let n: i64 = conn.query_row(&format!("SELECT count(*) FROM {}", table.name), [], |r| {
        r.get(0)
    })?;
    Ok(n as u64)
}

/// Insert rows as they are; a row whose key (or any unique column) is present is skipped.
pub(super) fn insert(tx: &Transaction<'_>, table: &Table, rows: &[Row]) -> StoreResult<()> {
    let sql = format!(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING",
        table.name,
        table.columns.join(", "),
        vec!["?"; table.columns.len()].join(", ")
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    for row in rows {
        stmt.execute(params_from_iter(row.iter().map(value)))?;
    }
    Ok(())
}

/// Tables derived from the others, rebuilt after a copy rather than copied.
#[cfg(test)]
pub(super) const DERIVED: &[&str] = &[
    "queue_cursors",
    "loyalty_customer_credits",
    "loyalty_unlisted_credits",
];

/// After a copy: the log's cursors and counts (`queue_cursors`) said nothing of the rows
/// copied in, which came with their own seq; each lane starts again before its oldest
/// never-claimed pending event (or at the end), counting them, as migration 0007 set them.
/// The credits copied in were logged by the trigger of migration 0008 (events are copied
/// first; a credit skipped as already present fires nothing): they are moved into the
/// customers' index, so that an interrupted copy's log does not wait for the consumers.
pub(super) fn rebuild_derived(tx: &Transaction<'_>) -> StoreResult<()> {
    tx.execute_batch(
        "UPDATE queue_cursors SET
            after_seq = ifnull((SELECT min(seq) - 1 FROM events
                                 WHERE status = 'pending' AND attempts = 0
                                   AND lane = queue_cursors.lane),
                               ifnull((SELECT max(seq) FROM events), 0)),
            waiting = (SELECT count(*) FROM events
                        WHERE status = 'pending' AND attempts = 0
                          AND lane = queue_cursors.lane)",
    )?;
    super::customers::list_all(tx)
}

/// The columns of `table` as this database has them, in order (for the schema check).
#[cfg(test)]
pub(super) fn columns(conn: &Connection, table: &str) -> Vec<String> {
    conn.prepare(&format!(
        "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
    ))
    .unwrap()
    .query_map([], |r| r.get(0))
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

#[cfg(test)]
mod tests {
    use crate::store::Store as _;
    use crate::store::copy::TABLES;
    use crate::store::sqlite::{SqliteOptions, SqliteStore};

    /// The copy's table list is the whole schema: a migration that adds a table or a column
    /// fails here until `store::copy::TABLES` names it.
    #[test]
    fn the_copy_names_every_table_and_column_of_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        store.migrate().unwrap();
        let conn = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
        let mut tables: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'table'
                   AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations' ORDER BY name",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        tables.retain(|t| !super::DERIVED.contains(&t.as_str()));
        let mut named: Vec<String> = TABLES.iter().map(|t| t.name.to_string()).collect();
        tables.sort();
        named.sort();
        assert_eq!(tables, named);
        for table in TABLES {
            assert_eq!(
                super::columns(&conn, table.name),
                table.columns,
                "{}",
                table.name
            );
        }
    }
}
