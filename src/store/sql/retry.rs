//! The ops transitions of failed (or finished) work, on either store: the retry of one event
//! and the bulk retry (a recover).

use super::view::{fill_subscriptions, get};
use super::{Conn, Dialect, Params, Value};
use crate::store::routes::Live;
use crate::store::rules::{self, RetryPlan, StateRow};
use crate::store::{EventFilter, RetryOutcome, Status, StoreError, StoreResult};

/// The retry of state `seq`, `sub` if it is still `status`: due now, a fresh budget
/// (`budget_floor = attempts`), no outcome. Rows changed.
fn retry_state<C: Conn>(
    conn: &mut C,
    (seq, sub): (i64, i64),
    status: Status,
    now: i64,
) -> StoreResult<u64> {
    let mut p = Params::<C::Dialect>::default();
    let sql = format!(
        "UPDATE event_state SET status = 'pending', next_attempt_at = {}, \
                budget_floor = attempts, completed_at = NULL, outcome = NULL, abandoned = {}
          WHERE seq = {} AND sub = {} AND status = {}",
        C::Dialect::due_now(&mut p, now),
        C::Dialect::NONE,
        p.bind(Value::Int(seq)),
        p.bind(Value::Int(sub)),
        p.bind(Value::Text(status.as_str().into())),
    );
    conn.execute(&sql, &p.values)
}

/// The retry of one event, decided by [`rules::plan_retry`] on its states as they are inside
/// this transaction (SQLite's write transaction is alone; PostgreSQL's reads them `FOR
/// UPDATE`), and fenced on the status they were read with all the same. With a subscription,
/// its state; without, each failed state of the event, or, when none failed, the event's
/// summary decides (a completed one is run again in each subscription, with `force`).
#[allow(clippy::too_many_arguments)]
pub fn retry<C: Conn>(
    conn: &mut C,
    live: &[Live],
    source: &str,
    event_id: &str,
    sub: Option<i64>,
    force: bool,
    now: i64,
) -> StoreResult<RetryOutcome> {
    let Some(event) = get(conn, source, event_id)? else {
        return Ok(RetryOutcome::NotFound);
    };
    let states: Vec<StateRow> = conn
        .query(
            &format!(
                "SELECT s.sub, s.status, s.abandoned, s.purged_at IS NOT NULL
                   FROM event_state s JOIN subscriptions u ON u.id = s.sub
                  WHERE s.seq = ?1 AND u.removed_at IS NULL ORDER BY s.sub {}",
                C::Dialect::lock("s")
            ),
            &[Value::Int(event.seq)],
        )?
        .iter()
        .map(|r| {
            Ok(StateRow {
                sub: r.int(0)?,
                status: Status::parse(&r.text(1)?).unwrap_or(Status::Pending),
                abandoned: r.bool(2)?,
                purged: r.bool(3)?,
            })
        })
        .collect::<StoreResult<_>>()?;
    let mut event = event;
    let targets = match rules::plan_retry(&event, &states, sub, force) {
        RetryPlan::Retry(targets) => targets,
        RetryPlan::NotFound => return Ok(RetryOutcome::NotFound),
        RetryPlan::Refuse(refusal) => {
            fill_subscriptions(conn, live, std::slice::from_mut(&mut event))?;
            return Ok(refusal.answer(event));
        }
    };
    if let Some(held) = later_in_flight(conn, event.seq, &targets)? {
        fill_subscriptions(conn, live, std::slice::from_mut(&mut event))?;
        return Ok(RetryOutcome::KeyInFlight(event, held));
    }
    for t in &targets {
        // The states are the transaction's since the read above: the fence cannot miss.
        if retry_state(conn, (event.seq, t.sub), t.status, now)? != 1 {
            return Err(StoreError::Internal(anyhow::anyhow!(
                "the retry of {source}/{event_id} changed no row inside its own transaction"
            )));
        }
    }
    conn.queued()?;
    let Some(mut retried) = get(conn, source, event_id)? else {
        return Err(StoreError::Internal(anyhow::anyhow!(
            "{source}/{event_id} vanished inside its own retry"
        )));
    };
    fill_subscriptions(conn, live, std::slice::from_mut(&mut retried))?;
    Ok(RetryOutcome::Retried(retried))
}

