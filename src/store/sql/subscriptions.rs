//! The subscriptions as ops see them, on either store: each with its counts by status, and
//! the nodes' records of what their configs name.

use super::registry::route_of;
use super::{Conn, Dialect, Value};
use crate::store::registry::NODE_TTL_MS;
use crate::store::{StatusCounts, StoreResult, SubscriptionInfo};
use crate::subscriptions::Kind;

/// Every subscription with its counts by status (removed ones last); `completed` false leaves
/// completed at 0 (a scrape reads only the partial indexes).
pub fn list<C: Conn>(conn: &mut C, completed: bool) -> StoreResult<Vec<SubscriptionInfo>> {
    let waiting = conn.query_one(C::Dialect::WAITING, &[])?;
    let (waiting, oldest) = (waiting.int(0)?, waiting.opt_int(1)?);
    let completed = if completed {
        "(SELECT count(*) FROM event_state WHERE status = 'completed' AND sub = u.id)"
    } else {
        "CAST(0 AS BIGINT)"
    };
    let count = |index: &str, status: &str| {
        format!(
            "(SELECT count(*) FROM event_state {} WHERE status = '{status}' AND sub = u.id)",
            C::Dialect::indexed_by(index)
        )
    };
    let rows = conn.query(
        &format!(
            "SELECT u.name, u.kind, u.sources, u.types, u.except_types, u.paused,
                    u.removed_at IS NOT NULL, u.created_at, u.lane, {pending}, {claimed},
                    {completed}, {failed},
                    (SELECT min(next_attempt_at) FROM event_state {due}
                      WHERE status = 'pending' AND sub = u.id),
                    u.probe_at, u.origin, u.mode, u.max_attempts,
                    (SELECT {names} FROM nodes n, {each}
                      WHERE j.value = u.name AND n.seen_at >= {now} - {NODE_TTL_MS})
               FROM subscriptions u ORDER BY u.removed_at IS NOT NULL, u.id",
            pending = count("events_due", "pending"),
            claimed = count("events_leases", "claimed"),
            failed = count("events_failed", "failed"),
            due = C::Dialect::indexed_by("events_due"),
            names = C::Dialect::json_agg("n.name"),
            each = C::Dialect::json_texts("n.subscriptions", "j"),
            now = C::Dialect::NOW_MS,
        ),
        &[],
    )?;
    rows.iter()
        .map(|r| {
            let kind = r.text(1)?;
            let removed = r.bool(6)?;
            let mut counts = StatusCounts {
                pending: r.int(9)?,
                claimed: r.int(10)?,
                completed: r.int(11)?,
                failed: r.int(12)?,
                oldest_due_at: r.opt_int(13)?,
                fan_out_waiting: 0,
            };
            // Events not fanned out yet wait for every live subscription a fan-out gives a
            // state: counted (and aged) as pending for each, without reading the log to route
            // them.
            if Kind::parse(&kind).is_some_and(Kind::waits_on_fan_out) && !removed {
                counts.pending += waiting;
                counts.oldest_due_at = match (counts.oldest_due_at, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Ok(SubscriptionInfo {
                name: r.text(0)?,
                kind,
                route: route_of(r, 2)?,
                paused: r.bool(5)?,
                removed,
                created_at: r.int(7)?,
                probe_at: r.opt_int(14)?,
                origin: r.text(15)?,
                mode: crate::domain::DeliveryMode::parse(&r.text(16)?)
                    .unwrap_or(crate::domain::DeliveryMode::AtLeastOnce),
                max_attempts: u32::try_from(r.int(17)?).unwrap_or(0),
                declared_by: serde_json::from_str(&r.text(18)?).unwrap_or_default(),
                counts,
            })
        })
        .collect()
}

/// A node's record: the subscriptions its config names, seen now by the database's clock, as
/// the removals compare it (`now`, the caller's, counts only when it is earlier: a test's aged
/// record).
pub fn node_seen<C: Conn>(conn: &mut C, node: &str, names: &[String], now: i64) -> StoreResult<()> {
    let names = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
    conn.execute(
        &format!(
            "INSERT INTO nodes (name, subscriptions, seen_at)
             VALUES (?1, ?2, CASE WHEN ?3 < {now} THEN ?3 ELSE {now} END)
             ON CONFLICT (name) DO UPDATE SET subscriptions = excluded.subscriptions,
                                              seen_at = excluded.seen_at",
            now = C::Dialect::NOW_MS
        ),
        &[
            Value::Text(node.into()),
            Value::Text(names),
            Value::Int(now),
        ],
    )?;
    Ok(())
}

pub fn node_gone(conn: &mut impl Conn, node: &str) -> StoreResult<()> {
    conn.execute(
        "DELETE FROM nodes WHERE name = ?1",
        &[Value::Text(node.into())],
    )?;
    Ok(())
}
