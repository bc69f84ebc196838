//! The fan-out (migration 0011): an event of lane 0 after the cursor has no state row; the
//! first claim that reaches it gives it one state row per live subscription whose route
//! matches, in one `INSERT … SELECT`, and moves the cursor past it.

use std::collections::HashMap;

use rusqlite::{Transaction, params};

use super::consume::{CLAIMED, claimed};
use super::subscriptions::{Routes, route_sql};
use crate::store::routes::Live;
use crate::store::{Claimed, StoreResult};

/// Whether a subscription's fanned-out state row starts claimed, for a lane-0 claim: the
/// in-process ones that are not paused (lane 0 is claimer `batch`: both follow from the kind,
/// and the integer is the cheaper test on this hot path).
/// An ordered subscription's rows start pending: its claim decides, by key.
pub const IN_PROCESS_CLAIMS_NOW: &str = "(u.lane = 0 AND u.paused = 0 AND u.ordered_by IS NULL)";

/// The fan-out of the lane-0 events in `(?3, ?4]`: a state row for each live subscription whose
/// route and filter take the event and that took it (added before it was stored). Due since
/// the event was received. The rows of the subscriptions that `claims_now` (an expression on
/// `u`) picks start claimed by worker ?1 until ?2 with claim token ?5, the others pending.
/// `None` when no subscription is live.
///
/// Arms, each for one start (claimed or pending), so that what depends on the subscription
/// alone (`claims_now`, its lane) is decided once per arm, not per event and subscription as a
/// `CASE` over a cross join was (27,700 instructions a fanned-out event against 22,000,
/// docs/performance.md, issue 60's fourth look):
/// - a subscription without a filter has its own arms, each a seek of its `u` row then a range
///   of the log; the arm whose `claims_now` does not hold stops at its `u` row;
/// - filtered subscriptions with the same filter (and order key) share arms that read the log
///   first and test the filter once per event for all of them, where each subscription's arm
///   would read the body again (three subscriptions with one two-condition filter: 104,600
///   instructions an event against 77,400). The scalar subquery, run once, stops the arm
///   whose start none of them has before it reads a body.
///
/// `ORDER BY` merges the arms, each already in `(seq, sub)` order: no sort. `NOT INDEXED` keeps
/// each arm on the log's rowid range where a route on `source` would tempt the planner to the
/// `(source, event_id)` key.
///
/// The claim token is one per claim statement (?5, fresh random 128 bits), shared by the rows
/// it claims: every fence names the row by `(seq, sub)` as well, so a token still matches only
/// the claim it came from, and one random value replaces one per row (about 2,900 instructions
/// a row).
pub fn fan_out_sql(live: &[Live], claims_now: &str) -> Option<String> {
    let starts = [
        (
            "'claimed', 1, l.received_at, ?2, ?1, ?5",
            claims_now.to_string(),
        ),
        (
            "'pending', 0, l.received_at, NULL, NULL, NULL",
            format!("NOT {claims_now}"),
        ),
    ];
    let mut arms = Vec::new();
    let mut groups: Vec<(String, String, Vec<&Live>)> = Vec::new();
    // A subscription of submitted requests alone (the `downstream` kind's route) takes no
    // event of lane 0: a webhook's source is never `requests` (the config refuses the name).
    // Its arms would each read every event of the range to keep none (the fan-out's read of
    // the default config: 1,021 → 736 ns an event without them).
    for s in live.iter().filter(|s| !requests_only(&s.route)) {
        let key = s.ordered.as_ref().map_or_else(
            || "NULL".to_string(),
            |o| super::subscriptions::key_sql(&o.path),
        );
        let Some(filter) = super::subscriptions::filter_sql(s) else {
            let (id, lane) = (s.id, s.lane);
            let route = route_sql(&s.route, "l.");
            for (columns, start) in &starts {
                arms.push(format!(
                    "SELECT l.seq, {id}, {lane}, {columns}, {key}
  FROM subscriptions u CROSS JOIN event_log l NOT INDEXED
 WHERE u.id = {id} AND u.removed_at IS NULL AND {start}
   AND l.seq > ?3 AND l.seq <= ?4 AND l.seq > u.start_after_seq AND l.lane = 0 AND {route}"
                ));
            }
            continue;
        };
        match groups
            .iter_mut()
            .find(|(f, k, _)| *f == filter && *k == key)
        {
            Some((_, _, subs)) => subs.push(s),
            None => groups.push((filter, key, vec![s])),
        }
    }
    for (filter, key, subs) in &groups {
        let ids: Vec<String> = subs.iter().map(|s| s.id.to_string()).collect();
        let ids = ids.join(", ");
        let routes: Vec<String> = subs.iter().map(|s| route_sql(&s.route, "l.")).collect();
        let any_route = routes.join(" OR ");
        let route_of_u = match &routes[..] {
            [one] => one.clone(),
            _ => {
                let arms: String = subs
                    .iter()
                    .zip(&routes)
                    .map(|(s, r)| format!(" WHEN {} THEN {r}", s.id))
                    .collect();
                format!("CASE u.id{arms} END")
            }
        };
        for (columns, start) in &starts {
            arms.push(format!(
                "SELECT l.seq, u.id, u.lane, {columns}, {key}
  FROM event_log l NOT INDEXED CROSS JOIN subscriptions u
 WHERE (SELECT count(*) FROM subscriptions u
         WHERE u.id IN ({ids}) AND u.removed_at IS NULL AND {start}) > 0
   AND l.seq > ?3 AND l.seq <= ?4 AND l.lane = 0 AND ({any_route}) AND {filter}
   AND u.id IN ({ids}) AND u.removed_at IS NULL AND {start}
   AND l.seq > u.start_after_seq AND {route_of_u}"
            ));
        }
    }
    if arms.is_empty() {
        return None;
    }
    Some(format!(
        "INSERT INTO event_state (seq, sub, lane, status, attempts, next_attempt_at,
                         claimed_until, claimed_by, claim_token, order_key)
{}
 ORDER BY 1, 2
RETURNING {CLAIMED}, status",
        arms.join("\nUNION ALL\n")
    ))
}

