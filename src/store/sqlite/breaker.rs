//! The claims of one `http` subscription behind its circuit breaker (`crate::forward`; the
//! breaker opens and closes in `store::sql::breaker`).

use rusqlite::{OptionalExtension, Transaction, params};

use super::consume;
use super::subscriptions::Routes;
use crate::store::{ClaimFor, Gate, StoreResult, SubscriptionClaim};

/// The gate read and the claim in one write transaction: a probe is claimed by one node, which
/// moves the next probe past its lease in the same transaction.
pub(super) fn claim(
    tx: &Transaction<'_>,
    routes: &Routes,
    worker: &str,
    sub: i64,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<SubscriptionClaim> {
    let row = tx
        .prepare_cached(
            "SELECT paused, removed_at IS NOT NULL, probe_at FROM subscriptions WHERE id = ?1",
        )?
        .query_row([sub], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let gate = Gate::of(row, now);
    let Some(limit) = gate.limit(limit) else {
        return Ok(SubscriptionClaim {
            claims: Vec::new(),
            gate,
        });
    };
    let whose = ClaimFor::Subscription(sub);
    let claims = consume::claim_for(tx, routes, worker, whose, limit, lease_ms, now)?;
    if gate == Gate::Probe && !claims.is_empty() {
        tx.prepare_cached("UPDATE subscriptions SET probe_at = ?2 WHERE id = ?1")?
            .execute(params![sub, now + lease_ms])?;
    }
    Ok(SubscriptionClaim { claims, gate })
}
