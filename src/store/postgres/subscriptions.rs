//! Subscriptions on PostgreSQL: the `subscriptions` table (migration 0003), kept in step with
//! the config, and each live one's route compiled to SQL for the fan-out, filters and backfill
//! (as on SQLite; globs become `LIKE` patterns).

use std::sync::Arc;
use std::time::Instant;

use super::session::Db;
use crate::store::{StatusCounts, StoreResult, SubscriptionInfo};
use crate::store::{registry, routes};
use crate::subscriptions::{Route, Subscription};

pub(super) use crate::store::routes::Live;

#[derive(Debug, Clone, Default)]
pub(super) struct Routes {
    pub live: Vec<Live>,
    /// When each ordered subscription's claim last read its whole backlog.
    pub whole_looks: Arc<parking_lot::Mutex<std::collections::HashMap<i64, Instant>>>,
    /// The registry's version these were read at.
    pub version: i64,
    /// What the fan-outs left out of filtered subscriptions (the cache's, shared by each
    /// version of the routes).
    pub left_out: Arc<crate::store::filters::LeftOut>,
}

/// The live subscriptions' routes a node keeps, and the registry's version they were read at;
/// and what its fan-outs left out of filtered subscriptions.
#[derive(Debug, Default)]
pub(super) struct RouteCache(
    parking_lot::RwLock<Option<Arc<Routes>>>,
    Arc<crate::store::filters::LeftOut>,
);

impl RouteCache {
    /// The kept routes (read in `db`'s transaction the first time), not checked against the
    /// registry: for a caller that checks them itself ([`Self::at`]).
    pub fn kept(&self, db: &mut Db<'_>) -> StoreResult<Arc<Routes>> {
        // Bound first: a guard in the match's scrutinee would live through `reload`'s write.
        let kept = self.0.read().clone();
        match kept {
            Some(routes) => Ok(routes),
            None => self.reload(db),
        }
    }

    /// The routes of the registry's `version` (read by the caller in `db`'s transaction): the
    /// kept ones if they are that version's, else read again in `db`'s transaction.
    pub fn at(&self, db: &mut Db<'_>, version: i64) -> StoreResult<Arc<Routes>> {
        let kept = self.0.read().clone();
        match kept {
            Some(routes) if routes.version == version => Ok(routes),
            _ => self.reload(db),
        }
    }

    /// The routes as the registry holds them in `db`'s transaction (its version read first).
    pub fn current(&self, db: &mut Db<'_>) -> StoreResult<Arc<Routes>> {
        let version = registry_version(db)?;
        self.at(db, version)
    }

    fn reload(&self, db: &mut Db<'_>) -> StoreResult<Arc<Routes>> {
        let routes = Arc::new(Routes {
            left_out: Arc::clone(&self.1),
            ..load(db)?
        });
        *self.0.write() = Some(Arc::clone(&routes));
        Ok(routes)
    }

    /// The version of the kept routes, if any.
    pub fn seen(&self) -> Option<i64> {
        self.0.read().as_ref().map(|r| r.version)
    }

    pub fn left_out(&self) -> &crate::store::filters::LeftOut {
        &self.1
    }

    /// Forget the routes: the next use reads them again.
    pub fn forget(&self) {
        *self.0.write() = None;
    }
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

    /// Whether subscription `u` takes an event, as one SQL expression over `{alias}source`,
    /// `{alias}event_type` and, for a filtered one, `j.body` (the body as jsonb, NULL when it
    /// is not JSON: see [`Routes::bodies`]), picked by `u.id` (for a join with `subscriptions
    /// u`).
    pub fn by_id(&self, alias: &str) -> String {
        if self.live.is_empty() {
            return "false".into();
        }
        let arms: String = self
            .live
            .iter()
            .map(|s| format!(" WHEN {} THEN {}", s.id, takes_sql(s, alias, "j.body")))
            .collect();
        format!("(CASE u.id{arms} ELSE false END)")
    }

    /// Whether any live subscription has a filter: only then does a fan-out read the bodies.
    pub fn filtered(&self) -> bool {
        self.live.iter().any(|s| s.filter.is_some())
    }

