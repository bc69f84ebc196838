//! The claims of one `http` subscription and its circuit breaker (`crate::forward`).

use rusqlite::{OptionalExtension, Transaction, params};

use super::consume;
use super::subscriptions::Routes;
use crate::store::{ClaimFor, Gate, StoreResult, SubscriptionClaim};
use crate::subscriptions::HttpSettings;

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

/// See [`crate::store::Store::open_breaker`]. A run of failures opens a closed breaker only (a
/// node that saw its own run after another node opened it changes nothing); a failed probe
/// doubles the wait.
pub(super) fn open(
    tx: &Transaction<'_>,
    sub: i64,
    after_probe: bool,
    first_ms: i64,
    max_ms: i64,
    now: i64,
) -> StoreResult<()> {
    let sql = if after_probe {
        "UPDATE subscriptions
            SET probe_interval_ms = min(max(ifnull(probe_interval_ms, 0) * 2, ?2), ?3),
                probe_at = ?4 + min(max(ifnull(probe_interval_ms, 0) * 2, ?2), ?3)
          WHERE id = ?1"
    } else {
        "UPDATE subscriptions SET probe_interval_ms = min(?2, ?3), probe_at = ?4 + min(?2, ?3)
          WHERE id = ?1 AND probe_at IS NULL"
    };
    tx.prepare_cached(sql)?
        .execute(params![sub, first_ms, max_ms, now])?;
    Ok(())
}

pub(super) fn close(tx: &Transaction<'_>, sub: i64) -> StoreResult<()> {
    tx.prepare_cached(
        "UPDATE subscriptions SET probe_at = NULL, probe_interval_ms = NULL
          WHERE id = ?1 AND probe_at IS NOT NULL",
    )?
    .execute([sub])?;
    Ok(())
}

/// Whether subscription `sub` still delivers by `settings` (compared as settings, not as text:
/// a row written by an older build may spell the same settings otherwise). A row without
/// settings that parse says nothing against them.
pub(super) fn delivers_by(
    tx: &Transaction<'_>,
    sub: i64,
    settings: &HttpSettings,
) -> StoreResult<bool> {
    let column: Option<String> = tx
        .prepare_cached("SELECT settings FROM subscriptions WHERE id = ?1")?
        .query_row([sub], |r| r.get(0))
        .optional()?
        .flatten();
    Ok(HttpSettings::parse(column.as_deref()).is_none_or(|now| now == *settings))
}

/// A probe given back untried: the next one is due now (see
/// [`crate::store::Store::give_back_probe`]).
pub(super) fn probe_now(tx: &Transaction<'_>, sub: i64, now: i64) -> StoreResult<()> {
    tx.prepare_cached("UPDATE subscriptions SET probe_at = ?2 WHERE id = ?1 AND probe_at > ?2")?
        .execute(params![sub, now])?;
    Ok(())
}
