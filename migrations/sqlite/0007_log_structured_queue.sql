-- A log-structured queue: a new event is appended, and nothing else at ingest tells consumers
-- where it is. First attempts are claimed in `seq` order from a per-lane cursor; only events
-- that come back (a retry after backoff, a released or swept claim, an ops retry: all have
-- `attempts > 0`) go through the partial index of due work. Ingest then writes two b-trees per
-- new event (the row and its `(source, event_id)` key) plus the body, instead of five.
--
-- Why the cursor is sound here: writes are serialised and `seq` is `max(seq) + 1` at insert,
-- so `seq` follows commit order and nothing is ever inserted behind a cursor. Every pending
-- event with `attempts = 0` of a lane has `seq > queue_cursors.after_seq` of that lane: the
-- claim moves the cursor only past events it claimed, or, when it found fewer than it asked
-- for, to the last `seq` (then there is none of that lane left ahead of it). A PostgreSQL
-- store, where sequence order is not commit order, keeps a partial index on first attempts
-- instead (`WHERE status = 'pending' AND attempts = 0`): same rows, same claim, same fence.
CREATE TABLE queue_cursors (
    lane      INTEGER NOT NULL PRIMARY KEY CHECK (lane = 0 OR lane = 1),
    -- Every never-claimed pending event of this lane has a larger seq.
    after_seq INTEGER NOT NULL,
    -- How many there are: added by ingest, taken by claims, in their transactions, so that
    -- /metrics counts the log without reading it.
    waiting   INTEGER NOT NULL CHECK (waiting >= 0)
);
INSERT INTO queue_cursors (lane, after_seq, waiting)
SELECT l.lane,
       ifnull((SELECT min(seq) - 1 FROM events
                WHERE status = 'pending' AND attempts = 0 AND lane = l.lane),
              ifnull((SELECT max(seq) FROM events), 0)),
       (SELECT count(*) FROM events WHERE status = 'pending' AND attempts = 0 AND lane = l.lane)
  FROM (SELECT 0 AS lane UNION ALL SELECT 1) AS l;

-- Due work that came back: never a first attempt.
DROP INDEX events_due;
CREATE INDEX events_due ON events (lane, next_attempt_at)
    WHERE status = 'pending' AND attempts > 0;

-- One more b-tree per stored delivery, for one ops filter: listing by source now walks `seq`
-- downwards and skips other sources (or reads the `(source, event_id)` key and sorts), which is
-- what an ops page can afford and ingest cannot.
DROP INDEX events_source_seq;
