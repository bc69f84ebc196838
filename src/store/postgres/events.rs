//! Reading events for ops, and the ops transitions (retry).

use super::rows::{self, EVENT_COLUMNS};
use super::session::Db;
use super::subscriptions::Routes;
use super::{NOW_MS, QUEUED_CHANNEL};
use crate::store::rules::{self, RetryPlan, StateRow};
use crate::store::sql;
use crate::store::{
    EventDetail, EventFilter, EventRecord, ExportedEvent, Page, RetryOutcome, Status, StatusCounts,
    StoreError, StoreResult, SubscriptionState,
};

pub(super) fn get(
    db: &mut Db<'_>,
    source: &str,
    event_id: &str,
) -> StoreResult<Option<EventRecord>> {
    db.query_opt(
        &format!("SELECT {EVENT_COLUMNS} FROM events WHERE source = $1 AND event_id = $2"),
        &[&source, &event_id],
    )?
    .map(|r| rows::event(&r))
    .transpose()
}

pub(super) fn detail(
    db: &mut Db<'_>,
    routes: &Routes,
    source: &str,
    event_id: &str,
) -> StoreResult<Option<EventDetail>> {
    let Some(mut event) = get(db, source, event_id)? else {
        return Ok(None);
    };
    fill_subscriptions(db, routes, std::slice::from_mut(&mut event))?;
    let payload_sha256: Vec<u8> = db
        .query_one(
            "SELECT payload_sha256 FROM event_log WHERE seq = $1",
            &[&event.seq],
        )?
        .try_get(0)?;
    // A tombstone has no body left (and no history).
    let (payload, content_type) = match db.query_opt(
        "SELECT payload, content_type FROM event_payloads WHERE seq = $1",
        &[&event.seq],
    )? {
        Some(r) => (r.try_get(0)?, r.try_get(1)?),
        None => (Vec::new(), None),
    };
    let history = db
        .query(
            "SELECT a.attempt, a.worker, a.started_at, a.finished_at, a.result, a.error, u.name
               FROM event_attempts a JOIN subscriptions u ON u.id = a.sub
              WHERE a.event_seq = $1 ORDER BY a.started_at, a.sub, a.attempt",
            &[&event.seq],
        )?
        .iter()
        .map(rows::attempt)
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Some(EventDetail {
        event,
        payload_sha256,
        payload,
        content_type,
        history,
    }))
}

/// Each event's state in each subscription; an event not fanned out yet shows as pending in
/// each live subscription that will take it.
pub(super) fn fill_subscriptions(
    db: &mut Db<'_>,
    routes: &Routes,
    events: &mut [EventRecord],
) -> StoreResult<()> {
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    let rows = db.query(
        "SELECT s.seq, u.name, s.status, s.attempts, s.outcome, s.last_error, s.abandoned,
                s.next_attempt_at, s.completed_at
           FROM event_state s JOIN subscriptions u ON u.id = s.sub
          WHERE s.seq = ANY($1) ORDER BY s.seq, s.sub",
        &[&seqs],
    )?;
    for event in events.iter_mut() {
        event.subscriptions.clear();
    }
    for r in &rows {
        let seq: i64 = r.try_get(0)?;
        let status: String = r.try_get(2)?;
        if let Some(event) = events.iter_mut().find(|e| e.seq == seq) {
            event.subscriptions.push(SubscriptionState {
                name: r.try_get(1)?,
                status: Status::parse(&status).unwrap_or(Status::Pending),
                attempts: r.try_get(3)?,
                outcome: r.try_get(4)?,
                last_error: r.try_get(5)?,
                abandoned: r.try_get(6)?,
                next_attempt_at: r.try_get(7)?,
                completed_at: r.try_get(8)?,
            });
        }
    }
    for event in events.iter_mut() {
        if event.subscriptions.is_empty() && event.status == Status::Pending {
            event.subscriptions = crate::store::routes::waiting_states(
                &routes.live,
                event.seq,
                &event.source,
                &event.event_type,
                event.received_at,
            );
        }
    }
    Ok(())
}

