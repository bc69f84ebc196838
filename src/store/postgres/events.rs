//! The statements of the counts `/metrics` reads on PostgreSQL (read by `store::sql::stats`).

/// The events waiting for their fan-out (lane 0, after the cursor): how many, and when the
/// first was received. The cursor is a value (an init plan), so that the primary key's range
/// starts at it; as a join, the plan may walk the log from its first event.
pub(super) const WAITING: &str = "SELECT count(*), min(l.received_at) FROM event_log l
   WHERE l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursor)";

/// [`crate::store::sql::Dialect::STATUS_COUNTS`] on PostgreSQL, in one statement (one snapshot):
/// pending, claimed and failed from their partial indexes, the events not fanned out yet once
/// each, `completed` the rest of a count of every state row.
///
/// `listen` sessions (origin `session`) are left out of the pending count and the lag, as on
/// SQLite (`sqlite::STATUS_COUNTS`): their pending rows counted apart by each session's range
/// of `events_due`, the lag the first due time of every other subscription's range and of the
/// claims that are not a session's, and of the first event waiting (`least` passes NULLs by). Their claims and failures stay in those counts.
pub(super) const STATUS_COUNTS: &str = "SELECT
    (SELECT count(*) FROM event_state),
    (SELECT count(*) FROM event_state WHERE status = 'pending'),
    w.count,
    (SELECT count(*) FROM event_state WHERE status = 'claimed'),
    (SELECT count(*) FROM event_state WHERE status = 'failed'),
    least(w.min, (SELECT min(due) FROM (
        SELECT (SELECT min(s.next_attempt_at) FROM event_state s
                 WHERE s.status = 'pending' AND s.sub = u.id) AS due
          FROM subscriptions u WHERE u.origin <> 'session'
        UNION ALL
        SELECT min(s.next_attempt_at) FROM event_state s
         WHERE s.status = 'claimed'
           AND NOT EXISTS (SELECT 1 FROM subscriptions u
                            WHERE u.id = s.sub AND u.origin = 'session')) d)),
    (SELECT coalesce(sum((SELECT count(*) FROM event_state s
                           WHERE s.status = 'pending' AND s.sub = u.id)), 0)::bigint
       FROM subscriptions u WHERE u.origin = 'session')
  FROM (SELECT count(*), min(l.received_at) FROM event_log l
         WHERE l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursor)) w";
