//! Numbered SQL files from `migrations/postgres/`, embedded, applied in order and recorded in
//! `schema_migrations`. A shipped file is never edited: a change is a new file.
//!
//! Several nodes may start at once: the whole run is one transaction that first takes a
//! transaction-level advisory lock, so one node applies and the others wait, then find
//! everything recorded and apply nothing. PostgreSQL's DDL is transactional: a migration that
//! fails leaves nothing behind.

use super::session::Conn;
use super::session::Db;
use crate::store::{StoreError, StoreResult};

/// `(version, name, sql)`, in order.
pub const MIGRATIONS: &[(u32, &str, &str)] = &[
    (
        1,
        "schema",
        include_str!("../../../migrations/postgres/0001_schema.sql"),
    ),
    (
        2,
        "rejections",
        include_str!("../../../migrations/postgres/0002_rejections.sql"),
    ),
    (
        3,
        "subscriptions",
        include_str!("../../../migrations/postgres/0003_subscriptions.sql"),
    ),
    (
        4,
        "breakers",
        include_str!("../../../migrations/postgres/0004_breakers.sql"),
    ),
    (
        5,
        "ordering",
        include_str!("../../../migrations/postgres/0005_ordering.sql"),
    ),
    (
        6,
        "lighter_writes",
        include_str!("../../../migrations/postgres/0006_lighter_writes.sql"),
    ),
    (
        7,
        "registry",
        include_str!("../../../migrations/postgres/0007_registry.sql"),
    ),
    (
        8,
        "alerts",
        include_str!("../../../migrations/postgres/0008_alerts.sql"),
    ),
    (
        9,
        "secrets",
        include_str!("../../../migrations/postgres/0009_secrets.sql"),
    ),
    (
        10,
        "subscription_settings",
        include_str!("../../../migrations/postgres/0010_subscription_settings.sql"),
    ),
    (
        11,
        "sessions",
        include_str!("../../../migrations/postgres/0011_sessions.sql"),
    ),
    (
        12,
        "traces",
        include_str!("../../../migrations/postgres/0012_traces.sql"),
    ),
    (
        13,
        "filters",
        include_str!("../../../migrations/postgres/0013_filters.sql"),
    ),
    (
        14,
        "claimer",
        include_str!("../../../migrations/postgres/0014_claimer.sql"),
    ),
    (
        15,
        "transforms",
        include_str!("../../../migrations/postgres/0015_transforms.sql"),
    ),
];

/// The advisory lock key that serialises migration runs ("webhook-inbox" in ASCII, cut to
/// 63 bits): any constant both nodes agree on.
const LOCK_KEY: i64 = 0x7765_6268_6f6f_6b69;

/// How long a node waits for another node's migration run (the connection's `lock_timeout`
/// is meant for short row locks).
const WAIT_FOR_OTHER_NODE: &str = "SET LOCAL lock_timeout = '60s'";

const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     NOT NULL PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)";

/// Apply what is missing; returns the versions applied now.
pub(super) fn apply(conn: &mut Conn) -> StoreResult<Vec<u32>> {
    let applied = {
        let mut db = conn.begin()?;
        db.batch(WAIT_FOR_OTHER_NODE)?;
        db.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])?;
        db.batch(BOOKKEEPING)?;
        let applied = apply_all(&mut db, MIGRATIONS)?;
        db.commit()?;
        applied
    };
    if !applied.is_empty() {
        // Plans prepared before a schema change may not survive it.
        conn.forget_statements();
    }
    Ok(applied)
}

fn apply_all(db: &mut Db<'_>, migrations: &[(u32, &str, &str)]) -> StoreResult<Vec<u32>> {
    let mut applied = Vec::new();
    for &(version, name, sql) in migrations {
        let version_i = i32::try_from(version).expect("migration versions are small");
        let done: bool = db
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)",
                &[&version_i],
            )?
            .try_get(0)?;
        if done {
            continue;
        }
        db.batch(sql).map_err(|e| match e {
            StoreError::Internal(e) => StoreError::Internal(
                e.context(format!("applying migration {version:04}_{name}.sql")),
            ),
            unavailable => unavailable,
        })?;
        db.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&version_i, &name],
        )?;
        applied.push(version);
    }
    let known = migrations.last().map(|m| m.0).unwrap_or(0);
    let latest: Option<i32> = db
        .query_one("SELECT max(version) FROM schema_migrations", &[])?
        .try_get(0)?;
    if let Some(latest) = latest
        && latest as u32 > known
    {
        return Err(StoreError::Internal(anyhow::anyhow!(
            "database is at migration {latest}, newer than this binary knows ({known})"
        )));
    }
    Ok(applied)
}

/// True when every embedded migration is recorded (readiness).
pub(super) fn is_current(db: &mut Db<'_>) -> StoreResult<bool> {
    let exists: bool = db
        .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])?
        .try_get(0)?;
    if !exists {
        return Ok(false);
    }
    let latest: Option<i32> = db
        .query_one("SELECT max(version) FROM schema_migrations", &[])?
        .try_get(0)?;
    let known = MIGRATIONS.last().map(|m| m.0 as i32);
    Ok(latest == known)
}