/// Whether a route takes the submission API's events alone.
fn requests_only(route: &crate::subscriptions::Route) -> bool {
    route
        .sources
        .as_ref()
        .is_some_and(|list| list.iter().all(|s| s == crate::domain::RESERVED_SOURCE))
}

/// The state rows of one submitted request (lane 1), stored with it: pending, due now, for
/// each live subscription whose route matches (the `downstream` ones).
pub(super) fn fan_out_one_sql(routes: &str) -> String {
    format!(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at)
SELECT l.seq, u.id, u.lane, 'pending', l.received_at
  FROM event_log l JOIN subscriptions u
    ON u.removed_at IS NULL AND l.seq > u.start_after_seq AND {routes}
 WHERE l.seq = ?1"
    )
}

/// Fan out the next `room` lane-0 events after the cursor and move the cursor past them, in
/// one transaction: the claims of those events (the rows that started claimed), each with its
/// attempt opened in the history. `lease`: the claiming worker, its lease's end and now.
///
/// The cursor moves to the last event fanned out; if there were fewer than `room`, none of
/// lane 0's events is left anywhere in the log, and it moves to the last `seq` (writes are
/// serialised, so no event can appear behind it). It only ever moves forward.
pub(super) fn fan_out(
    tx: &Transaction<'_>,
    routes: &Routes,
    claims_now: &str,
    (worker, claimed_until, now): (&str, i64, i64),
    room: usize,
) -> StoreResult<Vec<Claimed>> {
    let cursor: i64 = tx
        .prepare_cached("SELECT after_seq FROM queue_cursor WHERE id = 0")?
        .query_row([], |r| r.get(0))?;
    let (found, last): (i64, Option<i64>) = tx
        .prepare_cached(&format!(
            "SELECT count(*), max(seq) FROM (SELECT seq FROM event_log
              WHERE seq > ?1 AND lane = 0 ORDER BY seq LIMIT {room})"
        ))?
        .query_row([cursor], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let mut claims = Vec::new();
    if let (Some(last), Some(sql)) = (last, routes.fan_out_sql(claims_now)) {
        let nonce = hex::encode(rand::random::<[u8; 16]>());
        let mut fan = tx.prepare_cached(&sql)?;
        let mut rows = fan.query(params![worker, claimed_until, cursor, last, nonce])?;
        let mut taken: HashMap<i64, u64> = HashMap::new();
        while let Some(row) = rows.next()? {
            if row.get::<_, String>(7)? == "claimed" {
                claims.push(claimed(row)?);
            }
            *taken.entry(row.get(5)?).or_default() += 1;
        }
        count_left_out(tx, routes, cursor, last, &taken)?;
        open_attempts(tx, &claims, &nonce, worker, now)?;
    }
    let to = if (found as usize) < room {
        tx.prepare_cached("SELECT ifnull(max(seq), 0) FROM event_log")?
            .query_row([], |r| r.get(0))?
    } else {
        last.unwrap_or(cursor)
    };
    tx.prepare_cached("UPDATE queue_cursor SET after_seq = ?1 WHERE id = 0 AND after_seq < ?1")?
        .execute(params![to])?;
    Ok(claims)
}