    /// The bodies a fan-out's filters read, as rows `(seq, body)` of the events `{alias}seq`
    /// of `from` (those that meet `only`) that a filtered subscription's route takes (the
    /// others' bodies are never parsed): for a `LEFT JOIN … j ON j.seq = …`.
    pub fn bodies(&self, from: &str, alias: &str, only: &str) -> String {
        let wanted: Vec<String> = self
            .live
            .iter()
            .filter(|s| s.filter.is_some())
            .map(|s| {
                format!(
                    "({alias}seq > {} AND {})",
                    s.start_after_seq,
                    route_sql(&s.route, alias)
                )
            })
            .collect();
        let wanted = if wanted.is_empty() {
            "false".to_string()
        } else {
            wanted.join(" OR ")
        };
        format!(
            "SELECT {alias}seq AS seq, webhook_inbox_json_body(p.payload) AS body
               FROM {from} JOIN event_payloads p ON p.seq = {alias}seq
              WHERE {only} AND ({wanted})"
        )
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

/// Whether `s` takes an event: its route on `{alias}source` and `{alias}event_type`, then its
/// filter on `body` (jsonb); a subscription without a filter costs what its route costs.
fn takes_sql(s: &Live, alias: &str, body: &str) -> String {
    let route = route_sql(&s.route, alias);
    match &s.filter {
        None => route,
        Some(filter) => format!(
            "(CASE WHEN {route} THEN {} ELSE false END)",
            crate::store::filters::filter_sql(filter, &crate::store::filters::Postgres { body })
        ),
    }
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
    let version = registry_version(db)?;
    let rows = db.query(
        &format!(
            "SELECT id, name, lane, sources, types, except_types, start_after_seq, ordered_by,
                    on_failure, {}
               FROM subscriptions WHERE removed_at IS NULL ORDER BY id",
            routes::RULE_COLUMNS
        ),
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
                kind: crate::subscriptions::Kind::parse(r.try_get(9)?)
                    .unwrap_or(crate::subscriptions::Kind::Audit),
                rules: routes::Rules::from_row(
                    r.try_get(10)?,
                    r.try_get(11)?,
                    r.try_get(12)?,
                    r.try_get(13)?,
                ),
                settings: crate::subscriptions::HttpSettings::parse(r.try_get(14)?),
                origin: r.try_get(15)?,
                filter: routes::filter_from_row(r.try_get(1)?, r.try_get(16)?),
                transform: routes::transform_from_row(r.try_get(17)?),
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Routes {
        live,
        whole_looks: Arc::default(),
        version,
        left_out: Arc::default(),
    })
}

/// The registry's version now (see migration 0007), in the caller's transaction.
pub(super) fn registry_version(db: &mut Db<'_>) -> StoreResult<i64> {
    Ok(db
        .query_one(
            "SELECT version FROM subscription_registry WHERE id = 0",
            &[],
        )?
        .try_get(0)?)
}

/// Make the table the config's list (see `Store::sync_subscriptions`). Several nodes starting
/// at once with one config write the same rows.
/// What a sync did: the ids of the config's subscriptions, in its order, and the ones it
/// marked removed (whose states [`finish_removed`] ends, after the sync has committed).
pub(super) struct Synced {
    pub ids: Vec<i64>,
    pub removed: Vec<i64>,
}

pub(super) fn sync(db: &mut Db<'_>, subs: &[Subscription], now: i64) -> StoreResult<Synced> {
    // The subscriptions' rows first, then the fan-out's and the ingest's locks (in the order
    // every holder of both takes them), all held to the commit. Rows first: a breaker's probe
    // holds its subscription's row while it waits for the fan-out's lock, so a sync that held
    // that lock and then waited for the row would close a cycle. With both locks:
    // - a new subscription takes the events after `start_after_seq`, read as the fan-out reads
    //   its bound, with no webhook insert in flight, so that an insert that took a lower
    //   number but commits later is not left out of it;
    // - one no longer named keeps its row while it has a history, and one that never took an
    //   event goes: a fan-out (or a submission's state rows) may be giving it its first rows
    //   at this moment, unseen by the check below until it commits; with both locks held,
    //   every such writer has committed and the next ones read the subscriptions after this
    //   commit (the state rows' foreign key made that race fail until migration 0006 dropped
    //   it);
    // - the next fan-out reads the registry's version after this commit.
    // No state row is written here: a claim holds its state rows while it waits for the
    // fan-out's lock (the removed subscriptions' states are finished after the commit).
    lock_registry(db)?;
    let mut ids = Vec::with_capacity(subs.len());
    for s in subs {
        // A live subscription the API made or changed stays as the API wrote it (see
        // docs/design.md, "One registry"). Its row is locked already.
        if let Some(row) = db.query_opt(
            "SELECT id FROM subscriptions
              WHERE name = $1 AND origin = 'api' AND removed_at IS NULL",
            &[&s.name],
        )? {
            ids.push(row.try_get(0)?);
            continue;
        }
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
        super::registry::write_row(db, id, s, "config")?;
        ids.push(id);
    }
    let removed = remove_unheld(db, &ids, now)?;
    bump(db)?;
    Ok(Synced { ids, removed })
}

/// The subscriptions' rows, then the fan-out's and the ingest's locks (see [`sync`]).
pub(super) fn lock_registry(db: &mut Db<'_>) -> StoreResult<()> {
    db.execute("SELECT 1 FROM subscriptions ORDER BY id FOR UPDATE", &[])?;
    db.batch(&format!(
        "SELECT pg_advisory_xact_lock({}); SELECT pg_advisory_xact_lock({})",
        super::fan_out::FAN_OUT_LOCK,
        super::fan_out::INGEST_LOCK
    ))
}

/// The condition on `u` of a subscription from a config that no live node's config names (by
/// the database's clock: the nodes' own may differ).
fn unheld_sql() -> String {
    format!(
        "u.origin = 'config' AND u.removed_at IS NULL
         AND NOT EXISTS (SELECT 1 FROM nodes n, json_array_elements_text(n.subscriptions::json) j
                          WHERE n.seen_at >= {NOW_MS} - {ttl} AND j = u.name)",
        NOW_MS = super::NOW_MS,
        ttl = registry::NODE_TTL_MS
    )
}

/// Remove the subscriptions not in `keep` that [`unheld_sql`] finds: one without state rows
/// goes, the others are marked removed (returned). Under [`lock_registry`].
fn remove_unheld(db: &mut Db<'_>, keep: &[i64], now: i64) -> StoreResult<Vec<i64>> {
    let unheld: Vec<i64> = db
        .query(
            &format!(
                "SELECT u.id FROM subscriptions u WHERE NOT (u.id = ANY($1)) AND {}",
                unheld_sql()
            ),
            &[&keep],
        )?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    db.execute(
        "DELETE FROM subscriptions u WHERE u.id = ANY($1)
            AND NOT EXISTS (SELECT 1 FROM event_state s WHERE s.sub = u.id)",
        &[&unheld],
    )?;
    Ok(db
        .query(
            "UPDATE subscriptions SET removed_at = $2
              WHERE id = ANY($1) AND removed_at IS NULL RETURNING id",
            &[&unheld, &now],
        )?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?)
}

/// The heartbeat's check (see `Store::prune_subscriptions`): a subscription from a config
/// whose nodes are all gone (stopped, or not seen for the TTL) is removed, as the sync of the
/// last of them would have. A read, and the locks of a sync only when there is one.
pub(super) fn prune(db: &mut Db<'_>, now: i64) -> StoreResult<Vec<i64>> {
    let unheld: bool = db
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM subscriptions u WHERE {})",
                unheld_sql()
            ),
            &[],
        )?
        .try_get(0)?;
    if !unheld {
        return Ok(Vec::new());
    }
    lock_registry(db)?;
    let removed = remove_unheld(db, &[], now)?;
    bump(db)?;
    Ok(removed)
}

