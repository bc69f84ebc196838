//! Ordering per key on SQLite: ops skipping the event that holds a key, and the held keys.
//! (The key itself is read at the fan-out; the claims keep the order: see `consume`.)

use rusqlite::{OptionalExtension, Transaction, params};

use super::consume::{CLAIMED, claimed};
use super::dialect::Sqlite;
use super::subscriptions::Routes;
use crate::store::routes::Ordered;
use crate::store::sql::view::{fill_subscriptions, get};
use crate::store::{Claimed, HeldKey, SkipOutcome, Status, StoreResult};

/// A claim of an ordered subscription first looks at this many times its limit of the oldest
/// due states, not at all of them.
const WINDOW: usize = 4;

/// A claim reads an ordered subscription's whole backlog at most this often.
const WHOLE_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The claim of an ordered subscription's due states: each only if no earlier state of its key
/// is unfinished (`Ordered::may_claim_sql`), so at most one per key, the earliest.
///
/// That condition is one index lookup per due state looked at. Looking at every due state
/// costs a scan of the subscription's backlog per claim, which with a handful of keys and a
/// large backlog found a handful of events each time (measured: 270 events/s over 10 keys and
/// 30,000 events, against 36,000 unordered). So the claim first looks at a window, the oldest
/// `WINDOW × limit` due states: with many keys it fills there, and with few keys their heads
/// are among the oldest. Only a window that holds nothing claimable while more is due (a
/// failed event holding a key with more waiting events than the window, or every head in
/// flight) sends it over the whole backlog, so that no key behind such a prefix waits for it;
/// and at most every [`WHOLE_LOOK_EVERY`] (each such look claims up to the limit), since with
/// every head in flight an idle claimer would otherwise read the backlog at every try.
pub(super) fn claim(
    tx: &Transaction<'_>,
    routes: &Routes,
    sub: i64,
    ordered: &Ordered,
    limit: usize,
    (worker, claimed_until, now): (&str, i64, i64),
    claims: &mut Vec<Claimed>,
) -> StoreResult<()> {
    let window = (limit * WINDOW).max(64);
    let run = |sql: &str, claims: &mut Vec<Claimed>| -> StoreResult<usize> {
        let mut stmt = tx.prepare_cached(sql)?;
        let before = claims.len();
        for c in stmt.query_map(params![worker, claimed_until, now], claimed)? {
            claims.push(c?);
        }
        Ok(claims.len() - before)
    };
    if run(&claim_sql(sub, limit, ordered, Some(window)), claims)? > 0 {
        return Ok(());
    }
    let due: i64 = tx
        .prepare_cached(&format!(
            "SELECT count(*) FROM (SELECT 1 FROM event_state INDEXED BY events_due
              WHERE status = 'pending' AND sub = {sub} AND next_attempt_at <= ?1
              LIMIT {window})"
        ))?
        .query_row([now], |r| r.get(0))?;
    if usize::try_from(due).is_ok_and(|due| due == window) && whole_look_due(routes, sub) {
        run(&claim_sql(sub, limit, ordered, None), claims)?;
    }
    Ok(())
}

/// Whether a claim of `sub` may read the whole backlog now (and if so, it is noted).
fn whole_look_due(routes: &Routes, sub: i64) -> bool {
    let now = std::time::Instant::now();
    let mut looks = routes.whole_looks.lock();
    match looks.get(&sub) {
        Some(last) if now.duration_since(*last) < WHOLE_LOOK_EVERY => false,
        _ => {
            looks.insert(sub, now);
            true
        }
    }
}

/// The claim's statement, over the oldest `window` due states, or over all of them.
pub fn claim_sql(sub: i64, limit: usize, ordered: &Ordered, window: Option<usize>) -> String {
    let may = ordered.may_claim_sql("INDEXED BY events_ordered");
    let window = window.map_or(String::new(), |w| format!("LIMIT {w}"));
    format!(
        "UPDATE event_state
    SET status = 'claimed', claimed_by = ?1, claimed_until = ?2,
        attempts = attempts + 1, claim_token = lower(hex(randomblob(16)))
  WHERE rowid IN (
        SELECT s.r FROM (SELECT rowid AS r, seq, sub, order_key, next_attempt_at
                           FROM event_state INDEXED BY events_due
                          WHERE status = 'pending' AND sub = {sub} AND next_attempt_at <= ?3
                          ORDER BY next_attempt_at {window}) AS s
         WHERE {may}
         ORDER BY s.next_attempt_at LIMIT {limit})
RETURNING {CLAIMED}"
    )
}

