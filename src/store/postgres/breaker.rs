//! The claims of one `http` subscription and its circuit breaker (`crate::forward`).

use super::consume;
use super::session::Db;
use super::subscriptions::RouteCache;
use crate::store::{ClaimFor, Gate, StoreResult, SubscriptionClaim};
use crate::subscriptions::HttpSettings;

/// The subscription's gate: its row read plainly, or, when a probe looks due, locked, so that
/// of several nodes one takes the probe and the others see the next probe moved past its lease.
/// With the registry's version, read in the same statement: the claim's routes are checked
/// against it without a round trip of their own.
fn gate(db: &mut Db<'_>, sub: i64, lock: bool, now: i64) -> StoreResult<(Gate, i64)> {
    let sql = if lock {
        "SELECT paused, removed_at IS NOT NULL, probe_at,
                (SELECT version FROM subscription_registry WHERE id = 0)
           FROM subscriptions WHERE id = $1 FOR UPDATE"
    } else {
        "SELECT paused, removed_at IS NOT NULL, probe_at,
                (SELECT version FROM subscription_registry WHERE id = 0)
           FROM subscriptions WHERE id = $1"
    };
    let rows = db.query(sql, &[&sub])?;
    let (row, version) = match rows.first() {
        Some(r) => (
            Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)),
            r.try_get(3)?,
        ),
        None => (None, super::subscriptions::registry_version(db)?),
    };
    Ok((Gate::of(row, now), version))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn claim(
    db: &mut Db<'_>,
    routes: &RouteCache,
    fan_out_to: Option<i64>,
    worker: &str,
    sub: i64,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<SubscriptionClaim> {
    let (mut state, mut version) = gate(db, sub, false, now)?;
    if state == Gate::Probe {
        (state, version) = gate(db, sub, true, now)?;
    }
    let gate = state;
    let Some(limit) = gate.limit(limit) else {
        return Ok(SubscriptionClaim {
            claims: Vec::new(),
            gate,
        });
    };
    let whose = ClaimFor::Subscription(sub);
    let claims = consume::claim(
        db,
        routes,
        Some(version),
        fan_out_to,
        worker,
        whose,
        limit,
        lease_ms,
        now,
    )?;
    if gate == Gate::Probe && !claims.is_empty() {
        db.execute(
            "UPDATE subscriptions SET probe_at = $2 WHERE id = $1",
            &[&sub, &(now + lease_ms)],
        )?;
    }
    Ok(SubscriptionClaim { claims, gate })
}

/// See [`crate::store::Store::open_breaker`].
pub(super) fn open(
    db: &mut Db<'_>,
    sub: i64,
    after_probe: bool,
    first_ms: i64,
    max_ms: i64,
    now: i64,
) -> StoreResult<()> {
    let sql = if after_probe {
        "UPDATE subscriptions
            SET probe_interval_ms =
                    least(greatest(coalesce(probe_interval_ms, 0) * 2, $2::bigint), $3::bigint),
                probe_at = $4::bigint
                    + least(greatest(coalesce(probe_interval_ms, 0) * 2, $2::bigint), $3::bigint)
          WHERE id = $1"
    } else {
        "UPDATE subscriptions
            SET probe_interval_ms = least($2::bigint, $3::bigint),
                probe_at = $4::bigint + least($2::bigint, $3::bigint)
          WHERE id = $1 AND probe_at IS NULL"
    };
    db.execute(sql, &[&sub, &first_ms, &max_ms, &now])?;
    Ok(())
}

pub(super) fn close(db: &mut Db<'_>, sub: i64) -> StoreResult<()> {
    db.execute(
        "UPDATE subscriptions SET probe_at = NULL, probe_interval_ms = NULL
          WHERE id = $1 AND probe_at IS NOT NULL",
        &[&sub],
    )?;
    Ok(())
}

/// Whether subscription `sub` still delivers by `settings` (see the SQLite store's
/// `delivers_by`), its row locked so that a change cannot commit between this and the write.
pub(super) fn delivers_by(db: &mut Db<'_>, sub: i64, settings: &HttpSettings) -> StoreResult<bool> {
    let rows = db.query(
        "SELECT settings FROM subscriptions WHERE id = $1 FOR UPDATE",
        &[&sub],
    )?;
    let column: Option<String> = match rows.first() {
        Some(r) => r.try_get(0)?,
        None => None,
    };
    Ok(HttpSettings::parse(column.as_deref()).is_none_or(|now| now == *settings))
}

/// A probe given back untried: the next one is due now (see
/// [`crate::store::Store::give_back_probe`]).
pub(super) fn probe_now(db: &mut Db<'_>, sub: i64, now: i64) -> StoreResult<()> {
    db.execute(
        "UPDATE subscriptions SET probe_at = $2 WHERE id = $1 AND probe_at > $2",
        &[&sub, &now],
    )?;
    Ok(())
}
