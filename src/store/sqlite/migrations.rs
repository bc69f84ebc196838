//! Numbered SQL files from `migrations/`, embedded in the binary, applied in order and recorded
//! in `schema_migrations`. A shipped file is never edited: a change is a new file.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::store::{StoreError, StoreResult};

/// `(version, name, sql)`, in order.
pub const MIGRATIONS: &[(u32, &str, &str)] = &[
    (
        1,
        "events",
        include_str!("../../../migrations/0001_events.sql"),
    ),
    (
        2,
        "requests",
        include_str!("../../../migrations/0002_requests.sql"),
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
pub(super) fn apply(conn: &mut Connection) -> StoreResult<Vec<u32>> {
    conn.execute_batch(BOOKKEEPING)?;
    let mut applied = Vec::new();
    for &(version, name, sql) in MIGRATIONS {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = ?1)",
            [version],
            |r| r.get(0),
        )?;
        if !done {
            tx.execute_batch(sql).map_err(|e| {
                StoreError::Internal(
                    anyhow::Error::new(e)
                        .context(format!("applying migration {version:04}_{name}.sql")),
                )
            })?;
            tx.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (?1, ?2)",
                rusqlite::params![version, name],
            )?;
            applied.push(version);
        }
        tx.commit()?;
    }
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
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
mod tests {
    use super::*;

    #[test]
    fn migrations_apply_cleanly_to_an_empty_database_and_only_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
        conn.execute_batch("PRAGMA foreign_keys = ON").unwrap();
        assert!(!is_current(&conn).unwrap());
        let all: Vec<u32> = MIGRATIONS.iter().map(|m| m.0).collect();
        assert_eq!(apply(&mut conn).unwrap(), all);
        assert!(is_current(&conn).unwrap());
        assert_eq!(
            apply(&mut conn).unwrap(),
            Vec::<u32>::new(),
            "a second run applies nothing"
        );
        let recorded: i64 = conn
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(recorded, all.len() as i64);
        let integrity: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(integrity, "ok");
        // Versions are numbered in order, with their files named to match.
        for (i, (version, _, _)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version as usize, i + 1);
        }
    }

    #[test]
    fn a_database_newer_than_the_binary_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
        apply(&mut conn).unwrap();
        conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES (999, 'future')",
            [],
        )
        .unwrap();
        let err = apply(&mut conn).unwrap_err().to_string();
        assert!(err.contains("newer"), "{err}");
    }
}
