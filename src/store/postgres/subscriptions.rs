//! Subscriptions on PostgreSQL: the `subscriptions` table (migration 0003), kept in step with
//! the config, and each live one's route compiled to SQL for the fan-out, filters and backfill
//! (as on SQLite; globs become `LIKE` patterns).

use std::sync::Arc;
use std::time::Instant;

use super::session::Db;
use crate::store::routes;
use crate::store::{StatusCounts, StoreResult, SubscriptionInfo};
use crate::subscriptions::{Route, Subscription};

pub(super) use crate::store::routes::Live;

#[derive(Debug, Clone, Default)]
pub(super) struct Routes {
    pub live: Vec<Live>,
    /// When each ordered subscription's claim last read its whole backlog.
    pub whole_looks: Arc<parking_lot::Mutex<std::collections::HashMap<i64, Instant>>>,
}

/// A claim reads an ordered subscription's whole backlog at most this often.
const WHOLE_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl Routes {
    /// Whether a claim of `sub` may read its whole backlog now (and if so, it is noted).
    pub fn whole_look_due(&self, sub: i64) -> bool {
        let now = Instant::now();
        let mut looks = self.whole_looks.lock();
        match looks.get(&sub) {
            Some(last) if now.duration_since(*last) < WHOLE_LOOK_EVERY => false,
            _ => {
                looks.insert(sub, now);
                true
            }
        }
    }

    pub fn named(&self, name: &str) -> Option<&Live> {
        self.live.iter().find(|s| s.name == name)
    }

    /// Each live route as one SQL expression over `{alias}source` and `{alias}event_type`,
    /// picked by `u.id` (for a join with `subscriptions u`).
    pub fn by_id(&self, alias: &str) -> String {
        if self.live.is_empty() {
            return "false".into();
        }
        let arms: String = self
            .live
            .iter()
            .map(|s| format!(" WHEN {} THEN {}", s.id, route_sql(&s.route, alias)))
            .collect();
        format!("(CASE u.id{arms} ELSE false END)")
    }

    /// The order key of the body `payload` (an expression) for subscription `u`: NULL but for
    /// ordered ones (see `webhook_inbox_order_key`, migration 0005).
    pub fn keys_by_id(&self, payload: &str) -> String {
        let arms: String = self
            .live
            .iter()
            .filter_map(|s| Some((s.id, s.ordered.as_ref()?)))
            .map(|(id, o)| format!(" WHEN {id} THEN {}", key_sql(o, payload)))
            .collect();
        if arms.is_empty() {
            "NULL::text".into()
        } else {
            format!("(CASE u.id{arms} ELSE NULL END)")
        }
    }
}

/// The order key of the body `payload` (an expression) for ordered subscription `o`.
fn key_sql(o: &routes::Ordered, payload: &str) -> String {
    let path: Vec<String> = o.path.iter().map(|k| routes::quote(k)).collect();
    format!(
        "webhook_inbox_order_key({payload}, ARRAY[{}]::text[])",
        path.join(", ")
    )
}

