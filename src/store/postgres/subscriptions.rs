//! Subscriptions on PostgreSQL: the `subscriptions` table (migration 0003) kept in step with
//! the config, a removed subscription's work finished, and backfill. The routes are
//! [`super::routes`]'.

use super::session::Db;
use crate::store::StoreResult;
use crate::store::sql::registry::{bump, write_row};
use crate::store::{registry, routes};
use crate::subscriptions::Subscription;

pub(super) use super::routes::{Live, RouteCache, Routes, load, registry_version, route_sql};
use super::routes::{key_sql, takes_sql};

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
        write_row(db, id, s, "config")?;
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