/// Removed means finished: its pending and claimed states are completed with outcome
/// `removed` (a claim in flight is fenced out) and the attempts of the claimed ones closed, in
/// one statement (the states first: a claim that commits meanwhile is waited for, and its
/// attempt is the one closed). In a transaction of its own after the removal committed, with
/// no advisory lock held: a claim holds its state rows while it waits for the fan-out's lock.
pub(super) fn finish_removed(db: &mut Db<'_>, id: i64, now: i64) -> StoreResult<usize> {
    let finished: i64 = db
        .query_one(
            &format!(
                "WITH done AS (
                    UPDATE event_state s SET {}
                     WHERE s.sub = $1 AND s.status IN ('pending', 'claimed')
                    RETURNING s.seq, s.sub, s.attempts
                 ), closed AS (
                    UPDATE event_attempts a
                       SET finished_at = $2, result = 'permanent_error', error = '{}'
                      FROM done WHERE a.event_seq = done.seq AND a.sub = done.sub
                       AND a.attempt = done.attempts AND a.finished_at IS NULL
                 )
                 SELECT count(*) FROM done",
                registry::FINISHED_SET.replace("{now}", "$2"),
                registry::REMOVED_ERROR
            ),
            &[&id, &now],
        )?
        .try_get(0)?;
    Ok(usize::try_from(finished).unwrap_or(0))
}