/// The PostgreSQL dialect of the shared ops statements ([`crate::store::sql`]).
pub(super) struct Dialect;

impl sql::Dialect for Dialect {
    fn param(n: usize) -> String {
        format!("${n}")
    }
    const NONE: &'static str = "false";
    const WAITS: &'static str = "(lane = 0 AND events.seq > (SELECT after_seq FROM queue_cursor))";
    /// The planner picks the partial indexes itself; pending has no narrower place (the log
    /// after the cursor is one too).
    fn status_candidates(status: Status) -> Option<&'static str> {
        match status {
            Status::Failed => Some("seq IN (SELECT seq FROM event_state WHERE status = 'failed')"),
            Status::Claimed => {
                Some("seq IN (SELECT seq FROM event_state WHERE status = 'claimed')")
            }
            Status::Pending | Status::Completed | Status::Stored => None,
        }
    }
    fn route_sql(route: &crate::subscriptions::Route, alias: &str) -> String {
        super::subscriptions::route_sql(route, alias)
    }
}

/// Newest first by `seq`. The cursor is the last `seq` seen: an event that existed at the
/// first page keeps its `seq`, so walking downwards never repeats or skips it.
pub(super) fn list(
    db: &mut Db<'_>,
    routes: &Routes,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<EventRecord>> {
    let rows = page_query(db, routes, filter, page, EVENT_COLUMNS, "events")?;
    let mut events = rows::events(&rows)?;
    fill_subscriptions(db, routes, &mut events)?;
    Ok(events)
}

/// A page with the stored bodies; the payload columns follow the event's.
pub(super) fn export(
    db: &mut Db<'_>,
    routes: &Routes,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<ExportedEvent>> {
    let columns = format!("{EVENT_COLUMNS}, payload, content_type");
    let rows = page_query(
        db,
        routes,
        filter,
        page,
        &columns,
        "events JOIN event_payloads USING (seq)",
    )?;
    rows.iter()
        .map(|r| {
            Ok(ExportedEvent {
                event: rows::event(r)?,
                payload: r.try_get(rows::EVENT_COLUMN_COUNT)?,
                content_type: r.try_get(rows::EVENT_COLUMN_COUNT + 1)?,
            })
        })
        .collect()
}

fn page_query(
    db: &mut Db<'_>,
    routes: &Routes,
    filter: &EventFilter,
    page: Page,
    columns: &str,
    from: &str,
) -> StoreResult<Vec<postgres::Row>> {
    let mut params = sql::Params::<Dialect>::default();
    let sub = filter.subscription.as_deref().map(|n| routes.named(n));
    let sql = sql::events_page(sub, filter, page, (columns, from), &mut params);
    db.query(&sql, &sql::pg_params(&params.values))
}

/// The events waiting for their fan-out (lane 0, after the cursor): how many, and when the
/// first was received. The cursor is a value (an init plan), so that the primary key's range
/// starts at it; as a join, the plan may walk the log from its first event.
pub(super) const WAITING: &str = "SELECT count(*), min(l.received_at) FROM event_log l
   WHERE l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursor)";

/// The counts `/metrics` reports, as subscription states, in one statement (one snapshot):
/// pending, claimed and failed from their partial indexes, the events not fanned out yet once
/// each, `completed` the rest of a count of every state row.
///
/// `listen` sessions (origin `session`) are left out of the pending count and the lag, as on
/// SQLite (`sqlite::STATUS_COUNTS`): their pending rows counted apart by each session's range
/// of `events_due`, the lag the first due time of every other subscription's range and of the
/// claims that are not a session's. Their claims and failures stay in those counts.
pub(super) const STATUS_COUNTS: &str = "SELECT
    (SELECT count(*) FROM event_state),
    (SELECT count(*) FROM event_state WHERE status = 'pending'),
    (SELECT count(*) FROM event_state WHERE status = 'claimed'),
    (SELECT count(*) FROM event_state WHERE status = 'failed'),
    (SELECT min(due) FROM (
        SELECT (SELECT min(s.next_attempt_at) FROM event_state s
                 WHERE s.status = 'pending' AND s.sub = u.id) AS due
          FROM subscriptions u WHERE u.origin <> 'session'
        UNION ALL
        SELECT min(s.next_attempt_at) FROM event_state s
         WHERE s.status = 'claimed'
           AND NOT EXISTS (SELECT 1 FROM subscriptions u
                            WHERE u.id = s.sub AND u.origin = 'session')) d),
    w.count, w.min,
    (SELECT coalesce(sum((SELECT count(*) FROM event_state s
                           WHERE s.status = 'pending' AND s.sub = u.id)), 0)::bigint
       FROM subscriptions u WHERE u.origin = 'session')
  FROM (SELECT count(*), min(l.received_at) FROM event_log l
         WHERE l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursor)) w";

