//! Subscriptions on SQLite: the `subscriptions` table (migration 0011), kept in step with the
//! config, and each live one's route compiled to SQL for the fan-out, the filters and backfill.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::store::{StatusCounts, StoreResult, SubscriptionInfo};
use crate::subscriptions::{Route, Subscription};

/// A live subscription as the SQL needs it.
#[derive(Debug, Clone)]
pub(super) struct Live {
    pub id: i64,
    pub name: String,
    pub lane: i64,
    pub route: Route,
    /// It takes the events stored after this seq.
    pub start_after_seq: i64,
}

/// The live subscriptions, and the route of each as one SQL expression over `l.source` and
/// `l.event_type` picked by `u.id` (for a join of the log `l` with `subscriptions u`).
#[derive(Debug, Clone, Default)]
pub(super) struct Routes {
    pub live: Vec<Live>,
    pub by_id: String,
}

impl Routes {
    pub fn named(&self, name: &str) -> Option<&Live> {
        self.live.iter().find(|s| s.name == name)
    }
}

/// Text as an SQL string literal.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A route as an SQL condition on the columns `{alias}source` and `{alias}event_type`. Globs are
/// SQLite's GLOB, which means what ours do once brackets are refused (the config does).
pub(super) fn route_sql(route: &Route, alias: &str) -> String {
    let mut parts = Vec::new();
    match &route.sources {
        None => parts.push(format!("{alias}source <> 'requests'")),
        Some(list) => {
            let list: Vec<String> = list.iter().map(|s| quote(s)).collect();
            parts.push(format!("{alias}source IN ({})", list.join(", ")));
        }
    }
    if let Some(globs) = &route.types {
        let any: Vec<String> = globs
            .iter()
            .map(|g| format!("{alias}event_type GLOB {}", quote(g)))
            .collect();
        parts.push(format!("({})", any.join(" OR ")));
    }
    for t in &route.except_types {
        parts.push(format!("{alias}event_type <> {}", quote(t)));
    }
    format!("({})", parts.join(" AND "))
}

fn json_list(list: &Option<Vec<String>>) -> Option<String> {
    list.as_ref()
        .map(|l| serde_json::to_string(l).unwrap_or_else(|_| "[]".into()))
}

fn parse_list(text: Option<String>) -> Option<Vec<String>> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