/// What a skip records on the attempt it adds.
pub(crate) const SKIPPED_BY_OPS: &str = "skipped by ops: the later events of its key go on";

pub(super) fn skip(
    tx: &Transaction<'_>,
    routes: &Routes,
    source: &str,
    event_id: &str,
    subscription: &str,
    now: i64,
) -> StoreResult<SkipOutcome> {
    let (Some(live), Some(event)) = (
        routes.named(subscription),
        get(&mut Sqlite(tx), source, event_id)?,
    ) else {
        return Ok(SkipOutcome::NotFound);
    };
    let skipped: Option<i64> = tx
        .prepare_cached(
            "UPDATE event_state
                SET status = 'completed', outcome = 'skipped', completed_at = ?3,
                    finished_at = ?3, next_attempt_at = NULL, last_error = NULL,
                    attempts = attempts + 1
              WHERE seq = ?1 AND sub = ?2 AND status IN ('failed', 'pending')
             RETURNING attempts",
        )?
        .query_row(params![event.seq, live.id, now], |r| r.get(0))
        .optional()?;
    let Some(attempt) = skipped else {
        let status: Option<String> = tx
            .prepare_cached("SELECT status FROM event_state WHERE seq = ?1 AND sub = ?2")?
            .query_row(params![event.seq, live.id], |r| r.get(0))
            .optional()?;
        return Ok(match status.as_deref().and_then(Status::parse) {
            Some(status) => SkipOutcome::Refused(status),
            None => SkipOutcome::NotFound,
        });
    };
    tx.prepare_cached(
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at, finished_at,
                                     result, error)
         VALUES (?1, ?2, ?3, 'ops', ?4, ?4, 'ok', ?5)",
    )?
    .execute(params![event.seq, live.id, attempt, now, SKIPPED_BY_OPS])?;
    let Some(mut event) = get(&mut Sqlite(tx), source, event_id)? else {
        return Ok(SkipOutcome::NotFound);
    };
    fill_subscriptions(
        &mut Sqlite(tx),
        &routes.live,
        std::slice::from_mut(&mut event),
    )?;
    Ok(SkipOutcome::Skipped(Box::new(event)))
}

/// The first failed state of each key of `subscription`, with how many wait behind it.
pub(super) fn held_keys(
    conn: &rusqlite::Connection,
    routes: &Routes,
    subscription: &str,
    limit: usize,
) -> StoreResult<Vec<HeldKey>> {
    let Some(live) = routes.named(subscription) else {
        return Ok(Vec::new());
    };
    let held = conn
        .prepare_cached(
            "SELECT s.order_key, l.source, l.event_id, s.finished_at,
                    (SELECT count(*) FROM event_state w INDEXED BY events_ordered
                      WHERE w.sub = s.sub AND w.order_key = s.order_key
                        AND w.order_key IS NOT NULL AND w.status <> 'completed'
                        AND w.seq > s.seq)
               FROM event_state s INDEXED BY events_failed JOIN event_log l ON l.seq = s.seq
              WHERE s.status = 'failed' AND s.sub = ?1 AND s.order_key IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM event_state e INDEXED BY events_ordered
                                 WHERE e.sub = s.sub AND e.order_key = s.order_key
                                   AND e.order_key IS NOT NULL AND e.status <> 'completed'
                                   AND e.status = 'failed' AND e.seq < s.seq)
              ORDER BY s.seq LIMIT ?2",
        )?
        .query_map(params![live.id, limit as i64], |r| {
            Ok(HeldKey {
                key: r.get(0)?,
                source: r.get(1)?,
                event_id: r.get(2)?,
                failed_at: r.get(3)?,
                waiting: r.get(4)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(held)
}
