//! `copy_out` and `copy_in` of [`crate::store::copy`] on SQLite.

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OptionalExtension as _, Transaction, params_from_iter};

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

/// Insert rows as they are; a row whose key (or any unique column) is present is skipped,
/// but a seeded one ([`Table::seeded`]) is replaced.
///
/// `event_payloads` is a view here (migration 0009): a body goes into its event's log row.
pub(super) fn insert(tx: &Transaction<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    if table.name == "event_payloads" {
        return insert_bodies(tx, table, rows);
    }
    let sql = format!(
        "INSERT INTO {} ({}) VALUES ({}) {}",
        table.name,
        table.columns.join(", "),
        vec!["?"; table.columns.len()].join(", "),
        table.on_conflict()
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut written = 0;
    for row in rows {
        written += stmt.execute(params_from_iter(row.iter().map(value)))? as u64;
    }
    Ok(written)
}

pub(super) fn forget(tx: &Transaction<'_>, table: &Table, key: i64) -> StoreResult<()> {
    if table.seeded.contains(&key) {
        tx.execute(
            &format!("DELETE FROM {} WHERE {} = ?1", table.name, table.columns[0]),
            [key],
        )?;
    }
    Ok(())
}

fn insert_bodies(tx: &Transaction<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    debug_assert_eq!(
        table.columns,
        ["seq", "payload", "content_type", "traceparent"]
    );
    let mut body = tx.prepare_cached(
        "UPDATE event_log SET payload = ?2, content_type = ?3, traceparent = ?4
          WHERE seq = ?1 AND payload IS NULL",
    )?;
    let mut written = 0;
    for row in rows {
        written += body.execute(params_from_iter(row.iter().map(value)))? as u64;
    }
    Ok(written)
}

/// Mark a copy into this database as started, or clear the mark.
pub(super) fn mark(tx: &Transaction<'_>, started_at: Option<i64>) -> StoreResult<()> {
    match started_at {
        Some(at) => tx.execute(
            "INSERT INTO copy_in_progress (id, started_at) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at",
            [at],
        )?,
        None => tx.execute("DELETE FROM copy_in_progress", [])?,
    };
    Ok(())
}

pub(super) fn unfinished(conn: &Connection) -> StoreResult<Option<i64>> {
    Ok(conn
        .query_row("SELECT started_at FROM copy_in_progress", [], |r| r.get(0))
        .optional()?)
}

/// Tables not copied, each the target's own or rebuilt after a copy (and the copy's own mark).
#[cfg(test)]
pub(super) const DERIVED: &[&str] = &[
    "copy_in_progress",
    // Set to the source's by `rebuild_derived`.
    "queue_cursor",
    // The registry's version is moved on; the nodes sharing a database are the target's own.
    "subscription_registry",
    "nodes",
    "loyalty_customer_credits",
    "loyalty_unlisted_credits",
    // A view of the log and the states, copied as those.
    "events",
];

pub(super) fn cursor(conn: &Connection) -> StoreResult<i64> {
    Ok(conn.query_row(
        "SELECT after_seq FROM queue_cursor WHERE id = 0",
        [],
        |r| r.get(0),
    )?)
}

/// After a copy: the source's fan-out cursor (the copied lane-0 events up to it have their
/// states, those after it are fanned out by the target's first claim); the credits copied in
/// were logged by the trigger of migration 0008 (events are copied first; a credit skipped as
/// already present fires nothing): they are moved into the customers' index, so that an
/// interrupted copy's log does not wait for the consumers; the registry's version moved on.
pub(super) fn rebuild_derived(tx: &Transaction<'_>, cursor: i64) -> StoreResult<()> {
    tx.execute(
        "UPDATE queue_cursor SET after_seq = ?1 WHERE id = 0",
        [cursor],
    )?;
    super::customers::list_all(tx)?;
    crate::store::sql::registry::bump(&mut super::dialect::Sqlite(tx))
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
                "SELECT name FROM sqlite_schema WHERE (type = 'table' OR type = 'view')
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
        // The log's bodies are copied as the `event_payloads` view: its columns after the key.
        let bodies = super::columns(&conn, "event_payloads");
        for table in TABLES {
            let mut columns = super::columns(&conn, table.name);
            if table.name == "event_log" {
                columns.retain(|c| !bodies[1..].contains(c));
            }
            assert_eq!(columns, table.columns, "{}", table.name);
        }
    }
}
