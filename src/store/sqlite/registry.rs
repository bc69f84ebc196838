//! The registry's upkeep on SQLite beyond the sync (see `store::registry`).

use rusqlite::Transaction;

use crate::store::StoreResult;
use crate::store::registry::LEFT_UNFINISHED_SQL;

/// Finish what removed subscriptions still hold (see `registry::LEFT_UNFINISHED_SQL`): on
/// SQLite a removal finishes its states in its own transaction, so this finds something only
/// in a database written otherwise (an older version, a copy, a hand edit). Returns how many
/// states were finished.
pub(super) fn finish_left_unfinished(tx: &Transaction<'_>, now: i64) -> StoreResult<usize> {
    let ids: Vec<i64> = tx
        .prepare_cached(LEFT_UNFINISHED_SQL)?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut finished = 0;
    for id in ids {
        finished += super::subscriptions::finish_removed(tx, id, now)?;
    }
    Ok(finished)
}
