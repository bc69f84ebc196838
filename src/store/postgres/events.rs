//! Reading events for ops, and the ops transitions (retry).

use postgres::types::ToSql;

use super::rows::{self, EVENT_COLUMNS};
use super::session::Db;
use super::{NOW_MS, QUEUED_CHANNEL};
use crate::store::rules;
use crate::store::{
    EventDetail, EventFilter, EventRecord, ExportedEvent, Page, RetryOutcome, Status, StatusCounts,
    StoreResult,
};

type Values = Vec<Box<dyn ToSql + Sync>>;

fn get(db: &mut Db<'_>, source: &str, event_id: &str) -> StoreResult<Option<EventRecord>> {
    db.query_opt(
        &format!("SELECT {EVENT_COLUMNS} FROM events WHERE source = $1 AND event_id = $2"),
        &[&source, &event_id],
    )?
    .map(|r| rows::event(&r))
    .transpose()
}

pub(super) fn detail(
    db: &mut Db<'_>,
    source: &str,
    event_id: &str,
) -> StoreResult<Option<EventDetail>> {
    let Some(event) = get(db, source, event_id)? else {
        return Ok(None);
    };
    let payload_sha256: Vec<u8> = db
        .query_one(
            "SELECT payload_sha256 FROM events WHERE seq = $1",
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
            "SELECT attempt, worker, started_at, finished_at, result, error
               FROM event_attempts WHERE event_seq = $1 ORDER BY attempt",
            &[&event.seq],
        )?
        .iter()
        .map(rows::attempt)
        .collect::<StoreResult<Vec<_>>>()?;
    let mut history = history;
    let name = super::subscriptions::name_of(&event.source, &event.event_type);
    for attempt in &mut history {
        attempt.subscription = name.into();
    }
    Ok(Some(EventDetail {
        event,
        payload_sha256,
        payload,
        content_type,
        history,
    }))
}

/// `WHERE` clauses and their values for a filter; `extra` is ANDed in.
fn where_clause(filter: &EventFilter, extra: &[&str], values: &mut Values) -> String {
    let mut clauses: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    clauses.push(if filter.purged {
        "purged_at IS NOT NULL".into()
    } else {
        "purged_at IS NULL".into()
    });
    let mut push = |clause: &str, value: Box<dyn ToSql + Sync>| {
        values.push(value);
        clauses.push(clause.replace('?', &format!("${}", values.len())));
    };
    if let Some(s) = filter.status {
        push("status = ?", Box::new(s.as_str()));
    }
    if let Some(name) = &filter.subscription {
        let id = super::subscriptions::id_of(name).unwrap_or(0);
        push(
            &format!("{} = ?", super::subscriptions::SUB_OF),
            Box::new(id),
        );
    }
    if let Some(s) = &filter.source {
        push("source = ?", Box::new(s.clone()));
    }
    if let Some(t) = &filter.event_type {
        push("event_type = ?", Box::new(t.clone()));
    }
    if let Some(t) = filter.received_after {
        push("received_at > ?", Box::new(t));
    }
    if let Some(t) = filter.received_before {
        push("received_at < ?", Box::new(t));
    }
    clauses.join(" AND ")
}

fn refs(values: &Values) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|v| v.as_ref()).collect()
}

/// Newest first by `seq`. The cursor is the last `seq` seen: an event that existed at the
/// first page keeps its `seq`, so walking downwards never repeats or skips it.
pub(super) fn list(
    db: &mut Db<'_>,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<EventRecord>> {
    let rows = page_query(db, filter, page, EVENT_COLUMNS, "events")?;
    rows::events(&rows)
}

