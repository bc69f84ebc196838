//! Subscriptions on SQLite: the `subscriptions` table (migration 0011), kept in step with the
//! config, and each live one's route compiled to SQL for the fan-out, the filters and backfill.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::dialect::Sqlite;
use crate::store::StoreResult;
use crate::store::sql::registry::{bump, insert_row, write_row};
use crate::store::{registry, routes};
use crate::subscriptions::{Route, Subscription};

pub(super) use crate::store::routes::Live;

/// The live subscriptions, and the route of each as one SQL expression over `l.source` and
/// `l.event_type` picked by `u.id` (for a join of the log `l` with `subscriptions u`).
#[derive(Debug, Clone, Default)]
pub(super) struct Routes {
    pub live: Vec<Live>,
    pub by_id: String,
    /// When each ordered subscription's claim last read its whole backlog (see
    /// `ordering::claim`).
    pub whole_looks:
        std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<i64, std::time::Instant>>>,
    /// The registry's version these were read at.
    pub version: i64,
    /// What the fan-outs left out of filtered subscriptions (the store's, shared by each
    /// version of its routes).
    pub left_out: std::sync::Arc<crate::store::filters::LeftOut>,
    /// The fan-out statement for each `claims_now` asked for, written once per version of the
    /// routes: writing one with filters took more than running it (122,000 instructions).
    pub fan_outs: std::sync::Arc<parking_lot::Mutex<FanOuts>>,
}

type FanOuts = std::collections::HashMap<String, Option<std::sync::Arc<str>>>;

impl Routes {
    pub fn named(&self, name: &str) -> Option<&Live> {
        self.live.iter().find(|s| s.name == name)
    }

    /// [`super::fan_out_sql`] over these routes, kept.
    pub fn fan_out_sql(&self, claims_now: &str) -> Option<std::sync::Arc<str>> {
        let mut kept = self.fan_outs.lock();
        if let Some(sql) = kept.get(claims_now) {
            return sql.clone();
        }
        let sql = super::fan_out_sql(&self.live, claims_now).map(std::sync::Arc::from);
        kept.insert(claims_now.to_string(), sql.clone());
        sql
    }
}

/// A route as an SQL condition on `{alias}source` and `{alias}event_type`. Globs are SQLite's
/// GLOB, which means what ours do once brackets are refused (the config does); one without
/// `*` or `?` is an equality, which costs the fan-out less per event than GLOB's matcher.
pub(super) fn route_sql(route: &Route, alias: &str) -> String {
    routes::route_sql(route, alias, |column, glob| {
        let op = if glob.contains(['*', '?']) {
            "GLOB"
        } else {
            "="
        };
        format!("{column} {op} {}", routes::quote(glob))
    })
}

/// Whether subscription `s` takes the event `l` (an alias of `event_log`): its route, then
/// its filter on the body. The filter is read only for events the route takes, and a
/// subscription without one costs what its route costs.
pub(super) fn takes_sql(s: &Live) -> String {
    let route = route_sql(&s.route, "l.");
    match filter_sql(s) {
        None => route,
        Some(filter) => format!("(CASE WHEN {route} THEN {filter} ELSE 0 END)"),
    }
}

/// Subscription `s`'s filter as a condition on the body of the event `l`, if it has one.
pub(super) fn filter_sql(s: &Live) -> Option<String> {
    let dialect = crate::store::filters::Sqlite {
        body: "CAST(l.payload AS TEXT)",
    };
    Some(crate::store::filters::filter_sql(
        s.filter.as_ref()?,
        &dialect,
    ))
}

/// The live subscriptions as the table has them.
pub(super) fn load(conn: &Connection) -> StoreResult<Routes> {
    let version = registry_version(conn)?;
    let live = crate::store::sql::registry::live(&mut Sqlite(conn))?;
    let arms: String = live
        .iter()
        .map(|s| format!(" WHEN {} THEN {}", s.id, takes_sql(s)))
        .collect();
    let by_id = if live.is_empty() {
        "0".into()
    } else {
        format!("CASE u.id{arms} ELSE 0 END")
    };
    Ok(Routes {
        live,
        by_id,
        fan_outs: Default::default(),
        whole_looks: Default::default(),
        version,
        left_out: Default::default(),
    })
}

