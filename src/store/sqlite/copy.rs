//! `copy_in` of [`crate::store::copy`] on SQLite, and what a copy rebuilds after it (its
//! reads are `store::sql::copy`'s).

use rusqlite::types::Value;
use rusqlite::{Transaction, params_from_iter};

use crate::store::StoreResult;
use crate::store::copy::{Cell, Row, Table};

fn value(cell: &Cell) -> Value {
    match cell {
        Cell::Null => Value::Null,
        Cell::Int(i) => Value::Integer(*i),
        Cell::Text(t) => Value::Text(t.clone()),
        Cell::Bytes(b) => Value::Blob(b.clone()),
    }
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
pub(super) fn columns(conn: &rusqlite::Connection, table: &str) -> Vec<String> {
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