pub(super) fn status_counts(db: &mut Db<'_>) -> StoreResult<StatusCounts> {
    let r = db.query_one(STATUS_COUNTS, &[])?;
    let (all, pending, claimed, failed): (i64, i64, i64, i64) =
        (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
    let (oldest, waiting, first): (Option<i64>, i64, Option<i64>) =
        (r.try_get(4)?, r.try_get(5)?, r.try_get(6)?);
    let session_pending: i64 = r.try_get(7)?;
    Ok(StatusCounts {
        pending: pending - session_pending + waiting,
        claimed,
        completed: all - pending - claimed - failed,
        failed,
        oldest_due_at: match (oldest, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        },
        fan_out_waiting: waiting,
    })
}

/// The SET list of a retry: due now (the database's clock), a fresh budget, no outcome.
fn retry_set() -> String {
    format!(
        "status = 'pending', next_attempt_at = {NOW_MS}, budget_floor = attempts, \
         completed_at = NULL, outcome = NULL, abandoned = false"
    )
}

/// The retry of one event (see the SQLite store's, which this follows): with a subscription,
/// its state; without, each failed state, or when none failed, the summary decides. The state
/// rows are read `FOR UPDATE`, so that no other node changes them in between, and the update
/// is fenced on the status they were read with all the same.
pub(super) fn retry(
    db: &mut Db<'_>,
    routes: &Routes,
    source: &str,
    event_id: &str,
    sub: Option<i64>,
    force: bool,
    _now: i64,
) -> StoreResult<RetryOutcome> {
    let Some(event) = get(db, source, event_id)? else {
        return Ok(RetryOutcome::NotFound);
    };
    let states: Vec<StateRow> = db
        .query(
            "SELECT s.sub, s.status, s.abandoned, s.purged_at IS NOT NULL
               FROM event_state s JOIN subscriptions u ON u.id = s.sub
              WHERE s.seq = $1 AND u.removed_at IS NULL ORDER BY s.sub FOR UPDATE OF s",
            &[&event.seq],
        )?
        .iter()
        .map(|r| {
            let status: String = r.try_get(1)?;
            Ok(StateRow {
                sub: r.try_get(0)?,
                status: Status::parse(&status).unwrap_or(Status::Pending),
                abandoned: r.try_get(2)?,
                purged: r.try_get(3)?,
            })
        })
        .collect::<StoreResult<_>>()?;
    let targets = match rules::plan_retry(&event, &states, sub, force) {
        RetryPlan::Retry(targets) => targets,
        RetryPlan::NotFound => return Ok(RetryOutcome::NotFound),
        RetryPlan::Refuse(refusal) => {
            let mut event = event;
            fill_subscriptions(db, routes, std::slice::from_mut(&mut event))?;
            return Ok(refusal.answer(event));
        }
    };
    if let Some(held) = later_in_flight(db, event.seq, &targets)? {
        let mut event = event;
        fill_subscriptions(db, routes, std::slice::from_mut(&mut event))?;
        return Ok(RetryOutcome::KeyInFlight(event, held));
    }
    let sql = format!(
        "UPDATE event_state SET {} WHERE seq = $1 AND sub = $2 AND status = $3",
        retry_set()
    );
    for t in &targets {
        if db.execute(&sql, &[&event.seq, &t.sub, &t.status.as_str()])? != 1 {
            return Err(StoreError::Internal(anyhow::anyhow!(
                "the retry of {source}/{event_id} changed no row inside its own transaction"
            )));
        }
    }
    db.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))?;
    let Some(mut retried) = get(db, source, event_id)? else {
        return Err(StoreError::Internal(anyhow::anyhow!(
            "{source}/{event_id} vanished inside its own retry"
        )));
    };
    fill_subscriptions(db, routes, std::slice::from_mut(&mut retried))?;
    Ok(RetryOutcome::Retried(retried))
}

