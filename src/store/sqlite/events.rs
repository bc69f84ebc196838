//! Reading events for ops, and the ops transitions (retry).

use rusqlite::{Connection, OptionalExtension, Transaction, params, params_from_iter};

use super::rows::{self, EVENT_COLUMNS};
use super::subscriptions::{Routes, route_sql};
use crate::store::rules::{self, RetryPlan, StateRow};
use crate::store::sql;
use crate::store::{
    EventDetail, EventFilter, EventRecord, ExportedEvent, Page, RetryOutcome, Status, StatusCounts,
    StoreError, StoreResult, SubscriptionState,
};

pub(super) fn get(
    conn: &Connection,
    source: &str,
    event_id: &str,
) -> StoreResult<Option<EventRecord>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE source = ?1 AND event_id = ?2"
        ))?
        .query_row(params![source, event_id], rows::event)
        .optional()?)
}

pub(super) fn detail(
    conn: &Connection,
    routes: &Routes,
    source: &str,
    event_id: &str,
) -> StoreResult<Option<EventDetail>> {
    let Some(mut event) = get(conn, source, event_id)? else {
        return Ok(None);
    };
    fill_subscriptions(conn, routes, std::slice::from_mut(&mut event))?;
    // A tombstone has no body left (and no history).
    let (payload_sha256, payload, content_type) = conn
        .prepare_cached(
            "SELECT payload_sha256, payload, content_type FROM event_log WHERE seq = ?1",
        )?
        .query_row([event.seq], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, Option<Vec<u8>>>(1)?.unwrap_or_default(),
                r.get(2)?,
            ))
        })?;
    let history = conn
        .prepare_cached(
            "SELECT a.attempt, a.worker, a.started_at, a.finished_at, a.result, a.error,
                    u.name
               FROM event_attempts a JOIN subscriptions u ON u.id = a.sub
              WHERE a.event_seq = ?1 ORDER BY a.started_at, a.sub, a.attempt",
        )?
        .query_map(params![event.seq], rows::attempt)?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(EventDetail {
        event,
        payload_sha256,
        payload,
        content_type,
        history,
    }))
}