/// A page with the stored bodies; the payload columns follow the event's.
pub(super) fn export(
    db: &mut Db<'_>,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<ExportedEvent>> {
    let columns = format!("{EVENT_COLUMNS}, payload, content_type");
    let rows = page_query(
        db,
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
    filter: &EventFilter,
    page: Page,
    columns: &str,
    from: &str,
) -> StoreResult<Vec<postgres::Row>> {
    let mut values = Values::new();
    let mut clause = where_clause(filter, &[], &mut values);
    if let Some(before) = page.before_seq {
        values.push(Box::new(before));
        clause = format!("{clause} AND seq < ${}", values.len());
    }
    values.push(Box::new(i64::try_from(page.limit).unwrap_or(i64::MAX)));
    let sql = format!(
        "SELECT {columns} FROM {from} WHERE {clause} ORDER BY seq DESC LIMIT ${}",
        values.len()
    );
    db.query(&sql, &refs(&values))
}

/// The counts `/metrics` reports, in one statement (one snapshot). Pending, claimed and failed
/// are read from their partial indexes; `completed` is the rest of a count of every row.
const STATUS_COUNTS: &str = "SELECT
    (SELECT count(*) FROM events),
    (SELECT count(*) FROM events WHERE status = 'pending'),
    (SELECT count(*) FROM events WHERE status = 'claimed'),
    (SELECT count(*) FROM events WHERE status = 'failed'),
    (SELECT min(next_attempt_at) FROM events WHERE status IN ('pending', 'claimed'))";

pub(super) fn status_counts(db: &mut Db<'_>) -> StoreResult<StatusCounts> {
    let r = db.query_one(STATUS_COUNTS, &[])?;
    let (all, pending, claimed, failed): (i64, i64, i64, i64) =
        (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
    Ok(StatusCounts {
        pending,
        claimed,
        completed: all - pending - claimed - failed,
        failed,
        oldest_due_at: r.try_get(4)?,
    })
}

const MINUTE_MS: i64 = 60_000;

/// Events newest first by `seq`, read through a portal a chunk at a time, stopping at the
/// first received before `since`: the cost is the window's events, not the table's.
pub(super) fn received_per_minute(db: &mut Db<'_>, since: i64) -> StoreResult<Vec<(i64, i64)>> {
    let mut minutes: Vec<(i64, i64)> = Vec::new();
    db.walk(
        "SELECT received_at FROM events ORDER BY seq DESC",
        &[],
        512,
        |row| {
            let received_at: i64 = row.try_get(0)?;
            if received_at < since {
                return Ok(false);
            }
            let minute = received_at - received_at.rem_euclid(MINUTE_MS);
            match minutes.iter_mut().rev().find(|(m, _)| *m == minute) {
                Some((_, n)) => *n += 1,
                None => minutes.push((minute, 1)),
            }
            Ok(true)
        },
    )?;
    minutes.sort_unstable();
    Ok(minutes)
}

/// The SET list of a retry: due now (the database's clock), a fresh budget, no outcome.
fn retry_set() -> String {
    format!(
        "status = 'pending', next_attempt_at = {NOW_MS}, budget_floor = attempts, \
         completed_at = NULL, outcome = NULL, abandoned = false"
    )
}

/// The retry of one event, decided by [`rules::may_retry_event`] on the row as it is inside
/// this transaction: read `FOR UPDATE`, so that no other node changes it in between, and
/// fenced on the status it was read with all the same.
pub(super) fn retry(
    db: &mut Db<'_>,
    source: &str,
    event_id: &str,
    subscription: Option<&str>,
    force: bool,
    _now: i64,
) -> StoreResult<RetryOutcome> {
    let Some(row) = db.query_opt(
        &format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE source = $1 AND event_id = $2 FOR UPDATE"
        ),
        &[&source, &event_id],
    )?
    else {
        return Ok(RetryOutcome::NotFound);
    };
    let event = rows::event(&row)?;
    let handled_by = super::subscriptions::name_of(&event.source, &event.event_type);
    if subscription.is_some_and(|name| name != handled_by) {
        return Ok(RetryOutcome::NotFound);
    }
    if let Err(refusal) = rules::may_retry_event(&event, force) {
        return Ok(refusal.answer(event));
    }
    let sql = format!(
        "UPDATE events SET {} WHERE seq = $1 AND status = $2 RETURNING {EVENT_COLUMNS}",
        retry_set()
    );
    let row = db.query_one(&sql, &[&event.seq, &event.status.as_str()])?;
    db.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))?;
    Ok(RetryOutcome::Retried(rows::event(&row)?))
}

/// Bulk retry: failed events matching the filter that [`rules::may_retry`] lets go without
/// `force` (abandoned ones each need a deliberate forced retry). Candidates are locked as they
/// are read.
pub(super) fn retry_failed(db: &mut Db<'_>, filter: &EventFilter, _now: i64) -> StoreResult<usize> {
    let mut values = Values::new();
    let filter = EventFilter {
        status: None,
        purged: false,
        ..filter.clone()
    };
    let clause = where_clause(&filter, &["status = 'failed'"], &mut values);
    let candidates = db.query(
        &format!(
            "SELECT seq, abandoned, purged_at IS NOT NULL FROM events WHERE {clause}
              ORDER BY seq FOR UPDATE"
        ),
        &refs(&values),
    )?;
    let update = format!(
        "UPDATE events SET {} WHERE seq = $1 AND status = 'failed'",
        retry_set()
    );
    let mut retried = 0;
    for row in &candidates {
        let (seq, abandoned, purged): (i64, bool, bool) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        if rules::may_retry(Status::Failed, abandoned, purged, false).is_ok() {
            retried += db.execute(&update, &[&seq])? as usize;
        }
    }
    if retried > 0 {
        db.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))?;
    }
    Ok(retried)
}
