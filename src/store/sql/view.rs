//! Events as ops read them, on either store: one event with its states, body and history, a
//! page of `GET /events`, an export's page with the bodies.

use super::{Conn, Dialect, Params, Row, Value};
use crate::store::routes::Live;
use crate::store::{
    AttemptRecord, EventDetail, EventFilter, EventRecord, ExportedEvent, Page, Status, StoreResult,
    SubscriptionState,
};

/// Columns in the order [`event_of`] reads them; prefix-free so it can follow `SELECT`.
pub const EVENT_COLUMNS: &str = "seq, source, event_id, event_type, status, attempts, \
     deliveries, payload_mismatches, received_at, last_delivered_at, next_attempt_at, \
     completed_at, outcome, last_error, abandoned, finished_at, purged_at";

const EVENT_COLUMN_COUNT: usize = 17;

fn status_of(r: &Row, i: usize) -> StoreResult<Status> {
    let status = r.text(i)?;
    // The CHECK constraint admits only the four statuses.
    Status::parse(&status)
        .ok_or_else(|| super::conn::internal(format!("unknown stored status {status}")))
}

pub fn event_of(r: &Row) -> StoreResult<EventRecord> {
    Ok(EventRecord {
        seq: r.int(0)?,
        source: r.text(1)?,
        event_id: r.text(2)?,
        event_type: r.text(3)?,
        status: status_of(r, 4)?,
        attempts: r.int(5)?,
        deliveries: r.int(6)?,
        payload_mismatches: r.int(7)?,
        received_at: r.int(8)?,
        last_delivered_at: r.int(9)?,
        next_attempt_at: r.opt_int(10)?,
        completed_at: r.opt_int(11)?,
        outcome: r.opt_text(12)?,
        last_error: r.opt_text(13)?,
        abandoned: r.bool(14)?,
        finished_at: r.opt_int(15)?,
        purged_at: r.opt_int(16)?,
        subscriptions: Vec::new(),
    })
}

pub fn get(conn: &mut impl Conn, source: &str, event_id: &str) -> StoreResult<Option<EventRecord>> {
    conn.query_opt(
        &format!("SELECT {EVENT_COLUMNS} FROM events WHERE source = ?1 AND event_id = ?2"),
        &[Value::Text(source.into()), Value::Text(event_id.into())],
    )?
    .as_ref()
    .map(event_of)
    .transpose()
}

/// The event with its states, its body and its history: `None` if there is no such event.
pub fn detail(
    conn: &mut impl Conn,
    live: &[Live],
    source: &str,
    event_id: &str,
) -> StoreResult<Option<EventDetail>> {
    let Some(mut event) = get(conn, source, event_id)? else {
        return Ok(None);
    };
    fill_subscriptions(conn, live, std::slice::from_mut(&mut event))?;
    // A tombstone has no body left (and no history).
    let body = conn.query_one(
        "SELECT l.payload_sha256, p.payload, p.content_type
           FROM event_log l LEFT JOIN event_payloads p ON p.seq = l.seq WHERE l.seq = ?1",
        &[Value::Int(event.seq)],
    )?;
    let history = conn
        .query(
            "SELECT a.attempt, a.worker, a.started_at, a.finished_at, a.result, a.error, u.name
               FROM event_attempts a JOIN subscriptions u ON u.id = a.sub
              WHERE a.event_seq = ?1 ORDER BY a.started_at, a.sub, a.attempt",
            &[Value::Int(event.seq)],
        )?
        .iter()
        .map(|r| {
            Ok(AttemptRecord {
                attempt: r.int(0)?,
                worker: r.text(1)?,
                started_at: r.int(2)?,
                finished_at: r.opt_int(3)?,
                result: r.opt_text(4)?,
                error: r.opt_text(5)?,
                subscription: r.text(6)?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Some(EventDetail {
        event,
        payload_sha256: body.bytes(0)?,
        payload: body.opt_bytes(1)?.unwrap_or_default(),
        content_type: body.opt_text(2)?,
        history,
    }))
}

/// Each event's state in each subscription, in subscription order, read in one statement; an
/// event not fanned out yet (pending, no state row) shows as pending in each live subscription
/// that will take it.
pub fn fill_subscriptions<C: Conn>(
    conn: &mut C,
    live: &[Live],
    events: &mut [EventRecord],
) -> StoreResult<()> {
    let seqs = Value::Ints(events.iter().map(|e| e.seq).collect());
    let rows = conn.query(
        &format!(
            "SELECT s.seq, u.name, s.status, s.attempts, s.outcome, s.last_error, s.abandoned,
                    s.next_attempt_at, s.completed_at
               FROM event_state s JOIN subscriptions u ON u.id = s.sub
              WHERE s.seq {} ORDER BY s.seq, s.sub",
            C::Dialect::in_list("?1")
        ),
        &[seqs],
    )?;
    for event in events.iter_mut() {
        event.subscriptions.clear();
    }
    for r in &rows {
        let seq = r.int(0)?;
        if let Some(event) = events.iter_mut().find(|e| e.seq == seq) {
            event.subscriptions.push(SubscriptionState {
                name: r.text(1)?,
                status: Status::parse(&r.text(2)?).unwrap_or(Status::Pending),
                attempts: r.int(3)?,
                outcome: r.opt_text(4)?,
                last_error: r.opt_text(5)?,
                abandoned: r.bool(6)?,
                next_attempt_at: r.opt_int(7)?,
                completed_at: r.opt_int(8)?,
            });
        }
    }
    for event in events.iter_mut() {
        if event.subscriptions.is_empty() && event.status == Status::Pending {
            event.subscriptions = crate::store::routes::waiting_states(
                live,
                event.seq,
                &event.source,
                &event.event_type,
                event.received_at,
            );
        }
    }
    Ok(())
}

/// Newest first by `seq`. The cursor is the last `seq` seen: events committed later get larger
/// values, so walking downwards never repeats or skips an event that existed at the first page.
pub fn list(
    conn: &mut impl Conn,
    live: &[Live],
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<EventRecord>> {
    let rows = page_query(conn, live, filter, page, EVENT_COLUMNS, "events")?;
    let mut events = rows.iter().map(event_of).collect::<StoreResult<Vec<_>>>()?;
    fill_subscriptions(conn, live, &mut events)?;
    Ok(events)
}

/// A page with the stored bodies; the payload columns follow the event's.
pub fn export(
    conn: &mut impl Conn,
    live: &[Live],
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<ExportedEvent>> {
    let columns = format!("{EVENT_COLUMNS}, payload, content_type");
    let from = "events JOIN event_payloads USING (seq)";
    page_query(conn, live, filter, page, &columns, from)?
        .iter()
        .map(|r| {
            Ok(ExportedEvent {
                event: event_of(r)?,
                payload: r.bytes(EVENT_COLUMN_COUNT)?,
                content_type: r.opt_text(EVENT_COLUMN_COUNT + 1)?,
            })
        })
        .collect()
}

fn page_query<C: Conn>(
    conn: &mut C,
    live: &[Live],
    filter: &EventFilter,
    page: Page,
    columns: &str,
    from: &str,
) -> StoreResult<Vec<Row>> {
    let mut params = Params::<C::Dialect>::default();
    let sub = filter
        .subscription
        .as_deref()
        .map(|n| live.iter().find(|s| s.name == n));
    let sql = super::events_page(sub, filter, page, (columns, from), &mut params);
    conn.query(&sql, &params.values)
}