/// A glob (`*`, `?`) as a `LIKE` pattern with `\` as its escape.
fn like(glob: &str) -> String {
    let mut out = String::with_capacity(glob.len() + 4);
    for c in glob.chars() {
        match c {
            '*' => out.push('%'),
            '?' => out.push('_'),
            '%' | '_' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// A route as an SQL condition on `{alias}source` and `{alias}event_type`, globs as `LIKE`.
pub(super) fn route_sql(route: &Route, alias: &str) -> String {
    routes::route_sql(route, alias, |column, glob| {
        format!("{column} LIKE {} ESCAPE '\\'", routes::quote(&like(glob)))
    })
}

fn route_of(r: &postgres::Row, at: usize) -> StoreResult<Route> {
    Ok(routes::route_from(
        r.try_get(at)?,
        r.try_get(at + 1)?,
        r.try_get(at + 2)?,
    ))
}

pub(super) fn load(db: &mut Db<'_>) -> StoreResult<Routes> {
    let rows = db.query(
        "SELECT id, name, lane, sources, types, except_types, start_after_seq, ordered_by,
                on_failure
           FROM subscriptions WHERE removed_at IS NULL ORDER BY id",
        &[],
    )?;
    let live = rows
        .iter()
        .map(|r| {
            Ok(Live {
                id: r.try_get(0)?,
                name: r.try_get(1)?,
                lane: r.try_get(2)?,
                route: route_of(r, 3)?,
                start_after_seq: r.try_get(6)?,
                ordered: routes::Ordered::from_row(r.try_get(7)?, r.try_get(8)?),
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Routes {
        live,
        whole_looks: Arc::default(),
    })
}

/// Make the table the config's list (see `Store::sync_subscriptions`). Several nodes starting
/// at once with one config write the same rows.
pub(super) fn sync(db: &mut Db<'_>, subs: &[Subscription], now: i64) -> StoreResult<Vec<i64>> {
    // A new subscription takes the events after `start_after_seq`: read as the fan-out reads
    // its bound, with no webhook insert in flight (the exclusive ingest lock, after the
    // fan-out's, in the order the removal below takes them), so that an insert that took a
    // lower number but commits later is not left out of it.
    let names: Vec<&str> = subs.iter().map(|s| s.name.as_str()).collect();
    let known: i64 = db
        .query_one(
            "SELECT count(*) FROM subscriptions WHERE name = ANY($1)",
            &[&names],
        )?
        .try_get(0)?;
    if usize::try_from(known).unwrap_or(0) < names.len() {
        db.batch(&format!(
            "SELECT pg_advisory_xact_lock({}); SELECT pg_advisory_xact_lock({})",
            super::fan_out::FAN_OUT_LOCK,
            super::fan_out::INGEST_LOCK
        ))?;
    }
    let mut ids = Vec::with_capacity(subs.len());
    for s in subs {
        let except = serde_json::to_string(&s.route.except_types).unwrap_or_else(|_| "[]".into());
        let id: i64 = db
            .query_one(
                "INSERT INTO subscriptions (name, kind, lane, sources, types, except_types,
                                            start_after_seq, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6,
                         coalesce(pg_sequence_last_value(
                             pg_get_serial_sequence('event_log', 'seq')), 0), $7)
                 ON CONFLICT (name) DO UPDATE
                    SET kind = excluded.kind, lane = excluded.lane, sources = excluded.sources,
                        types = excluded.types, except_types = excluded.except_types,
                        removed_at = NULL
                 RETURNING id",
                &[
                    &s.name,
                    &s.kind.as_str(),
                    &s.kind.lane(),
                    &routes::json_list(&s.route.sources),
                    &routes::json_list(&s.route.types),
                    &except,
                    &now,
                ],
            )?
            .try_get(0)?;
        db.execute(
            "UPDATE subscriptions SET ordered_by = $2, on_failure = $3 WHERE id = $1",
            &[
                &id,
                &s.ordering.as_ref().map(|o| o.pointer.as_str()),
                &s.ordering
                    .as_ref()
                    .map_or("hold", |o| o.on_failure.as_str()),
            ],
        )?;
        ids.push(id);
    }
    // One no longer named keeps its row while it has a history; one that never took an event
    // goes. A fan-out (or a submission's state rows) may be giving it its first rows at this
    // moment, unseen by the check below until it commits: with both locks held, every such
    // writer has committed and the next ones read the subscriptions after this commit. (The
    // state rows' foreign key made the race fail until migration 0006 dropped it.)
    let leaving: bool = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM subscriptions WHERE NOT (id = ANY($1)))",
            &[&ids],
        )?
        .try_get(0)?;
    if leaving {
        db.batch(&format!(
            "SELECT pg_advisory_xact_lock({}); SELECT pg_advisory_xact_lock({})",
            super::fan_out::FAN_OUT_LOCK,
            super::fan_out::INGEST_LOCK
        ))?;
    }
    db.execute(
        "DELETE FROM subscriptions u WHERE NOT (u.id = ANY($1))
            AND NOT EXISTS (SELECT 1 FROM event_state s WHERE s.sub = u.id)",
        &[&ids],
    )?;
    db.execute(
        "UPDATE subscriptions SET removed_at = $2
          WHERE NOT (id = ANY($1)) AND removed_at IS NULL",
        &[&ids, &now],
    )?;
    Ok(ids)
}

pub(super) fn set_paused(db: &mut Db<'_>, name: &str, paused: bool) -> StoreResult<bool> {
    Ok(db.execute(
        "UPDATE subscriptions SET paused = $2 WHERE name = $1 AND removed_at IS NULL",
        &[&name, &paused],
    )? == 1)
}

/// Events stored at or after `since`, behind the cursor (or submitted requests), that the
/// route matches and that have no state in the subscription. Under the fan-out's lock, as a
/// fan-out: a node whose config no longer names the subscription may be deleting it (`sync`
/// deletes one without state rows under that lock), and the insert, whose snapshot is taken
/// after the lock, sees that delete or is seen by it.
///
/// The log rows are locked first, in a statement of their own: a purge holds the rows of the
/// events it makes tombstones `FOR UPDATE` to its commit, and a statement that waited for such
/// a lock still reads the bodies in the snapshot it began with, where the purged body is still
/// there (a pending state on a tombstone: seen, and every later claim of the subscription
/// failed). The insert's own snapshot is taken after the locks are held: it sees every purge
/// that got there first, and a purge that comes later waits for this commit, then sees the
/// pending state and keeps the body.
pub(super) fn backfill(db: &mut Db<'_>, sub: &Live, since: i64, now: i64) -> StoreResult<usize> {
    super::fan_out::lock(db)?;
    let rows = format!(
        "FROM event_log l
          WHERE l.received_at >= $1
            AND (l.lane = 1 OR l.seq <= (SELECT after_seq FROM queue_cursor))
            AND {}",
        route_sql(&sub.route, "l.")
    );
    db.execute(
        &format!("SELECT count(*) FROM (SELECT 1 {rows} FOR KEY SHARE OF l) locked"),
        &[&since],
    )?;
    // An ordered subscription's states take their key, as the fan-out gives them.
    let key = sub.ordered.as_ref().map_or_else(
        || "NULL::text".to_string(),
        |o| {
            key_sql(
                o,
                "(SELECT p.payload FROM event_payloads p WHERE p.seq = l.seq)",
            )
        },
    );
    let sql = format!(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at, order_key)
         SELECT l.seq, $2, $3, 'pending', $4, {key} {rows}
            AND EXISTS (SELECT 1 FROM subscriptions u WHERE u.id = $2 AND u.removed_at IS NULL)
            AND EXISTS (SELECT 1 FROM event_payloads p WHERE p.seq = l.seq)
         ON CONFLICT (seq, sub) DO NOTHING"
    );
    Ok(db.execute(&sql, &[&since, &sub.id, &sub.lane, &now])? as usize)
}

/// Every subscription with its counts; `completed` false leaves completed at 0 (a scrape reads
/// only the partial indexes).
pub(super) fn list(db: &mut Db<'_>, completed: bool) -> StoreResult<Vec<SubscriptionInfo>> {
    let (waiting, oldest): (i64, Option<i64>) = {
        let r = db.query_one(super::events::WAITING, &[])?;
        (r.try_get(0)?, r.try_get(1)?)
    };
    let completed = if completed {
        "(SELECT count(*) FROM event_state WHERE status = 'completed' AND sub = u.id)"
    } else {
        "0::bigint"
    };
    let rows = db.query(
        &format!(
            "SELECT u.name, u.kind, u.sources, u.types, u.except_types, u.paused,
                    u.removed_at IS NOT NULL, u.created_at, u.lane,
                    (SELECT count(*) FROM event_state WHERE status = 'pending' AND sub = u.id),
                    (SELECT count(*) FROM event_state WHERE status = 'claimed' AND sub = u.id),
                    {completed},
                    (SELECT count(*) FROM event_state WHERE status = 'failed' AND sub = u.id),
                    (SELECT min(next_attempt_at) FROM event_state
                      WHERE status = 'pending' AND sub = u.id),
                    u.probe_at
               FROM subscriptions u ORDER BY u.removed_at IS NOT NULL, u.id"
        ),
        &[],
    )?;
    rows.iter()
        .map(|r| {
            let removed: bool = r.try_get(6)?;
            let lane: i64 = r.try_get(8)?;
            let mut counts = StatusCounts {
                pending: r.try_get(9)?,
                claimed: r.try_get(10)?,
                completed: r.try_get(11)?,
                failed: r.try_get(12)?,
                oldest_due_at: r.try_get(13)?,
                fan_out_waiting: 0,
            };
            // Events not fanned out yet wait for every live subscription the fan-out claims
            // for (the in-process ones, `http`).
            let kind: String = r.try_get(1)?;
            if (lane == 0 || kind == "http") && !removed {
                counts.pending += waiting;
                counts.oldest_due_at = match (counts.oldest_due_at, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Ok(SubscriptionInfo {
                name: r.try_get(0)?,
                kind,
                route: route_of(r, 2)?,
                paused: r.try_get(5)?,
                removed,
                created_at: r.try_get(7)?,
                probe_at: r.try_get(14)?,
                counts,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn globs_become_like_patterns_that_mean_the_same() {
        assert_eq!(super::like("invoice.*"), "invoice.%");
        assert_eq!(super::like("a?c"), "a_c");
        assert_eq!(super::like("100%_off\\"), "100\\%\\_off\\\\");
    }
}
