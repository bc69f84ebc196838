//! The counts `/metrics` reads on PostgreSQL, and the received events per minute (the event
//! views and retries are `store::sql`'s).

use super::session::Db;
use crate::store::{StatusCounts, StoreResult};

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
