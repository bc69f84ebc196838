//! Ordering per key on SQLite: the claim of an ordered subscription. (The key itself is read
//! at the fan-out; ops' skips and held keys are `store::sql::ordering`'s.)

use rusqlite::{Transaction, params};

use super::consume::{CLAIMED, claimed};
use super::subscriptions::Routes;
use crate::store::routes::Ordered;
use crate::store::{Claimed, StoreResult};

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
