//! Row mapping shared by the PostgreSQL modules.

use postgres::Row;

use crate::store::{AttemptRecord, EventRecord, Status, StoreError, StoreResult};

/// Columns in the order [`event`] reads them; prefix-free so it can follow `SELECT` or
/// `RETURNING`.
pub(super) const EVENT_COLUMNS: &str = "seq, source, event_id, event_type, status, attempts, \
     deliveries, payload_mismatches, received_at, last_delivered_at, next_attempt_at, \
     completed_at, outcome, last_error, abandoned, finished_at, purged_at";

pub(super) const EVENT_COLUMN_COUNT: usize = 17;

pub(super) fn event(row: &Row) -> StoreResult<EventRecord> {
    let status: String = row.try_get(4)?;
    Ok(EventRecord {
        seq: row.try_get(0)?,
        source: row.try_get(1)?,
        event_id: row.try_get(2)?,
        event_type: row.try_get(3)?,
        // The CHECK constraint admits only the four statuses.
        status: Status::parse(&status).ok_or_else(|| {
            StoreError::Internal(anyhow::anyhow!("unknown stored status {status}"))
        })?,
        attempts: row.try_get(5)?,
        deliveries: row.try_get(6)?,
        payload_mismatches: row.try_get(7)?,
        received_at: row.try_get(8)?,
        last_delivered_at: row.try_get(9)?,
        next_attempt_at: row.try_get(10)?,
        completed_at: row.try_get(11)?,
        outcome: row.try_get(12)?,
        last_error: row.try_get(13)?,
        abandoned: row.try_get(14)?,
        finished_at: row.try_get(15)?,
        purged_at: row.try_get(16)?,
        subscriptions: Vec::new(),
    })
}

pub(super) fn events(rows: &[Row]) -> StoreResult<Vec<EventRecord>> {
    rows.iter().map(event).collect()
}

pub(super) fn attempt(row: &Row) -> StoreResult<AttemptRecord> {
    Ok(AttemptRecord {
        subscription: row.try_get(6)?,
        attempt: row.try_get(0)?,
        worker: row.try_get(1)?,
        started_at: row.try_get(2)?,
        finished_at: row.try_get(3)?,
        result: row.try_get(4)?,
        error: row.try_get(5)?,
    })
}
