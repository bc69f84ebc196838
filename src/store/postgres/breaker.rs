//! The claims behind a circuit breaker: of one `http` subscription (`crate::forward`), and the
//! probes of the one-at-a-time claim (`handlers::downstream`); the breaker opens and closes in
//! `store::sql::breaker`.

use super::consume;
use super::session::Db;
use super::subscriptions::{RouteCache, Routes};
use crate::store::{ClaimFor, Gate, StoreResult, SubscriptionClaim};

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

/// The breaker's probe of each of `probing` (a one-at-a-time claim's subscriptions whose probe
/// is due): one event, and the next probe a lease away. The row is locked first, so that of
/// several workers one takes the probe; the others, once it commits, see the next probe moved
/// on and claim nothing of it.
pub(super) fn probe(
    db: &mut Db<'_>,
    routes: &Routes,
    probing: &[i64],
    worker: &str,
    limit: usize,
    (lease_ms, now): (i64, i64),
    due: &mut Vec<consume::Picked>,
) -> StoreResult<()> {
    for &sub in probing {
        if due.len() >= limit {
            break;
        }
        let lock = "SELECT 1 FROM subscriptions WHERE id = $1 AND probe_at <= $2 FOR UPDATE";
        if db.query(lock, &[&sub, &now])?.is_empty() {
            continue;
        }
        let before = due.len();
        consume::claim_due(db, routes, &[sub], worker, before + 1, lease_ms, due)?;
        if due.len() > before {
            db.execute(
                "UPDATE subscriptions SET probe_at = $2 WHERE id = $1",
                &[&sub, &(now + lease_ms)],
            )?;
        }
    }
    Ok(())
}
