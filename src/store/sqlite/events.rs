//! The statement of the counts `/metrics` reads on SQLite (read by `store::sql::stats`).

/// [`crate::store::sql::Dialect::STATUS_COUNTS`] on SQLite: in one statement (one snapshot), as subscription
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
/// `pending` by `sql::stats::status_counts`), and the lag reads only the other subscriptions' ranges and
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
  FROM queue_cursor AS q WHERE q.id = 0";