/// The history rows of a fan-out's claims, in one statement: the rows it claimed are those
/// with its claim token (fresh for the statement) in the rowid range of its claims. One
/// `INSERT` per claim cost about 8,000 instructions an event, mostly binding and running the
/// statement (docs/performance.md, "The drain against 3acae90 (instructions)").
fn open_attempts(
    tx: &Transaction<'_>,
    claims: &[Claimed],
    nonce: &str,
    worker: &str,
    now: i64,
) -> StoreResult<()> {
    let rows = claims.iter().filter_map(|c| c.claim.row);
    let (Some(first), Some(last)) = (rows.clone().min(), rows.max()) else {
        return Ok(());
    };
    tx.prepare_cached(
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at)
         SELECT seq, sub, attempts, ?1, ?2 FROM event_state
          WHERE rowid >= ?3 AND rowid <= ?4 AND claim_token = ?5 ORDER BY rowid",
    )?
    .execute(params![worker, now, first, last, nonce])?;
    Ok(())
}

/// Count what the fan-out of `(cursor, last]` left out of each filtered subscription: the
/// events its route takes (no body read) less the rows it was given (`taken`, by id). Nothing
/// runs without a filtered subscription.
fn count_left_out(
    tx: &Transaction<'_>,
    routes: &Routes,
    cursor: i64,
    last: i64,
    taken: &HashMap<i64, u64>,
) -> StoreResult<()> {
    let arms: String = routes
        .live
        .iter()
        .filter(|s| s.filter.is_some())
        .map(|s| {
            format!(
                " WHEN {} THEN {}",
                s.id,
                super::subscriptions::route_sql(&s.route, "l.")
            )
        })
        .collect();
    if arms.is_empty() {
        return Ok(());
    }
    let mut routed = tx.prepare_cached(&format!(
        "SELECT u.id, count(*) FROM event_log l CROSS JOIN subscriptions u
          WHERE l.seq > ?1 AND l.seq <= ?2 AND l.lane = 0 AND u.removed_at IS NULL
            AND l.seq > u.start_after_seq AND (CASE u.id{arms} ELSE 0 END)
          GROUP BY u.id"
    ))?;
    let counts = routed
        .query_map(params![cursor, last], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (id, routed) in counts {
        let given = taken.get(&id).copied().unwrap_or(0);
        if let Some(sub) = routes.live.iter().find(|s| s.id == id) {
            routes.left_out.add(
                &sub.name,
                u64::try_from(routed).unwrap_or(0).saturating_sub(given),
            );
        }
    }
    Ok(())
}