/// Move the registry's version on: every node's next claim reads the subscriptions again.
pub(super) fn bump(db: &mut Db<'_>) -> StoreResult<()> {
    db.execute(
        "UPDATE subscription_registry SET version = version + 1 WHERE id = 0",
        &[],
    )?;
    Ok(())
}

/// A node's record: the subscriptions its config names, seen now.
/// Seen by the database's clock, as the removals compare it (`now`, the caller's, counts only
/// when it is earlier: a test's aged record).
pub(super) fn node_seen(
    db: &mut Db<'_>,
    node: &str,
    names: &[String],
    now: i64,
) -> StoreResult<()> {
    let names = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
    db.execute(
        &format!(
            "INSERT INTO nodes (name, subscriptions, seen_at)
             VALUES ($1, $2, least($3, {NOW_MS}))
             ON CONFLICT (name) DO UPDATE SET subscriptions = excluded.subscriptions,
                                              seen_at = excluded.seen_at",
            NOW_MS = super::NOW_MS
        ),
        &[&node, &names, &now],
    )?;
    Ok(())
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
        &format!("SELECT count(*) FROM (SELECT 1 {rows} ORDER BY l.seq FOR KEY SHARE OF l) locked"),
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
    // The body parsed once per event, for the filter's tests.
    let filtered = match &sub.filter {
        None => "true".to_string(),
        Some(_) => format!(
            "EXISTS (SELECT 1 FROM (SELECT webhook_inbox_json_body(p.payload) AS body
                                      FROM event_payloads p WHERE p.seq = l.seq) j
                      WHERE {})",
            takes_sql(sub, "l.", "j.body")
        ),
    };
    let sql = format!(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at, order_key)
         SELECT l.seq, $2, $3, 'pending', $4, {key} {rows}
            AND EXISTS (SELECT 1 FROM subscriptions u WHERE u.id = $2 AND u.removed_at IS NULL)
            AND EXISTS (SELECT 1 FROM event_payloads p WHERE p.seq = l.seq)
            AND {filtered}
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
                    u.probe_at, u.origin, u.mode, u.max_attempts,
                    array(SELECT n.name FROM nodes n,
                                 json_array_elements_text(n.subscriptions::json) j
                           WHERE j = u.name AND n.seen_at >= {NOW_MS} - {ttl} ORDER BY n.name)
               FROM subscriptions u ORDER BY u.removed_at IS NOT NULL, u.id",
            NOW_MS = super::NOW_MS,
            ttl = registry::NODE_TTL_MS
        ),
        &[],
    )?;
    rows.iter()
        .map(|r| {
            let removed: bool = r.try_get(6)?;
            let mut counts = StatusCounts {
                pending: r.try_get(9)?,
                claimed: r.try_get(10)?,
                completed: r.try_get(11)?,
                failed: r.try_get(12)?,
                oldest_due_at: r.try_get(13)?,
                fan_out_waiting: 0,
            };
            // Events not fanned out yet wait for every live subscription a fan-out gives a
            // state (every kind but `downstream`).
            let kind: String = r.try_get(1)?;
            let waits = crate::subscriptions::Kind::parse(&kind)
                .is_some_and(crate::subscriptions::Kind::waits_on_fan_out);
            if waits && !removed {
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
                origin: r.try_get(15)?,
                mode: crate::domain::DeliveryMode::parse(r.try_get(16)?)
                    .unwrap_or(crate::domain::DeliveryMode::AtLeastOnce),
                max_attempts: u32::try_from(r.try_get::<_, i64>(17)?).unwrap_or(0),
                declared_by: r.try_get(18)?,
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
