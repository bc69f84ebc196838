//! Ordering per key, the ops half, on either store: skipping the event that holds a key, and
//! the held keys. (The key is read at the fan-out and the claims keep the order: per store.)

use super::view::{fill_subscriptions, get};
use super::{Conn, Dialect, Value};
use crate::store::routes::Live;
use crate::store::{HeldKey, SkipOutcome, Status, StoreResult};

/// What a skip records on the attempt it adds.
pub const SKIPPED_BY_OPS: &str = "skipped by ops: the later events of its key go on";

/// The event's state in `subscription` completed as `skipped`, with an attempt that says so:
/// from `failed` (the key's holder) or `pending` only.
pub fn skip(
    conn: &mut impl Conn,
    live: &[Live],
    source: &str,
    event_id: &str,
    subscription: &str,
    now: i64,
) -> StoreResult<SkipOutcome> {
    let (Some(sub), Some(event)) = (
        live.iter().find(|l| l.name == subscription).map(|l| l.id),
        get(conn, source, event_id)?,
    ) else {
        return Ok(SkipOutcome::NotFound);
    };
    let key = [Value::Int(event.seq), Value::Int(sub)];
    let skipped = conn.query_opt(
        "UPDATE event_state
            SET status = 'completed', outcome = 'skipped', completed_at = ?3,
                finished_at = ?3, next_attempt_at = NULL, last_error = NULL,
                attempts = attempts + 1
          WHERE seq = ?1 AND sub = ?2 AND status IN ('failed', 'pending')
         RETURNING attempts",
        &[key[0].clone(), key[1].clone(), Value::Int(now)],
    )?;
    let Some(skipped) = skipped else {
        let status = conn.query_opt(
            "SELECT status FROM event_state WHERE seq = ?1 AND sub = ?2",
            &key,
        )?;
        let status = status.map(|r| r.text(0)).transpose()?;
        return Ok(match status.as_deref().and_then(Status::parse) {
            Some(status) => SkipOutcome::Refused(status),
            None => SkipOutcome::NotFound,
        });
    };
    conn.execute(
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at, finished_at,
                                     result, error)
         VALUES (?1, ?2, ?3, 'ops', ?4, ?4, 'ok', ?5)",
        &[
            Value::Int(event.seq),
            Value::Int(sub),
            Value::Int(skipped.int(0)?),
            Value::Int(now),
            Value::Text(SKIPPED_BY_OPS.into()),
        ],
    )?;
    let Some(mut event) = get(conn, source, event_id)? else {
        return Ok(SkipOutcome::NotFound);
    };
    fill_subscriptions(conn, live, std::slice::from_mut(&mut event))?;
    Ok(SkipOutcome::Skipped(Box::new(event)))
}

/// The first failed state of each key of `subscription`, with how many wait behind it.
pub fn held_keys<C: Conn>(
    conn: &mut C,
    live: &[Live],
    subscription: &str,
    limit: usize,
) -> StoreResult<Vec<HeldKey>> {
    let Some(sub) = live.iter().find(|l| l.name == subscription).map(|l| l.id) else {
        return Ok(Vec::new());
    };
    let ordered = C::Dialect::indexed_by("events_ordered");
    let failed = C::Dialect::indexed_by("events_failed");
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    conn.query(
        &format!(
            "SELECT s.order_key, l.source, l.event_id, s.finished_at,
                    (SELECT count(*) FROM event_state w {ordered}
                      WHERE w.sub = s.sub AND w.order_key = s.order_key
                        AND w.order_key IS NOT NULL AND w.status <> 'completed'
                        AND w.seq > s.seq)
               FROM event_state s {failed} JOIN event_log l ON l.seq = s.seq
              WHERE s.status = 'failed' AND s.sub = ?1 AND s.order_key IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM event_state e {ordered}
                                 WHERE e.sub = s.sub AND e.order_key = s.order_key
                                   AND e.order_key IS NOT NULL AND e.status <> 'completed'
                                   AND e.status = 'failed' AND e.seq < s.seq)
              ORDER BY s.seq LIMIT ?2"
        ),
        &[Value::Int(sub), Value::Int(limit)],
    )?
    .iter()
    .map(|r| {
        Ok(HeldKey {
            key: r.text(0)?,
            source: r.text(1)?,
            event_id: r.text(2)?,
            failed_at: r.opt_int(3)?,
            waiting: r.int(4)?,
        })
    })
    .collect()
}