fn route_of(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Route> {
    Ok(Route {
        sources: parse_list(r.get(at)?),
        types: parse_list(r.get(at + 1)?),
        except_types: parse_list(r.get(at + 2)?).unwrap_or_default(),
    })
}

/// The live subscriptions as the table has them.
pub(super) fn load(conn: &Connection) -> StoreResult<Routes> {
    let live = conn
        .prepare_cached(
            "SELECT id, name, lane, sources, types, except_types, start_after_seq
               FROM subscriptions WHERE removed_at IS NULL ORDER BY id",
        )?
        .query_map([], |r| {
            Ok(Live {
                id: r.get(0)?,
                name: r.get(1)?,
                lane: r.get(2)?,
                route: route_of(r, 3)?,
                start_after_seq: r.get(6)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let arms: String = live
        .iter()
        .map(|s| format!(" WHEN {} THEN {}", s.id, route_sql(&s.route, "l.")))
        .collect();
    let by_id = if live.is_empty() {
        "0".into()
    } else {
        format!("CASE u.id{arms} ELSE 0 END")
    };
    Ok(Routes { live, by_id })
}

/// Make the table the config's list (see `Store::sync_subscriptions`).
pub(super) fn sync(tx: &Transaction<'_>, subs: &[Subscription], now: i64) -> StoreResult<Vec<i64>> {
    let newest: i64 = tx.query_row("SELECT ifnull(max(seq), 0) FROM event_log", [], |r| {
        r.get(0)
    })?;
    let mut ids = Vec::with_capacity(subs.len());
    for s in subs {
        let values = params![
            s.name,
            s.kind.as_str(),
            s.kind.lane(),
            json_list(&s.route.sources),
            json_list(&s.route.types),
            serde_json::to_string(&s.route.except_types).unwrap_or_else(|_| "[]".into()),
        ];
        let existing: Option<i64> = tx
            .query_row(
                "SELECT id FROM subscriptions WHERE name = ?1",
                [&s.name],
                |r| r.get(0),
            )
            .optional()?;
        let id = match existing {
            Some(id) => {
                tx.execute(
                    "UPDATE subscriptions SET kind = ?2, lane = ?3, sources = ?4, types = ?5,
                            except_types = ?6, removed_at = NULL
                      WHERE name = ?1",
                    values,
                )?;
                id
            }
            None => tx.query_row(
                "INSERT INTO subscriptions (name, kind, lane, sources, types, except_types,
                                            start_after_seq, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING id",
                params![
                    s.name,
                    s.kind.as_str(),
                    s.kind.lane(),
                    json_list(&s.route.sources),
                    json_list(&s.route.types),
                    serde_json::to_string(&s.route.except_types).unwrap_or_else(|_| "[]".into()),
                    newest,
                    now
                ],
                |r| r.get(0),
            )?,
        };
        ids.push(id);
    }
    let mut keep = tx.prepare("UPDATE subscriptions SET removed_at = ?2 WHERE id = ?1")?;
    let all: Vec<(i64, bool)> = tx
        .prepare("SELECT id, removed_at IS NOT NULL FROM subscriptions")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (id, removed) in all {
        if !removed && !ids.contains(&id) {
            keep.execute(params![id, now])?;
        }
    }
    Ok(ids)
}

pub(super) fn set_paused(tx: &Transaction<'_>, name: &str, paused: bool) -> StoreResult<bool> {
    Ok(tx.execute(
        "UPDATE subscriptions SET paused = ?2 WHERE name = ?1 AND removed_at IS NULL",
        params![name, paused],
    )? == 1)
}

/// Events stored at or after `since`, at or before the cursor (fanned out already, or stored
/// before the subscription was added), that the route matches and that have no state in it.
pub(super) fn backfill(
    tx: &Transaction<'_>,
    sub: &Live,
    since: i64,
    now: i64,
) -> StoreResult<usize> {
    let sql = format!(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at)
         SELECT l.seq, ?1, ?2, 'pending', ?3 FROM event_log l
          WHERE l.received_at >= ?4 AND l.payload IS NOT NULL
            AND (l.lane = 1 OR l.seq <= (SELECT after_seq FROM queue_cursors WHERE lane = 0))
            AND {}
            AND NOT EXISTS (SELECT 1 FROM event_state s WHERE s.seq = l.seq AND s.sub = ?1)",
        route_sql(&sub.route, "l.")
    );
    Ok(tx.execute(&sql, params![sub.id, sub.lane, now, since])?)
}

/// Every subscription with its counts by status (removed ones last).
pub(super) fn list(conn: &Connection) -> StoreResult<Vec<SubscriptionInfo>> {
    let waiting = super::events::unrouted(conn)?;
    let mut infos = conn
        .prepare_cached(
            "SELECT u.name, u.kind, u.sources, u.types, u.except_types, u.paused,
                    u.removed_at IS NOT NULL, u.created_at, u.lane,
                    (SELECT count(*) FROM event_state INDEXED BY events_due
                      WHERE status = 'pending' AND sub = u.id),
                    (SELECT count(*) FROM event_state WHERE status = 'claimed' AND sub = u.id),
                    (SELECT count(*) FROM event_state WHERE status = 'completed' AND sub = u.id),
                    (SELECT count(*) FROM event_state WHERE status = 'failed' AND sub = u.id),
                    (SELECT min(next_attempt_at) FROM event_state INDEXED BY events_due
                      WHERE status = 'pending' AND sub = u.id)
               FROM subscriptions u ORDER BY u.removed_at IS NOT NULL, u.id",
        )?
        .query_map([], |r| {
            Ok((
                SubscriptionInfo {
                    name: r.get(0)?,
                    kind: r.get(1)?,
                    route: route_of(r, 2)?,
                    paused: r.get(5)?,
                    removed: r.get(6)?,
                    created_at: r.get(7)?,
                    counts: StatusCounts {
                        pending: r.get(9)?,
                        claimed: r.get(10)?,
                        completed: r.get(11)?,
                        failed: r.get(12)?,
                        oldest_due_at: r.get(13)?,
                    },
                },
                r.get::<_, i64>(8)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    // Events not fanned out yet wait for every live in-process subscription: counted (and
    // aged) as pending for each, without reading the log to route them.
    Ok(infos
        .drain(..)
        .map(|(mut info, lane)| {
            if lane == 0 && !info.removed {
                info.counts.pending += waiting.count;
                info.counts.oldest_due_at = match (info.counts.oldest_due_at, waiting.oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            info
        })
        .collect())
}
