//! Reading events for ops, and the ops transitions (retry).

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Transaction, params, params_from_iter};

use super::rows::{self, EVENT_COLUMNS};
use crate::store::rules;
use crate::store::{
    EventDetail, EventFilter, EventRecord, ExportedEvent, Page, RetryOutcome, Status, StatusCounts,
    StoreError, StoreResult,
};

fn get(conn: &Connection, source: &str, event_id: &str) -> StoreResult<Option<EventRecord>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE source = ?1 AND event_id = ?2"
        ))?
        .query_row(params![source, event_id], rows::event)
        .optional()?)
}

pub(super) fn detail(
    conn: &Connection,
    source: &str,
    event_id: &str,
) -> StoreResult<Option<EventDetail>> {
    let Some(event) = get(conn, source, event_id)? else {
        return Ok(None);
    };
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
            "SELECT attempt, worker, started_at, finished_at, result, error
               FROM event_attempts WHERE event_seq = ?1 ORDER BY attempt",
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

/// `WHERE` clauses and their values for a filter; `extra` is ANDed in.
fn where_clause(filter: &EventFilter, extra: &[&str], values: &mut Vec<Value>) -> String {
    let mut clauses: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    clauses.push(if filter.purged {
        "purged_at IS NOT NULL".into()
    } else {
        "purged_at IS NULL".into()
    });
    let mut push = |clause: &str, value: Value| {
        values.push(value);
        clauses.push(clause.replace('?', &format!("?{}", values.len())));
    };
    if let Some(s) = filter.status {
        push("status = ?", Value::Text(s.as_str().into()));
    }
    if let Some(s) = &filter.source {
        push("source = ?", Value::Text(s.clone()));
    }
    if let Some(t) = &filter.event_type {
        push("event_type = ?", Value::Text(t.clone()));
    }
    if let Some(t) = filter.received_after {
        push("received_at > ?", Value::Integer(t));
    }
    if let Some(t) = filter.received_before {
        push("received_at < ?", Value::Integer(t));
    }
    clauses.join(" AND ")
}

/// Newest first by `seq`. The cursor is the last `seq` seen: events committed later get larger
/// values, so walking downwards never repeats or skips an event that existed at the first page.
pub(super) fn list(
    conn: &Connection,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<EventRecord>> {
    page_query(conn, filter, page, EVENT_COLUMNS, "events", rows::event)
}

/// A page with the stored bodies; the payload columns follow the event's.
pub(super) fn export(
    conn: &Connection,
    filter: &EventFilter,
    page: Page,
) -> StoreResult<Vec<ExportedEvent>> {
    let columns = format!("{EVENT_COLUMNS}, payload, content_type");
    let from = "events JOIN event_payloads USING (seq)";
    page_query(conn, filter, page, &columns, from, |r| {
        Ok(ExportedEvent {
            event: rows::event(r)?,
            payload: r.get(rows::EVENT_COLUMN_COUNT)?,
            content_type: r.get(rows::EVENT_COLUMN_COUNT + 1)?,
        })
    })
}

fn page_query<T>(
    conn: &Connection,
    filter: &EventFilter,
    page: Page,
    columns: &str,
    from: &str,
    map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> StoreResult<Vec<T>> {
    let mut values = Vec::new();
    let mut clause = where_clause(filter, &[], &mut values);
    if let Some(before) = page.before_seq {
        values.push(Value::Integer(before));
        clause = format!("{clause} AND seq < ?{}", values.len());
    }
    values.push(Value::Integer(page.limit as i64));
    let sql = format!(
        "SELECT {columns} FROM {from} WHERE {clause} ORDER BY seq DESC LIMIT ?{}",
        values.len()
    );
    Ok(conn
        .prepare_cached(&sql)?
        .query_map(params_from_iter(values), map)?
        .collect::<Result<Vec<_>, _>>()?)
}

/// The counts `/metrics` reports, read in one statement (one snapshot). Each status but
/// `completed` is counted where it lives, so a scrape costs what is claimed or failed, not the
/// whole history: pending state rows in the partial index `events_due`; first attempts with no
/// state row yet as the length of the log after the cursor (migration `0009`: the log's `seq`
/// has no gaps there, and the only state rows after the cursor are submitted requests'),
/// with no read of the log itself; claims and failures in their partial indexes; `completed`
/// is the rest of a `count(*)`, which SQLite answers from the page headers of the log's key.
/// The lag is when the longest-waiting unfinished work became due: the first due time of each
/// lane's index range, of the first event after the cursor (its receipt), and of the few
/// claimed events. A pending event waiting on its backoff has a due time in the future and so
/// adds no lag.
pub const STATUS_COUNTS: &str = "SELECT
    (SELECT count(*) FROM event_log),
    (SELECT count(*) FROM event_state INDEXED BY events_due WHERE status = 'pending')
      + (SELECT ifnull(max(seq), 0) FROM event_log) - q.after_seq
      - (SELECT count(*) FROM event_state WHERE seq > q.after_seq),
    (SELECT count(*) FROM event_state INDEXED BY events_leases WHERE status = 'claimed'),
    (SELECT count(*) FROM event_state INDEXED BY events_failed WHERE status = 'failed'),
    (SELECT min(due) FROM (
        SELECT min(next_attempt_at) AS due FROM event_state INDEXED BY events_due
         WHERE status = 'pending' AND lane = 0
        UNION ALL
        SELECT min(next_attempt_at) FROM event_state INDEXED BY events_due
         WHERE status = 'pending' AND lane = 1
        UNION ALL
        SELECT received_at FROM (SELECT received_at FROM event_log
                                  WHERE seq > q.after_seq AND lane = 0 ORDER BY seq LIMIT 1)
        UNION ALL
        SELECT min(next_attempt_at) FROM event_state INDEXED BY events_leases
         WHERE status = 'claimed'))
  FROM queue_cursors AS q WHERE q.lane = 0";

pub(super) fn status_counts(conn: &Connection) -> StoreResult<StatusCounts> {
    let (all, pending, claimed, failed, oldest): (i64, i64, i64, i64, Option<i64>) =
        conn.prepare_cached(STATUS_COUNTS)?.query_row([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?;
    Ok(StatusCounts {
        pending,
        claimed,
        completed: all - pending - claimed - failed,
        failed,
        oldest_due_at: oldest,
    })
}

/// The SET list of a retry: due now, a fresh budget (`budget_floor = attempts`), no outcome.
const RETRY_SET: &str = "status = 'pending', next_attempt_at = ?, budget_floor = attempts, \
     completed_at = NULL, outcome = NULL, abandoned = 0";

/// The retry of one event, decided by [`rules::may_retry_event`] on the row as it is inside
/// this write transaction (`BEGIN IMMEDIATE`: no other writer can change it in between), and
/// fenced on the status it was read with all the same.
pub(super) fn retry(
    tx: &Transaction<'_>,
    source: &str,
    event_id: &str,
    force: bool,
    now: i64,
) -> StoreResult<RetryOutcome> {
    let Some(event) = get(tx, source, event_id)? else {
        return Ok(RetryOutcome::NotFound);
    };
    if let Err(refusal) = rules::may_retry_event(&event, force) {
        return Ok(refusal.answer(event));
    }
    let sql = format!(
        "UPDATE event_state SET {} WHERE seq = ?2 AND status = ?3",
        RETRY_SET.replace('?', "?1")
    );
    let changed =
        tx.prepare_cached(&sql)?
            .execute(params![now, event.seq, event.status.as_str()])?;
    // The write lock is held since the read above: the fence cannot miss.
    match (changed, get(tx, source, event_id)?) {
        (1, Some(retried)) => Ok(RetryOutcome::Retried(retried)),
        _ => Err(StoreError::Internal(anyhow::anyhow!(
            "the retry of {source}/{event_id} changed no row inside its own transaction"
        ))),
    }
}

/// Bulk retry: failed events matching the filter that [`rules::may_retry`] lets go without
/// `force` (abandoned at-most-once events each need a deliberate forced retry: the downstream
/// may have acted). Tombstones are left out by the filter's `purged_at IS NULL` and by the rule.
pub(super) fn retry_failed(
    tx: &Transaction<'_>,
    filter: &EventFilter,
    now: i64,
) -> StoreResult<usize> {
    let mut values = Vec::new();
    let filter = EventFilter {
        status: None,
        purged: false,
        ..filter.clone()
    };
    let clause = where_clause(&filter, &["status = 'failed'"], &mut values);
    let candidates = tx
        .prepare(&format!(
            "SELECT seq, abandoned, purged_at IS NOT NULL FROM events WHERE {clause}"
        ))?
        .query_map(params_from_iter(values), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, bool>(1)?,
                r.get::<_, bool>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut update = tx.prepare_cached(&format!(
        "UPDATE event_state SET {} WHERE seq = ?2 AND status = 'failed'",
        RETRY_SET.replace('?', "?1")
    ))?;
    let mut retried = 0;
    for (seq, abandoned, purged) in candidates {
        if rules::may_retry(Status::Failed, abandoned, purged, false).is_ok() {
            retried += update.execute(params![now, seq])?;
        }
    }
    Ok(retried)
}
