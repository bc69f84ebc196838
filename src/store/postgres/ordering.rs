//! Ordering per key on PostgreSQL: ops skipping the event that holds a key, and the held keys.
//! (The key itself is read at the fan-out; the claims keep the order: see `consume`.)

use super::NOW_MS;
use super::session::Db;
use super::subscriptions::Routes;
use crate::store::sql::view::{fill_subscriptions, get};
use crate::store::sqlite::SKIPPED_BY_OPS;
use crate::store::{HeldKey, SkipOutcome, Status, StoreResult};

pub(super) fn skip(
    db: &mut Db<'_>,
    routes: &Routes,
    source: &str,
    event_id: &str,
    subscription: &str,
) -> StoreResult<SkipOutcome> {
    let (Some(sub), Some(event)) = (
        routes
            .live
            .iter()
            .find(|l| l.name == subscription)
            .map(|l| l.id),
        get(db, source, event_id)?,
    ) else {
        return Ok(SkipOutcome::NotFound);
    };
    let skipped = db.query(
        &format!(
            "WITH moved AS (
                UPDATE event_state
                   SET status = 'completed', outcome = 'skipped', completed_at = {NOW_MS},
                       finished_at = {NOW_MS}, next_attempt_at = NULL, last_error = NULL,
                       attempts = attempts + 1
                 WHERE seq = $1 AND sub = $2 AND status IN ('failed', 'pending')
                RETURNING seq, sub, attempts
             )
             INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at,
                                         finished_at, result, error)
             SELECT seq, sub, attempts, 'ops', {NOW_MS}, {NOW_MS}, 'ok', $3 FROM moved
             RETURNING attempt"
        ),
        &[&event.seq, &sub, &SKIPPED_BY_OPS],
    )?;
    if skipped.is_empty() {
        let status = db.query(
            "SELECT status FROM event_state WHERE seq = $1 AND sub = $2",
            &[&event.seq, &sub],
        )?;
        let status: Option<String> = status.first().map(|r| r.try_get(0)).transpose()?;
        return Ok(match status.as_deref().and_then(Status::parse) {
            Some(status) => SkipOutcome::Refused(status),
            None => SkipOutcome::NotFound,
        });
    }
    let Some(mut event) = get(db, source, event_id)? else {
        return Ok(SkipOutcome::NotFound);
    };
    fill_subscriptions(db, &routes.live, std::slice::from_mut(&mut event))?;
    Ok(SkipOutcome::Skipped(Box::new(event)))
}

/// The first failed state of each key of `subscription`, with how many wait behind it.
pub(super) fn held_keys(
    db: &mut Db<'_>,
    routes: &Routes,
    subscription: &str,
    limit: usize,
) -> StoreResult<Vec<HeldKey>> {
    let Some(sub) = routes
        .live
        .iter()
        .find(|l| l.name == subscription)
        .map(|l| l.id)
    else {
        return Ok(Vec::new());
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    db.query(
        "SELECT s.order_key, l.source, l.event_id, s.finished_at,
                (SELECT count(*) FROM event_state w
                  WHERE w.sub = s.sub AND w.order_key = s.order_key
                    AND w.order_key IS NOT NULL AND w.status <> 'completed' AND w.seq > s.seq)
           FROM event_state s JOIN event_log l ON l.seq = s.seq
          WHERE s.status = 'failed' AND s.sub = $1 AND s.order_key IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM event_state e
                             WHERE e.sub = s.sub AND e.order_key = s.order_key
                               AND e.order_key IS NOT NULL AND e.status <> 'completed'
                               AND e.status = 'failed' AND e.seq < s.seq)
          ORDER BY s.seq LIMIT $2",
        &[&sub, &limit],
    )?
    .iter()
    .map(|r| {
        Ok(HeldKey {
            key: r.try_get(0)?,
            source: r.try_get(1)?,
            event_id: r.try_get(2)?,
            failed_at: r.try_get(3)?,
            waiting: r.try_get(4)?,
        })
    })
    .collect()
}