/// Each event's state in each subscription, in subscription order; an event not fanned out
/// yet (pending, no state row) shows as pending in each live subscription that will take it.
pub(super) fn fill_subscriptions(
    conn: &Connection,
    routes: &Routes,
    events: &mut [EventRecord],
) -> StoreResult<()> {
    let mut states = conn.prepare_cached(
        "SELECT u.name, s.status, s.attempts, s.outcome, s.last_error, s.abandoned,
                s.next_attempt_at, s.completed_at
           FROM event_state s JOIN subscriptions u ON u.id = s.sub
          WHERE s.seq = ?1 ORDER BY s.sub",
    )?;
    for event in events {
        event.subscriptions = states
            .query_map([event.seq], |r| {
                let status: String = r.get(1)?;
                Ok(SubscriptionState {
                    name: r.get(0)?,
                    status: Status::parse(&status).unwrap_or(Status::Pending),
                    attempts: r.get(2)?,
                    outcome: r.get(3)?,
                    last_error: r.get(4)?,
                    abandoned: r.get(5)?,
                    next_attempt_at: r.get(6)?,
                    completed_at: r.get(7)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
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

/// The events waiting for the fan-out (lane 0, after the cursor): how many, and when the first
/// was received. Counted from the log's numbering (no gaps: migration 0009) less the submitted
/// requests after the cursor (their own partial index), without reading the log.
pub(super) struct Unrouted {
    pub count: i64,
    pub oldest: Option<i64>,
}

pub(super) fn unrouted(conn: &Connection) -> StoreResult<Unrouted> {
    Ok(conn
        .prepare_cached(
            "SELECT (SELECT ifnull(max(seq), 0) FROM event_log) - q.after_seq
                    - (SELECT count(*) FROM event_log INDEXED BY event_log_requests
                        WHERE lane = 1 AND seq > q.after_seq),
                    (SELECT received_at FROM event_log WHERE seq > q.after_seq AND lane = 0
                      ORDER BY seq LIMIT 1)
               FROM queue_cursors q WHERE q.lane = 0",
        )?
        .query_row([], |r| {
            Ok(Unrouted {
                count: r.get(0)?,
                oldest: r.get(1)?,
            })
        })?)
}

/// The SQLite dialect of the shared ops statements ([`crate::store::sql`]).
pub(super) struct Dialect;

impl sql::Dialect for Dialect {
    fn param(n: usize) -> String {
        format!("?{n}")
    }
    const NONE: &'static str = "0";
    const WAITS: &'static str =
        "lane = 0 AND seq > (SELECT after_seq FROM queue_cursors WHERE lane = 0)";
    /// Named indexes, so that the planner cannot pick a scan of the state table.
    fn status_candidates(status: Status) -> Option<&'static str> {
        match status {
            Status::Failed => Some(
                "seq IN (SELECT seq FROM event_state INDEXED BY events_failed WHERE status = 'failed')",
            ),
            Status::Claimed => Some(
                "seq IN (SELECT seq FROM event_state INDEXED BY events_leases WHERE status = 'claimed')",
            ),
            Status::Pending => Some(
                "(seq IN (SELECT seq FROM event_state INDEXED BY events_due WHERE status = 'pending')
                  OR seq > (SELECT after_seq FROM queue_cursors WHERE lane = 0))",
            ),
            Status::Completed | Status::Stored => None,
        }
    }
    fn route_sql(route: &crate::subscriptions::Route, alias: &str) -> String {
        route_sql(route, alias)
    }
}

/// Newest first by `seq`. The cursor is the last `seq` seen: events committed later get larger
/// values, so walking downwards never repeats or skips an event that existed at the first page.
pub(super) fn list(
    conn: &Connection,
    routes: &Routes,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<EventRecord>> {
    let mut events = page_query(
        conn,
        routes,
        filter,
        page,
        EVENT_COLUMNS,
        "events",
        rows::event,
    )?;
    fill_subscriptions(conn, routes, &mut events)?;
    Ok(events)
}

/// A page with the stored bodies; the payload columns follow the event's.
pub(super) fn export(
    conn: &Connection,
    routes: &Routes,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<ExportedEvent>> {
    let columns = format!("{EVENT_COLUMNS}, payload, content_type");
    let from = "events JOIN event_payloads USING (seq)";
    page_query(conn, routes, filter, page, &columns, from, |r| {
        Ok(ExportedEvent {
            event: rows::event(r)?,
            payload: r.get(rows::EVENT_COLUMN_COUNT)?,
            content_type: r.get(rows::EVENT_COLUMN_COUNT + 1)?,
        })
    })
}

fn page_query<T>(
    conn: &Connection,
    routes: &Routes,
    filter: &EventFilter,
    page: Page,
    columns: &str,
    from: &str,
    map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> StoreResult<Vec<T>> {
    let mut params = sql::Params::<Dialect>::default();
    let sub = filter.subscription.as_deref().map(|n| routes.named(n));
    let sql = sql::events_page(sub, filter, page, (columns, from), &mut params);
    Ok(conn
        .prepare_cached(&sql)?
        .query_map(params_from_iter(params.values), map)?
        .collect::<Result<Vec<_>, _>>()?)
}

/// The counts `/metrics` reports, read in one statement (one snapshot), as subscription
/// states (an event taken by two subscriptions counts in each). Each status but `completed` is
/// counted where it lives, so a scrape costs what is claimed or failed, not the whole history:
/// pending state rows in the partial index `events_due`; events not fanned out yet (pending in
/// every subscription that will take them, counted once) as the length of the log after the
/// cursor (migration `0009`: the log's `seq` has no gaps there) less the submitted requests
/// there, with no read of the log itself; claims and failures in their partial indexes;
/// `completed` is the rest of a `count(*)` of the state rows, which SQLite answers from the
/// pages of their key. The lag is when the longest-waiting unfinished work became due: the
/// first due time of each subscription's index range, of the first event after the cursor (its
/// receipt), and of the few claimed events. A pending event waiting on its backoff has a due
/// time in the future and so adds no lag.
///
/// `listen` sessions (origin `session`) are left out of the pending count and the lag: their
/// pending rows are counted apart, each session's index range (`session_pending`, taken off
/// `pending` by [`status_counts`]), and the lag reads only the other subscriptions' ranges and
/// claims (a claim's row is read for its due time anyway). Their claims and failures stay in
/// those counts: leaving them out would read the row of each one, for few rows that a session
/// holds only while it runs.
pub const STATUS_COUNTS: &str = "SELECT
    (SELECT count(*) FROM event_state),
    (SELECT count(*) FROM event_state INDEXED BY events_due WHERE status = 'pending'),
    (SELECT ifnull(max(seq), 0) FROM event_log) - q.after_seq
      - (SELECT count(*) FROM event_log INDEXED BY event_log_requests
          WHERE lane = 1 AND seq > q.after_seq),
    (SELECT count(*) FROM event_state INDEXED BY events_leases WHERE status = 'claimed'),
    (SELECT count(*) FROM event_state INDEXED BY events_failed WHERE status = 'failed'),
    (SELECT min(due) FROM (
        SELECT (SELECT min(next_attempt_at) FROM event_state INDEXED BY events_due
                 WHERE status = 'pending' AND sub = u.id) AS due
          FROM subscriptions u WHERE u.origin <> 'session'
        UNION ALL
        SELECT received_at FROM (SELECT received_at FROM event_log
                                  WHERE seq > q.after_seq AND lane = 0 ORDER BY seq LIMIT 1)
        UNION ALL
        SELECT min(s.next_attempt_at) FROM event_state AS s INDEXED BY events_leases
         WHERE s.status = 'claimed'
           AND NOT EXISTS (SELECT 1 FROM subscriptions u
                            WHERE u.id = s.sub AND u.origin = 'session'))),
    (SELECT ifnull(sum((SELECT count(*) FROM event_state INDEXED BY events_due
                         WHERE status = 'pending' AND sub = u.id)), 0)
       FROM subscriptions u WHERE u.origin = 'session')
  FROM queue_cursors AS q WHERE q.lane = 0";

pub(super) fn status_counts(conn: &Connection) -> StoreResult<StatusCounts> {
    let (states, pending, waiting, claimed, failed, oldest, session_pending): (
        i64,
        i64,
        i64,
        i64,
        i64,
        Option<i64>,
        i64,
    ) = conn.prepare_cached(STATUS_COUNTS)?.query_row([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
        ))
    })?;
    Ok(StatusCounts {
        pending: pending - session_pending + waiting,
        claimed,
        completed: states - pending - claimed - failed,
        failed,
        oldest_due_at: oldest,
        fan_out_waiting: waiting,
    })
}

/// The SET list of a retry: due now, a fresh budget (`budget_floor = attempts`), no outcome.
const RETRY_SET: &str = "status = 'pending', next_attempt_at = ?, budget_floor = attempts, \
     completed_at = NULL, outcome = NULL, abandoned = 0";

/// The retry of one event, decided by [`rules::may_retry_event`] on each state it retries, as
/// it is inside this write transaction (`BEGIN IMMEDIATE`: no other writer can change it in
/// between), and fenced on the status it was read with all the same. With a subscription, its
/// state; without, each failed state of the event, or, when none failed, the event's summary
/// decides (a completed one is run again in each subscription, with `force`).
pub(super) fn retry(
    tx: &Transaction<'_>,
    routes: &Routes,
    source: &str,
    event_id: &str,
    sub: Option<i64>,
    force: bool,
    now: i64,
) -> StoreResult<RetryOutcome> {
    let Some(event) = get(tx, source, event_id)? else {
        return Ok(RetryOutcome::NotFound);
    };
    let states: Vec<StateRow> = tx
        .prepare_cached(
            "SELECT s.sub, s.status, s.abandoned, s.purged_at IS NOT NULL
               FROM event_state s JOIN subscriptions u ON u.id = s.sub
              WHERE s.seq = ?1 AND u.removed_at IS NULL ORDER BY s.sub",
        )?
        .query_map([event.seq], |r| {
            let status: String = r.get(1)?;
            Ok(StateRow {
                sub: r.get(0)?,
                status: Status::parse(&status).unwrap_or(Status::Pending),
                abandoned: r.get(2)?,
                purged: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    let targets = match rules::plan_retry(&event, &states, sub, force) {
        RetryPlan::Retry(targets) => targets,
        RetryPlan::NotFound => return Ok(RetryOutcome::NotFound),
        RetryPlan::Refuse(refusal) => {
            let mut event = event;
            fill_subscriptions(tx, routes, std::slice::from_mut(&mut event))?;
            return Ok(refusal.answer(event));
        }
    };
    if let Some(held) = later_in_flight(tx, event.seq, &targets)? {
        let mut event = event;
        fill_subscriptions(tx, routes, std::slice::from_mut(&mut event))?;
        return Ok(RetryOutcome::KeyInFlight(event, held));
    }
    let sql = format!(
        "UPDATE event_state SET {} WHERE seq = ?2 AND sub = ?3 AND status = ?4",
        RETRY_SET.replace('?', "?1")
    );
    let mut update = tx.prepare_cached(&sql)?;
    for t in &targets {
        // The write lock is held since the read above: the fence cannot miss.
        if update.execute(params![now, event.seq, t.sub, t.status.as_str()])? != 1 {
            return Err(StoreError::Internal(anyhow::anyhow!(
                "the retry of {source}/{event_id} changed no row inside its own transaction"
            )));
        }
    }
    let Some(mut retried) = get(tx, source, event_id)? else {
        return Err(StoreError::Internal(anyhow::anyhow!(
            "{source}/{event_id} vanished inside its own retry"
        )));
    };
    fill_subscriptions(tx, routes, std::slice::from_mut(&mut retried))?;
    Ok(RetryOutcome::Retried(retried))
}

/// The event in flight after `seq` in the key of one of `targets` (ordered subscriptions
/// only): a retry now would run beside it. Read inside the retry's write transaction.
fn later_in_flight(
    tx: &Transaction<'_>,
    seq: i64,
    targets: &[StateRow],
) -> StoreResult<Option<(String, String)>> {
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT l.source, l.event_id FROM event_state e JOIN event_log l ON l.seq = e.seq
          WHERE e.sub = ?2 AND e.order_key = ({KEY_OF}) AND e.order_key IS NOT NULL
            AND e.seq > ?1 AND e.status = 'claimed'
          ORDER BY e.seq LIMIT 1"
    ))?;
    for t in targets {
        if let Some(held) = stmt
            .query_row(params![seq, t.sub], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?
        {
            return Ok(Some(held));
        }
    }
    Ok(None)
}

/// The order key of the state (?1 seq, ?2 sub).
const KEY_OF: &str = "SELECT k.order_key FROM event_state k WHERE k.seq = ?1 AND k.sub = ?2";

/// Bulk retry: failed states of events matching the filter (in its subscription, or in any)
/// that [`rules::may_retry`] lets go without `force` (abandoned at-most-once events each need a
/// deliberate forced retry: the downstream may have acted). Tombstones are left out by the
/// filter's `purged_at IS NULL` and by the rule.
pub(super) fn retry_failed(
    tx: &Transaction<'_>,
    routes: &Routes,
    filter: &EventFilter,
    now: i64,
) -> StoreResult<usize> {
    let mut params = sql::Params::<Dialect>::default();
    let sub = filter.subscription.as_deref().map(|n| routes.named(n));
    let Some(states) = sql::failed_states(sub, filter, &mut params) else {
        return Ok(0);
    };
    let clause = sql::events_where(None, &sql::retry_events_filter(filter), &mut params);
    let candidates = tx
        .prepare(&format!(
            "SELECT s.seq, s.sub, s.abandoned, s.purged_at IS NOT NULL
               FROM event_state s INDEXED BY events_failed JOIN subscriptions u ON u.id = s.sub
              WHERE s.status = 'failed' AND u.removed_at IS NULL {states}
                AND EXISTS (SELECT 1 FROM events e WHERE e.seq = s.seq AND {clause})"
        ))?
        .query_map(params_from_iter(params.values), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, bool>(2)?,
                r.get::<_, bool>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut update = tx.prepare_cached(&format!(
        "UPDATE event_state SET {} WHERE seq = ?2 AND sub = ?3 AND status = 'failed'",
        RETRY_SET.replace('?', "?1")
    ))?;
    let mut retried = 0;
    for (seq, sub, abandoned, purged) in candidates {
        if rules::may_retry(Status::Failed, abandoned, purged, false).is_ok()
            && !key_in_flight(tx, routes, seq, sub)?
        {
            retried += update.execute(params![now, seq, sub])?;
        }
    }
    Ok(retried)
}

/// Whether a bulk retry leaves this failed state as it is: a later event of its ordering key
/// is in flight (the single retry says which; see [`later_in_flight`]).
fn key_in_flight(tx: &Transaction<'_>, routes: &Routes, seq: i64, sub: i64) -> StoreResult<bool> {
    if crate::store::routes::ordered(&routes.live, sub).is_none() {
        return Ok(false);
    }
    let state = StateRow {
        sub,
        status: Status::Failed,
        abandoned: false,
        purged: false,
    };
    Ok(later_in_flight(tx, seq, std::slice::from_ref(&state))?.is_some())
}
