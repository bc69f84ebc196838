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

/// Insert rows as they are; a row whose key (or any unique column) is present is skipped.
///
/// `events` and `event_payloads` are views here (migration 0009): an event goes into the log
/// and gets its state row, and a body goes into its event's log row. The cursor then moves
/// to the end of the log in the same transaction, so that an event copied in, whatever its
/// seq, is never also taken for a first attempt waiting after the cursor.
pub(super) fn insert(tx: &Transaction<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    match table.name {
        "events" => insert_events(tx, table, rows),
        "event_payloads" => insert_bodies(tx, table, rows),
        "event_attempts" => insert_attempts(tx, table, rows),
        _ => insert_rows(tx, table, rows),
    }
}

/// The statement inserting a row of `table` into `into` (the columns they share, as `into`
/// has them), and where each of those columns is in the row.
fn projection(
    tx: &Transaction<'_>,
    table: &Table,
    into: &str,
) -> StoreResult<(String, Vec<usize>)> {
    let mut names = Vec::new();
    let mut at = Vec::new();
    let mut stmt = tx.prepare_cached("SELECT name FROM pragma_table_info(?1) ORDER BY cid")?;
    for name in stmt.query_map([into], |r| r.get::<_, String>(0))? {
        let name = name?;
        if let Some(i) = table.columns.iter().position(|c| *c == name) {
            names.push(name);
            at.push(i);
        }
    }
    let sql = format!(
        "INSERT INTO {into} ({}) VALUES ({}) ON CONFLICT DO NOTHING",
        names.join(", "),
        vec!["?"; names.len()].join(", ")
    );
    Ok((sql, at))
}

/// The implicit subscription that handled an event (migration 0011's numbering): a copied
/// event's one state goes to it.
fn implicit_sub(table: &Table, row: &Row) -> i64 {
    let column = |name: &str| {
        table
            .columns
            .iter()
            .position(|c| *c == name)
            .map(|i| &row[i])
    };
    match (column("lane"), column("event_type")) {
        (Some(Cell::Int(1)), _) => 2,
        (_, Some(Cell::Text(t))) if t == crate::handlers::ORDER_COMPLETED => 1,
        _ => 3,
    }
}

fn insert_events(tx: &Transaction<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    let (log_sql, log_at) = projection(tx, table, "event_log")?;
    let (state_sql, state_at) = projection(tx, table, "event_state")?;
    // The state's subscription comes last, as the row has no column for it.
    let state_sql = state_sql
        .replacen(") VALUES (", ", sub) VALUES (", 1)
        .replacen(") ON CONFLICT", ", ?) ON CONFLICT", 1);
    let mut log = tx.prepare_cached(&log_sql)?;
    let mut state = tx.prepare_cached(&state_sql)?;
    let mut written = 0;
    for row in rows {
        if log.execute(params_from_iter(log_at.iter().map(|&i| value(&row[i]))))? == 1 {
            // An event no route matched (`stored`) has no state.
            let status = table.columns.iter().position(|c| *c == "status");
            let stored = status.is_some_and(|i| row[i] == Cell::Text("stored".into()));
            if !stored {
                let sub = rusqlite::types::Value::Integer(implicit_sub(table, row));
                let values = state_at.iter().map(|&i| value(&row[i]));
                state.execute(params_from_iter(values.chain(std::iter::once(sub))))?;
            }
            written += 1;
        }
    }
    settle_cursor(tx)?;
    Ok(written)
}

/// An attempt goes to its event's one state (see `insert_events`).
fn insert_attempts(tx: &Transaction<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    let sql = format!(
        "INSERT INTO event_attempts (sub, {}) VALUES ((SELECT min(sub) FROM event_state
          WHERE seq = ?1), {}) ON CONFLICT DO NOTHING",
        table.columns.join(", "),
        (1..=table.columns.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut written = 0;
    for row in rows {
        written += stmt.execute(params_from_iter(row.iter().map(value)))? as u64;
    }
    Ok(written)
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

/// Give every first attempt still waiting after the cursor its state row (pending, due since
/// it was received), then move the cursor to the end of the log: rows inserted with their own
/// seq may sit anywhere, and afterwards the log after the cursor starts empty, with no gaps.
fn settle_cursor(tx: &Transaction<'_>) -> StoreResult<()> {
    tx.execute_batch(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at)
         SELECT l.seq, CASE WHEN l.event_type = 'order.completed' THEN 1 ELSE 3 END, 0,
                'pending', l.received_at FROM event_log l
          WHERE l.seq > (SELECT after_seq FROM queue_cursors WHERE lane = 0) AND l.lane = 0
            AND NOT EXISTS (SELECT 1 FROM event_state s WHERE s.seq = l.seq);
         UPDATE queue_cursors SET after_seq = (SELECT ifnull(max(seq), 0) FROM event_log)
          WHERE lane = 0",
    )?;
    Ok(())
}

fn insert_rows(tx: &Transaction<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    let sql = format!(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING",
        table.name,
        table.columns.join(", "),
        vec!["?"; table.columns.len()].join(", ")
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut written = 0;
    for row in rows {
        written += stmt.execute(params_from_iter(row.iter().map(value)))? as u64;
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

/// Tables derived from the others, rebuilt after a copy rather than copied (and the copy's own
/// mark).
#[cfg(test)]
pub(super) const DERIVED: &[&str] = &[
    "copy_in_progress",
    "queue_cursors",
    "subscriptions",
    // The registry's version and the nodes sharing a database are the target's own.
    "subscription_registry",
    "nodes",
    // Generated secrets: a node with the same config shares its own again at start.
    "subscription_secrets",
    // Alerts are about the database they were raised on: a copy starts with none.
    "alert_state",
    "alert_notices",
    "loyalty_customer_credits",
    "loyalty_unlisted_credits",
];

/// After a copy: the cursor was settled with each page of events; the credits copied in were
/// logged by the trigger of migration 0008 (events are copied first; a credit skipped as
/// already present fires nothing): they are moved into the customers' index, so that an
/// interrupted copy's log does not wait for the consumers.
pub(super) fn rebuild_derived(tx: &Transaction<'_>) -> StoreResult<()> {
    settle_cursor(tx)?;
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
                "SELECT name FROM sqlite_schema WHERE (type = 'table' OR type = 'view')
                   AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations' ORDER BY name",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        // The log and the state are copied as the `events` and `event_payloads` views: every
        // column of theirs must be in one of those.
        let viewed: Vec<String> = ["events", "event_payloads"]
            .iter()
            .flat_map(|v| super::columns(&conn, v))
            .collect();
        for stored in ["event_log", "event_state"] {
            // A copied event's one state is its implicit subscription's, which is not ordered
            // (no key).
            for column in super::columns(&conn, stored)
                .into_iter()
                .filter(|c| c != "sub" && c != "order_key")
            {
                assert!(viewed.contains(&column), "{stored}.{column} is not copied");
            }
        }
        tables.retain(|t| {
            !super::DERIVED.contains(&t.as_str()) && t != "event_log" && t != "event_state"
        });
        let mut named: Vec<String> = TABLES.iter().map(|t| t.name.to_string()).collect();
        tables.sort();
        named.sort();
        assert_eq!(tables, named);
        for table in TABLES {
            // An attempt's subscription is its event's one state's (see `insert_attempts`).
            let mut columns = super::columns(&conn, table.name);
            columns.retain(|c| !(table.name == "event_attempts" && c == "sub"));
            assert_eq!(columns, table.columns, "{}", table.name);
        }
    }
}