/// The event in flight after `seq` in the key of one of `targets` (ordered subscriptions
/// only): a retry now would run beside it. The key's later unfinished states are locked as
/// they are read: a claim of one of them that is under way is waited for (and then read as
/// claimed), and one that comes later skips the locked rows (`SKIP LOCKED`) until this retry
/// has committed, after which the retried state, pending and earlier, holds them back.
fn later_in_flight(
    db: &mut Db<'_>,
    seq: i64,
    targets: &[StateRow],
) -> StoreResult<Option<(String, String)>> {
    for t in targets {
        let rows = db.query(
            "SELECT e.seq, e.status FROM event_state e
              WHERE e.sub = $2 AND e.order_key IS NOT NULL AND e.seq > $1
                AND e.order_key = (SELECT k.order_key FROM event_state k
                                    WHERE k.seq = $1 AND k.sub = $2)
                AND e.status <> 'completed'
              ORDER BY e.seq FOR UPDATE OF e",
            &[&seq, &t.sub],
        )?;
        for r in &rows {
            let status: String = r.try_get(1)?;
            if status == "claimed" {
                let held: i64 = r.try_get(0)?;
                let row = db.query_one(
                    "SELECT source, event_id FROM event_log WHERE seq = $1",
                    &[&held],
                )?;
                return Ok(Some((row.try_get(0)?, row.try_get(1)?)));
            }
        }
    }
    Ok(None)
}

/// Bulk retry: failed states of events matching the filter (in its subscription, or in any)
/// that [`rules::may_retry`] lets go without `force` (abandoned ones each need a deliberate
/// forced retry). Candidates are locked as they are read.
pub(super) fn retry_failed(
    db: &mut Db<'_>,
    routes: &Routes,
    filter: &EventFilter,
    _now: i64,
) -> StoreResult<usize> {
    let mut params = sql::Params::<Dialect>::default();
    let sub = filter.subscription.as_deref().map(|n| routes.named(n));
    let Some(states) = sql::failed_states(sub, filter, &mut params) else {
        return Ok(0);
    };
    let clause = sql::events_where(None, &sql::retry_events_filter(filter), &mut params);
    let candidates = db.query(
        &format!(
            "SELECT s.seq, s.sub, s.abandoned, s.purged_at IS NOT NULL
               FROM event_state s JOIN subscriptions u ON u.id = s.sub
              WHERE s.status = 'failed' AND u.removed_at IS NULL {states}
                AND s.seq IN (SELECT seq FROM events WHERE {clause})
              ORDER BY s.seq, s.sub FOR UPDATE OF s"
        ),
        &sql::pg_params(&params.values),
    )?;
    let update = format!(
        "UPDATE event_state SET {} WHERE seq = $1 AND sub = $2 AND status = 'failed'",
        retry_set()
    );
    let mut retried = 0;
    for row in &candidates {
        let (seq, sub, abandoned, purged): (i64, i64, bool, bool) = (
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
        );
        // A later event of an ordered key in flight: left failed (the single retry says why).
        let in_flight = crate::store::routes::ordered(&routes.live, sub).is_some() && {
            let state = StateRow {
                sub,
                status: Status::Failed,
                abandoned,
                purged,
            };
            later_in_flight(db, seq, std::slice::from_ref(&state))?.is_some()
        };
        if rules::may_retry(Status::Failed, abandoned, purged, false).is_ok() && !in_flight {
            retried += db.execute(&update, &[&seq, &sub])? as usize;
        }
    }
    if retried > 0 {
        db.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))?;
    }
    Ok(retried)
}