/// The event in flight after `seq` in the key of one of `targets` (ordered subscriptions
/// only): a retry now would run beside it. The key's later unfinished states are read (and
/// on PostgreSQL locked): a claim of one of them under way is waited for (and then read as
/// claimed), and one that comes later skips the locked rows until this retry has committed,
/// after which the retried state, pending and earlier, holds them back.
fn later_in_flight<C: Conn>(
    conn: &mut C,
    seq: i64,
    targets: &[StateRow],
) -> StoreResult<Option<(String, String)>> {
    let sql = format!(
        "SELECT e.seq, e.status FROM event_state e
          WHERE e.sub = ?2 AND e.order_key IS NOT NULL AND e.seq > ?1
            AND e.order_key = (SELECT k.order_key FROM event_state k
                                WHERE k.seq = ?1 AND k.sub = ?2)
            AND e.status <> 'completed'
          ORDER BY e.seq {}",
        C::Dialect::lock("e")
    );
    for t in targets {
        for r in conn.query(&sql, &[Value::Int(seq), Value::Int(t.sub)])? {
            if r.text(1)? == "claimed" {
                let held = conn.query_one(
                    "SELECT source, event_id FROM event_log WHERE seq = ?1",
                    &[Value::Int(r.int(0)?)],
                )?;
                return Ok(Some((held.text(0)?, held.text(1)?)));
            }
        }
    }
    Ok(None)
}

/// Bulk retry: failed states of events matching the filter (in its subscription, or in any)
/// that [`rules::may_retry`] lets go without `force` (abandoned at-most-once events each need
/// a deliberate forced retry: the downstream may have acted), and whose ordering key has no
/// later event in flight. Tombstones are left out by the filter's `purged_at IS NULL` and by
/// the rule. Candidates are locked as they are read (PostgreSQL).
pub fn retry_failed<C: Conn>(
    conn: &mut C,
    live: &[Live],
    filter: &EventFilter,
    now: i64,
) -> StoreResult<usize> {
    let mut params = Params::<C::Dialect>::default();
    let sub = filter
        .subscription
        .as_deref()
        .map(|n| live.iter().find(|s| s.name == n));
    let Some(states) = super::failed_states(sub, filter, &mut params) else {
        return Ok(0);
    };
    let clause = super::events_where(None, &super::retry_events_filter(filter), &mut params);
    let candidates = conn.query(
        &format!(
            "SELECT s.seq, s.sub, s.abandoned, s.purged_at IS NOT NULL
               FROM event_state s {} JOIN subscriptions u ON u.id = s.sub
              WHERE s.status = 'failed' AND u.removed_at IS NULL {states}
                AND EXISTS (SELECT 1 FROM events e WHERE e.seq = s.seq AND {clause})
              ORDER BY s.seq, s.sub {}",
            C::Dialect::indexed_by("events_failed"),
            C::Dialect::lock("s")
        ),
        &params.values,
    )?;
    let mut retried = 0;
    for r in &candidates {
        let (seq, sub, abandoned, purged) = (r.int(0)?, r.int(1)?, r.bool(2)?, r.bool(3)?);
        if rules::may_retry(Status::Failed, abandoned, purged, false).is_err() {
            continue;
        }
        // A later event of an ordered key in flight: left failed (the single retry says why).
        if crate::store::routes::ordered(live, sub).is_some() {
            let state = StateRow {
                sub,
                status: Status::Failed,
                abandoned,
                purged,
            };
            if later_in_flight(conn, seq, std::slice::from_ref(&state))?.is_some() {
                continue;
            }
        }
        retried += retry_state(conn, (seq, sub), Status::Failed, now)? as usize;
    }
    if retried > 0 {
        conn.queued()?;
    }
    Ok(retried)
}
