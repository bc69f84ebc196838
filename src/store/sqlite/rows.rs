//! Row mapping shared by the SQLite modules.

use rusqlite::Row;

use crate::store::{AttemptRecord, EventRecord, Status};

/// Columns in the order [`event`] reads them; prefix-free so it can follow `SELECT` or
/// `RETURNING`.
pub(super) const EVENT_COLUMNS: &str = "seq, source, event_id, event_type, status, attempts, \
     deliveries, payload_mismatches, received_at, last_delivered_at, next_attempt_at, \
     completed_at, outcome, last_error, abandoned, finished_at, purged_at";

pub(super) const EVENT_COLUMN_COUNT: usize = 17;

pub(super) fn event(row: &Row<'_>) -> rusqlite::Result<EventRecord> {
    let status: String = row.get(4)?;
    Ok(EventRecord {
        seq: row.get(0)?,
        source: row.get(1)?,
        event_id: row.get(2)?,
        event_type: row.get(3)?,
        // The CHECK constraint admits only the four statuses.
        status: Status::parse(&status).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                4,
                rusqlite::types::Type::Text,
                format!("unknown status {status}").into(),
            )
        })?,
        attempts: row.get(5)?,
        deliveries: row.get(6)?,
        payload_mismatches: row.get(7)?,
        received_at: row.get(8)?,
        last_delivered_at: row.get(9)?,
        next_attempt_at: row.get(10)?,
        completed_at: row.get(11)?,
        outcome: row.get(12)?,
        last_error: row.get(13)?,
        abandoned: row.get(14)?,
        finished_at: row.get(15)?,
        purged_at: row.get(16)?,
        subscriptions: Vec::new(),
    })
}

pub(super) fn attempt(row: &Row<'_>) -> rusqlite::Result<AttemptRecord> {
    Ok(AttemptRecord {
        attempt: row.get(0)?,
        worker: row.get(1)?,
        started_at: row.get(2)?,
        finished_at: row.get(3)?,
        result: row.get(4)?,
        error: row.get(5)?,
        subscription: row.get(6)?,
    })
}
