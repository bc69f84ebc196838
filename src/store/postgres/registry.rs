//! The registry's upkeep on PostgreSQL beyond the sync (see `store::registry`).

use super::session::Db;
use crate::store::StoreResult;
use crate::store::registry::LEFT_UNFINISHED_SQL;

/// The removed subscriptions that still hold pending or claimed states: a node that died
/// between a removal's commit and the transaction that finishes its states (see
/// `subscriptions::finish_removed`) left them. The heartbeat finishes them.
pub(super) fn left_unfinished(db: &mut Db<'_>) -> StoreResult<Vec<i64>> {
    Ok(db
        .query(LEFT_UNFINISHED_SQL, &[])?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?)
}
