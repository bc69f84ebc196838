//! Numbered SQL files from `migrations/`, embedded in the binary, applied in order and recorded
//! in `schema_migrations`. A shipped file is never edited: a change is a new file.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::store::{StoreError, StoreResult};

/// `(version, name, sql)`, in order.
pub const MIGRATIONS: &[(u32, &str, &str)] = &[
    (
        1,
        "events",
        include_str!("../../../migrations/sqlite/0001_events.sql"),
    ),
    (
        2,
        "requests",
        include_str!("../../../migrations/sqlite/0002_requests.sql"),
    ),
    (
        3,
        "checks_without_in_lists",
        include_str!("../../../migrations/sqlite/0003_checks_without_in_lists.sql"),
    ),
    (
        4,
        "seq_is_the_rowid",
        include_str!("../../../migrations/sqlite/0004_seq_is_the_rowid.sql"),
    ),
    (
        5,
        "lanes_and_integer_balances",
        include_str!("../../../migrations/sqlite/0005_lanes_and_integer_balances.sql"),
    ),
    (
        6,
        "tombstones",
        include_str!("../../../migrations/sqlite/0006_tombstones.sql"),
    ),
    (
        7,
        "log_structured_queue",
        include_str!("../../../migrations/sqlite/0007_log_structured_queue.sql"),
    ),
    (
        8,
        "customer_credits",
        include_str!("../../../migrations/sqlite/0008_customer_credits.sql"),
    ),
    (
        9,
        "event_log",
        include_str!("../../../migrations/sqlite/0009_event_log.sql"),
    ),
    (
        10,
        "rejections",
        include_str!("../../../migrations/sqlite/0010_rejections.sql"),
    ),
    (
        11,
        "subscriptions",
        include_str!("../../../migrations/sqlite/0011_subscriptions.sql"),
    ),
    (
        12,
        "breakers",
        include_str!("../../../migrations/sqlite/0012_breakers.sql"),
    ),
    (
        13,
        "ordering",
        include_str!("../../../migrations/sqlite/0013_ordering.sql"),
    ),
    (
        14,
        "registry",
        include_str!("../../../migrations/sqlite/0014_registry.sql"),
    ),
    (
        15,
        "alerts",
        include_str!("../../../migrations/sqlite/0015_alerts.sql"),
    ),
    (
        16,
        "secrets",
        include_str!("../../../migrations/sqlite/0016_secrets.sql"),
    ),
    (
        17,
        "subscription_settings",
        include_str!("../../../migrations/sqlite/0017_subscription_settings.sql"),
    ),
    (
        18,
        "sessions",
        include_str!("../../../migrations/sqlite/0018_sessions.sql"),
    ),
    (
        19,
        "traces",
        include_str!("../../../migrations/sqlite/0019_traces.sql"),
    ),
    (
        20,
        "filters",
        include_str!("../../../migrations/sqlite/0020_filters.sql"),
    ),
    (
        21,
        "claimer",
        include_str!("../../../migrations/sqlite/0021_claimer.sql"),
    ),
    (
        22,
        "transforms",
        include_str!("../../../migrations/sqlite/0022_transforms.sql"),
    ),
    (
        24,
        "queue_cursor",
        include_str!("../../../migrations/sqlite/0024_queue_cursor.sql"),
    ),
    (
        25,
        "event_key_order",
        include_str!("../../../migrations/sqlite/0025_event_key_order.sql"),
    ),
];

const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
)";

fn latest_applied(conn: &Connection) -> rusqlite::Result<Option<u32>> {
    conn.query_row("SELECT max(version) FROM schema_migrations", [], |r| {
        r.get(0)
    })
    .optional()
    .map(Option::flatten)
}

/// Apply what is missing, each migration in its own `BEGIN IMMEDIATE` transaction so that two
/// processes starting at once cannot both apply one. Returns the versions applied now.
///
/// Foreign keys are off while migrations run (the pragma is a no-op inside a transaction), so
/// that a migration can rebuild a table that others reference, as SQLite's documented
/// procedure for schema changes asks; `PRAGMA foreign_key_check` must then find nothing
/// before each migration commits. They are on again afterwards, whatever happened.
pub(super) fn apply(conn: &mut Connection) -> StoreResult<Vec<u32>> {
    let enforced: bool = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
    conn.execute_batch("PRAGMA foreign_keys = OFF")?;
    let result = apply_all(conn, MIGRATIONS);
    if enforced {
        conn.execute_batch("PRAGMA foreign_keys = ON")?;
    }
    result
}

pub(super) fn apply_all(
    conn: &mut Connection,
    migrations: &[(u32, &str, &str)],
) -> StoreResult<Vec<u32>> {
    conn.execute_batch(BOOKKEEPING)?;
    // A new file takes every migration in milliseconds: only an upgrade says which it applies.
    let upgrade = latest_applied(conn)?.is_some();
    let mut applied = Vec::new();
    for &(version, name, sql) in migrations {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = ?1)",
            [version],
            |r| r.get(0),
        )?;
        if !done {
            let context = || format!("applying migration {version:04}_{name}.sql");
            // Some rebuild a table (0025 the log: about a second per 100,000 events): a start
            // that takes long says why.
            if upgrade {
                tracing::info!(version, name, "applying a schema migration");
            }
            tx.execute_batch(sql)
                .map_err(|e| StoreError::Internal(anyhow::Error::new(e).context(context())))?;
            if version == 16 {
                // What SQL alone cannot do here: SHA-256.
                super::secrets::digest_plain_tokens(&tx)?;
            }
            let dangling: i64 =
                tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
                    r.get(0)
                })?;
            if dangling > 0 {
                return Err(StoreError::Internal(anyhow::anyhow!(
                    "{}: {dangling} rows would break a foreign key",
                    context()
                )));
            }
            tx.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (?1, ?2)",
                rusqlite::params![version, name],
            )?;
            applied.push(version);
        }
        tx.commit()?;
    }
    if !applied.is_empty() {
        // A migration that rebuilds a table leaves the old one's pages on the freelist (0009
        // a whole copy of the bodies: 510 MB for a million events); they go back to the file
        // system rather than waiting for later writes to reuse them.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        super::purge::give_back_free_pages(&tx)?;
        tx.commit()?;
    }
    let known = migrations.last().map(|m| m.0).unwrap_or(0);
    if let Some(latest) = latest_applied(conn)?
        && latest > known
    {
        return Err(StoreError::Internal(anyhow::anyhow!(
            "database is at migration {latest}, newer than this binary knows ({known})"
        )));
    }
    Ok(applied)
}

/// True when every embedded migration is recorded (readiness).
pub(super) fn is_current(conn: &Connection) -> StoreResult<bool> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'schema_migrations')",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(false);
    }
    let known = MIGRATIONS.last().map(|m| m.0);
    Ok(latest_applied(conn)? == known)
}

#[cfg(test)]
#[path = "migrations_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "migrations_key_tests.rs"]
mod key_tests;