/// The registry's version now (see migration 0014).
pub(super) fn registry_version(conn: &Connection) -> StoreResult<i64> {
    Ok(conn
        .prepare_cached("SELECT version FROM subscription_registry WHERE id = 0")?
        .query_row([], |r| r.get(0))?)
}

/// The order key of the body of `l`: the value at `path` as text, NULL when the body is not
/// JSON or has no such field (a body is never refused here: it only has no key).
pub(super) fn key_sql(path: &[String]) -> String {
    format!(
        "(CASE WHEN json_valid(CAST(l.payload AS TEXT))
               THEN CAST(json_extract(CAST(l.payload AS TEXT), {}) AS TEXT) END)",
        crate::store::filters::sqlite_json_path(path)
    )
}

/// Make the table the config's list (see `Store::sync_subscriptions`). A live subscription
/// the API made or changed (origin `api`) is left as the API wrote it: a config names it, but
/// does not take it back (see docs/design.md, "One registry").
pub(super) fn sync(tx: &Transaction<'_>, subs: &[Subscription], now: i64) -> StoreResult<Vec<i64>> {
    let mut ids = Vec::with_capacity(subs.len());
    for s in subs {
        let existing: Option<(i64, bool)> = tx
            .query_row(
                "SELECT id, origin = 'api' AND removed_at IS NULL FROM subscriptions
                  WHERE name = ?1",
                [&s.name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let id = match existing {
            Some((id, true)) => {
                ids.push(id);
                continue;
            }
            Some((id, false)) => {
                tx.execute(
                    "UPDATE subscriptions SET removed_at = NULL WHERE id = ?1",
                    [id],
                )?;
                id
            }
            None => insert_row(&mut Sqlite(tx), s, now)?,
        };
        write_row(&mut Sqlite(tx), id, s, "config")?;
        ids.push(id);
    }
    remove_unheld(tx, &ids, now)?;
    bump(&mut Sqlite(tx))?;
    Ok(ids)
}

/// Remove the subscriptions not in `keep` that came from a config and that no live node's
/// config names (see `store::registry`): one that never took an event (the implicit three of
/// a database configured from the start) goes; one with a history keeps its row, marked
/// removed, and its unfinished states are finished. Returns how many were removed.
fn remove_unheld(tx: &Transaction<'_>, keep: &[i64], now: i64) -> StoreResult<usize> {
    let mut forget = tx.prepare(
        "DELETE FROM subscriptions WHERE id = ?1
            AND NOT EXISTS (SELECT 1 FROM event_state WHERE sub = ?1)",
    )?;
    let mut mark = tx.prepare("UPDATE subscriptions SET removed_at = ?2 WHERE id = ?1")?;
    let unheld: Vec<i64> = tx
        .prepare(
            "SELECT u.id FROM subscriptions u
              WHERE u.origin = 'config' AND u.removed_at IS NULL
                AND NOT EXISTS (SELECT 1 FROM nodes n, json_each(n.subscriptions) j
                                 WHERE n.seen_at >= ?1 AND j.value = u.name)",
        )?
        .query_map([now - registry::NODE_TTL_MS], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut removed = 0;
    for id in unheld.into_iter().filter(|id| !keep.contains(id)) {
        if forget.execute([id])? == 0 {
            mark.execute(params![id, now])?;
            finish_removed(tx, id, now)?;
        }
        removed += 1;
    }
    Ok(removed)
}

/// The heartbeat's check (see `Store::prune_subscriptions`): a subscription from a config
/// whose nodes are all gone is removed, as the sync of the last of them would have.
pub(super) fn prune(tx: &Transaction<'_>, now: i64) -> StoreResult<usize> {
    let removed = remove_unheld(tx, &[], now)?;
    if removed > 0 {
        bump(&mut Sqlite(tx))?;
    }
    Ok(removed)
}

/// Removed means finished: its pending and claimed states are completed with outcome
/// `removed` (a claim in flight is fenced out), and the attempts of the claimed ones closed;
/// its history is kept. Returns how many.
pub(super) fn finish_removed(tx: &Transaction<'_>, id: i64, now: i64) -> StoreResult<usize> {
    let done: Vec<(i64, i64)> = tx
        .prepare(&format!(
            "UPDATE event_state SET {} WHERE sub = ?1 AND status IN ('pending', 'claimed')
             RETURNING seq, attempts",
            registry::FINISHED_SET.replace("{now}", "?2")
        ))?
        .query_map(params![id, now], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut close = tx.prepare(
        "UPDATE event_attempts SET finished_at = ?4, result = 'permanent_error', error = ?5
          WHERE event_seq = ?1 AND sub = ?2 AND attempt = ?3 AND finished_at IS NULL",
    )?;
    for (seq, attempt) in &done {
        close.execute(params![seq, id, attempt, now, registry::REMOVED_ERROR])?;
    }
    Ok(done.len())
}

/// Events stored at or after `since`, at or before the cursor (fanned out already, or stored
/// before the subscription was added), that the route matches and that have no state in it.
pub(super) fn backfill(
    tx: &Transaction<'_>,
    sub: &Live,
    since: i64,
    now: i64,
) -> StoreResult<usize> {
    // An ordered subscription's states take their key, as the fan-out gives them.
    let key = sub
        .ordered
        .as_ref()
        .map_or_else(|| "NULL".to_string(), |o| key_sql(&o.path));
    let sql = format!(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at, order_key)
         SELECT l.seq, ?1, ?2, 'pending', ?3, {key} FROM event_log l
          WHERE l.received_at >= ?4 AND l.payload IS NOT NULL
            AND (l.lane = 1 OR l.seq <= (SELECT after_seq FROM queue_cursor WHERE id = 0))
            AND {}
            AND NOT EXISTS (SELECT 1 FROM event_state s WHERE s.seq = l.seq AND s.sub = ?1)",
        takes_sql(sub)
    );
    Ok(tx.execute(&sql, params![sub.id, sub.lane, now, since])?)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::super::migrations::{MIGRATIONS, apply_all};

    /// Migration 0011 on a database of migration 0010 with events in every state: each keeps
    /// its state, under the implicit subscription that handled it, and its history follows.
    #[test]
    fn every_event_keeps_its_state_under_the_subscription_that_handled_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
        // Off while migrating, as `migrations::apply` has it (checked after each one).
        conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        apply_all(&mut conn, &MIGRATIONS[..10]).unwrap();
        conn.execute_batch(
            "INSERT INTO event_log (seq, source, event_id, event_type, payload_sha256, received_at,
                                    lane, last_delivered_at, payload)
             VALUES (1, 'shop', 'done', 'order.completed', zeroblob(32), 1, 0, 1, x'7b7d'),
                    (2, 'shop', 'retrying', 'order.completed', zeroblob(32), 2, 0, 2, x'7b7d'),
                    (3, 'shop', 'claimed', 'customer.created', zeroblob(32), 3, 0, 3, x'7b7d'),
                    (4, 'shop', 'failed', 'customer.created', zeroblob(32), 4, 0, 4, x'7b7d'),
                    (5, 'requests', 'abandoned', 'request.submitted', zeroblob(32), 5, 1, 5,
                     x'7b7d'),
                    (6, 'shop', 'purged', 'thing.done', zeroblob(32), 6, 0, 6, NULL),
                    (7, 'requests', 'queued', 'request.submitted', zeroblob(32), 7, 1, 7,
                     x'7b7d'),
                    (8, 'shop', 'waiting', 'order.completed', zeroblob(32), 8, 0, 8, x'7b7d');
             UPDATE queue_cursors SET after_seq = 7;
             INSERT INTO event_state (seq, lane, status, attempts, next_attempt_at, claimed_until,
                                      claimed_by, claim_token, completed_at, outcome, last_error,
                                      abandoned, finished_at, purged_at)
             VALUES (1, 0, 'completed', 1, NULL, NULL, NULL, NULL, 10, 'credited', NULL, 0,
                     NULL, NULL),
                    (2, 0, 'pending', 2, 50, NULL, NULL, NULL, NULL, NULL, 'boom', 0, NULL,
                     NULL),
                    (3, 0, 'claimed', 1, 3, 99, 'w', 'tok', NULL, NULL, NULL, 0, NULL, NULL),
                    (4, 0, 'failed', 3, NULL, NULL, NULL, NULL, NULL, NULL, 'bad', 0, NULL,
                     NULL),
                    (5, 1, 'failed', 1, NULL, NULL, NULL, NULL, NULL, NULL, 'unknown', 1, NULL,
                     NULL),
                    (6, 0, 'completed', 1, NULL, NULL, NULL, NULL, 11, 'logged', NULL, 0, 12, 13),
                    (7, 1, 'pending', 0, 7, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL);
             INSERT INTO event_attempts (event_seq, attempt, worker, started_at, finished_at,
                                         result, error)
             VALUES (1, 1, 'w', 1, 2, 'ok', NULL),
                    (2, 1, 'w', 2, 3, 'retryable_error', 'boom'),
                    (2, 2, 'w', 4, 5, 'retryable_error', 'boom'),
                    (3, 1, 'w', 3, NULL, NULL, NULL),
                    (5, 1, 'w', 5, 6, 'lease_expired', 'lease expired');",
        )
        .unwrap();
        let columns = "seq, lane, status, attempts, next_attempt_at, claimed_until, claimed_by, \
                       claim_token, completed_at, outcome, last_error, abandoned, finished_at, \
                       purged_at";
        let dump = |conn: &Connection, sql: &str| -> Vec<String> {
            let mut stmt = conn.prepare(sql).unwrap();
            let n = stmt.column_count();
            stmt.query_map([], |r| {
                Ok((0..n)
                    .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap()))
                    .collect::<Vec<_>>()
                    .join(", "))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
        };
        let states = format!("SELECT {columns} FROM event_state ORDER BY seq");
        let history = "SELECT event_seq, attempt, worker, started_at, finished_at, result, error \
                       FROM event_attempts ORDER BY event_seq, attempt";
        let events = "SELECT seq, status, attempts, outcome, abandoned, purged_at FROM events \
                      ORDER BY seq";
        let (states_before, history_before, events_before) = (
            dump(&conn, &states),
            dump(&conn, history),
            dump(&conn, events),
        );
        apply_all(&mut conn, &MIGRATIONS[..11]).unwrap();
        conn.execute_batch("PRAGMA foreign_keys = ON").unwrap();
        assert_eq!(
            dump(&conn, &states),
            states_before,
            "every state, column by column"
        );
        assert_eq!(dump(&conn, history), history_before, "every attempt");
        assert_eq!(
            dump(&conn, events),
            events_before,
            "the events view reads the same"
        );
        let subs: Vec<(i64, String)> = conn
            .prepare(
                "SELECT s.seq, u.name FROM event_state s JOIN subscriptions u ON u.id = s.sub
                  ORDER BY s.seq",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected = [
            (1, "loyalty"),
            (2, "loyalty"),
            (3, "audit"),
            (4, "audit"),
            (5, "downstream"),
            (6, "audit"),
            (7, "downstream"),
        ];
        let expected: Vec<(i64, String)> =
            expected.iter().map(|(s, n)| (*s, n.to_string())).collect();
        assert_eq!(subs, expected);
        let attempts_follow: i64 = conn
            .query_row(
                "SELECT count(*) FROM event_attempts a JOIN event_state s
                    ON s.seq = a.event_seq AND s.sub = a.sub",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(attempts_follow, 5);
        // The event after the cursor has no state yet and waits for its fan-out.
        let waiting: String = conn
            .query_row("SELECT status FROM events WHERE seq = 8", [], |r| r.get(0))
            .unwrap();
        assert_eq!(waiting, "pending");
        let fk: Vec<String> = dump(&conn, "PRAGMA foreign_key_check");
        assert!(fk.is_empty(), "{fk:?}");
        let integrity: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(integrity, "ok");
    }
}
