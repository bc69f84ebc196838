//! The registry's writes on SQLite that differ from PostgreSQL's (the rest is
//! `store::sql::registry`): a removal finishes its subscription's states in its own
//! transaction (`BEGIN IMMEDIATE`, alone), and the heartbeat's upkeep.

use rusqlite::Transaction;

use super::dialect::Sqlite;
use super::subscriptions::finish_removed;
use crate::store::StoreResult;
use crate::store::sql::registry as shared;

/// Remove `name` (see `store::sql::registry::remove`) and finish its states: how many.
pub(super) fn remove(
    tx: &Transaction<'_>,
    name: &str,
    sessions_only: bool,
    now: i64,
) -> StoreResult<Option<usize>> {
    match shared::remove(&mut Sqlite(tx), name, sessions_only, now)? {
        Some(id) => Ok(Some(finish_removed(tx, id, now)?)),
        None => Ok(None),
    }
}

/// Remove the sessions not seen since `idle_before`, as a `DELETE` would: their states
/// finished, their secrets forgotten. Returns how many.
pub(super) fn prune_sessions(
    tx: &Transaction<'_>,
    idle_before: i64,
    now: i64,
) -> StoreResult<usize> {
    let idle = shared::idle_sessions(&mut Sqlite(tx), idle_before)?;
    for name in &idle {
        remove(tx, name, true, now)?;
    }
    Ok(idle.len())
}

/// Finish what removed subscriptions still hold (see `registry::LEFT_UNFINISHED_SQL`): on
/// SQLite a removal finishes its states in its own transaction, so this finds something only
/// in a database written otherwise (an older version, a copy, a hand edit). Returns how many
/// states were finished.
pub(super) fn finish_left_unfinished(tx: &Transaction<'_>, now: i64) -> StoreResult<usize> {
    let mut finished = 0;
    for id in shared::left_unfinished(&mut Sqlite(tx))? {
        finished += finish_removed(tx, id, now)?;
    }
    Ok(finished)
}
