//! Subscriptions on PostgreSQL: the implicit three only (migration 0003). Each event is
//! handled by the one whose route takes it, and its row holds that subscription's state.

use super::session::Db;
use crate::store::{StatusCounts, StoreError, StoreResult, SubscriptionInfo};
use crate::subscriptions::{Route, Subscription, implicit};

/// The id of the implicit subscription that handles an event, as SQL over its row.
pub(super) const SUB_OF: &str =
    "(CASE WHEN lane = 1 THEN 2::bigint WHEN event_type = 'order.completed' THEN 1 ELSE 3 END)";

/// `(id, name)` of the implicit three, as migration 0003 numbers them.
pub(super) const IDS: [(i64, &str); 3] = [(1, "loyalty"), (2, "downstream"), (3, "audit")];

/// The name of the subscription that handles an event (as [`SUB_OF`]).
pub(super) fn name_of(source: &str, event_type: &str) -> &'static str {
    if source == crate::domain::RESERVED_SOURCE {
        "downstream"
    } else if event_type == crate::handlers::ORDER_COMPLETED {
        "loyalty"
    } else {
        "audit"
    }
}

pub(super) fn id_of(name: &str) -> Option<i64> {
    IDS.iter().find(|(_, n)| *n == name).map(|(id, _)| *id)
}

fn implicit_routes() -> Vec<(String, Route)> {
    implicit(&crate::config::Settings::default())
        .into_iter()
        .map(|s| (s.name, s.route))
        .collect()
}

/// Only the implicit three, under their names, kinds and routes.
pub(super) fn check(subs: &[Subscription]) -> StoreResult<Vec<i64>> {
    let routes = implicit_routes();
    let implicit = subs.len() == routes.len()
        && subs.iter().all(|s| {
            routes
                .iter()
                .any(|(name, route)| *name == s.name && *route == s.route && id_of(name).is_some())
        });
    if !implicit {
        return Err(StoreError::Internal(anyhow::anyhow!(
            "[[subscriptions]]: the PostgreSQL store runs only the implicit subscriptions \
             (loyalty, downstream, audit) in this version; fanning events out to others needs \
             the SQLite store for now"
        )));
    }
    Ok(subs.iter().filter_map(|s| id_of(&s.name)).collect())
}

pub(super) fn set_paused(db: &mut Db<'_>, name: &str, paused: bool) -> StoreResult<bool> {
    Ok(db.execute(
        "UPDATE subscriptions SET paused = $2 WHERE name = $1",
        &[&name, &paused],
    )? == 1)
}

/// With `completed` false, only the unfinished and failed rows are counted (their partial
/// indexes), not the whole history.
pub(super) fn list(db: &mut Db<'_>, completed: bool) -> StoreResult<Vec<SubscriptionInfo>> {
    let which = if completed {
        ""
    } else {
        "WHERE status IN ('pending', 'claimed', 'failed')"
    };
    let counts = db.query(
        &format!(
            "SELECT {SUB_OF} AS sub, status, count(*), min(next_attempt_at)
               FROM events {which} GROUP BY 1, 2"
        ),
        &[],
    )?;
    let rows = db.query(
        "SELECT id, name, kind, paused, created_at FROM subscriptions ORDER BY id",
        &[],
    )?;
    let routes = implicit_routes();
    let mut infos = Vec::new();
    for r in &rows {
        let id: i64 = r.try_get(0)?;
        let name: String = r.try_get(1)?;
        let mut c = StatusCounts::default();
        for row in counts.iter().filter(|row| row.get::<_, i64>(0) == id) {
            let n: i64 = row.try_get(2)?;
            match row.try_get::<_, String>(1)?.as_str() {
                "pending" => {
                    c.pending = n;
                    c.oldest_due_at = row.try_get(3)?;
                }
                "claimed" => c.claimed = n,
                "completed" => c.completed = n,
                _ => c.failed = n,
            }
        }
        infos.push(SubscriptionInfo {
            route: routes
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, r)| r.clone())
                .unwrap_or_default(),
            name,
            kind: r.try_get(2)?,
            paused: r.try_get(3)?,
            removed: false,
            counts: c,
            created_at: r.try_get(4)?,
        });
    }
    Ok(infos)
}
