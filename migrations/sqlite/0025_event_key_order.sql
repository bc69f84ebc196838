-- The log's unique key in the order `(event_id, source)`, not `(source, event_id)`: the key
-- is the same set of columns (the dedup and the conflict target of ingest's `INSERT … ON
-- CONFLICT (source, event_id)`, which names the columns in any order), so nothing that relies
-- on it changes. What changes is the cost of each comparison in its B-tree: with the source
-- first, every comparison on the way to a new key's place compares two equal source names (a
-- deployment has a few sources, most of its events from one) before it reaches the event id,
-- through SQLite's general record comparison; with the event id first the first field decides,
-- by the string comparison's fast path. Measured (docs/performance.md, "Ingest against the
-- reference, eighth look"): about 1,900 of SQLite's 17,000 instructions a stored delivery.
-- A listing filtered by source (`GET /events?source=`) no longer finds the index's prefix:
-- it reads the log newest first and stops at its page, where it used to sort every event of
-- the source for each page.
--
-- SQLite cannot change a table's UNIQUE constraint in place: the log is rebuilt by its
-- documented procedure (a new table, every row copied in `seq` order, the old one dropped, the
-- new one renamed; foreign keys are off while migrations run, and checked before the commit).
-- Every column, constraint and default is as it was. The views and the trigger that name the
-- log are dropped first and made again as they were, with the partial index of requests.
-- Once: the copy took 4.2 s for 500,000 events (240 MB) on the bench machine, and passes
-- through the WAL, which needs about the log's size of free disk while it runs.

DROP VIEW events;
DROP VIEW event_payloads;
DROP TRIGGER loyalty_credits_unlisted;

CREATE TABLE event_log_new (
    -- Store-assigned, strictly increasing in commit order, never reused: the order of
    -- GET /events and its cursor, the rowid, and the key of `event_state`.
    seq                INTEGER PRIMARY KEY,
    source             TEXT    NOT NULL,
    event_id           TEXT    NOT NULL,
    event_type         TEXT    NOT NULL,
    payload_sha256     BLOB    NOT NULL CHECK (length(payload_sha256) = 32),
    received_at        INTEGER NOT NULL,
    lane               INTEGER NOT NULL DEFAULT 0 CHECK (lane = 0 OR lane = 1),
    deliveries         INTEGER NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    payload_mismatches INTEGER NOT NULL DEFAULT 0,
    last_delivered_at  INTEGER NOT NULL,
    -- The body exactly as received; NULL once purged.
    payload            BLOB,
    content_type       TEXT,
    traceparent        TEXT,
    UNIQUE (event_id, source)
);

INSERT INTO event_log_new (seq, source, event_id, event_type, payload_sha256, received_at, lane,
                           deliveries, payload_mismatches, last_delivered_at, payload,
                           content_type, traceparent)
SELECT seq, source, event_id, event_type, payload_sha256, received_at, lane, deliveries,
       payload_mismatches, last_delivered_at, payload, content_type, traceparent
  FROM event_log ORDER BY seq;

DROP TABLE event_log;
ALTER TABLE event_log_new RENAME TO event_log;

CREATE INDEX event_log_requests ON event_log (seq) WHERE lane = 1;

CREATE VIEW events AS
SELECT l.seq AS seq, l.source AS source, l.event_id AS event_id, l.event_type AS event_type,
       CASE WHEN s.status IS NOT NULL THEN s.status
            WHEN l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursor WHERE id = 0)
            THEN 'pending'
            ELSE 'stored' END AS status,
       l.payload_sha256 AS payload_sha256, l.deliveries AS deliveries,
       l.payload_mismatches AS payload_mismatches, l.received_at AS received_at,
       l.last_delivered_at AS last_delivered_at, ifnull(s.attempts, 0) AS attempts,
       ifnull(s.budget_floor, 0) AS budget_floor,
       CASE WHEN s.status IS NOT NULL THEN s.next_attempt_at
            WHEN l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursor WHERE id = 0)
            THEN l.received_at END AS next_attempt_at,
       s.claimed_until AS claimed_until, s.claimed_by AS claimed_by,
       s.claim_token AS claim_token, s.completed_at AS completed_at, s.outcome AS outcome,
       s.last_error AS last_error, ifnull(s.abandoned, 0) AS abandoned, l.lane AS lane,
       s.finished_at AS finished_at, s.purged_at AS purged_at
  FROM event_log l
  LEFT JOIN event_state s ON s.rowid = (
       -- The row with the least (rank, subscription): min()'s row, with no sort.
       SELECT r FROM (
           SELECT x.rowid AS r,
                  min(CASE x.status WHEN 'failed' THEN 0 WHEN 'claimed' THEN 1
                                    WHEN 'pending' THEN 2 ELSE 3 END * 4294967296 + x.sub)
             FROM event_state x JOIN subscriptions u ON u.id = x.sub
            WHERE x.seq = l.seq AND u.removed_at IS NULL));

CREATE VIEW event_payloads AS
SELECT seq, payload, content_type, traceparent FROM event_log WHERE payload IS NOT NULL;

CREATE TRIGGER loyalty_credits_unlisted AFTER INSERT ON loyalty_credits
BEGIN
    INSERT INTO loyalty_unlisted_credits (customer_id, seq, order_id)
    SELECT NEW.customer_id, l.seq, NEW.order_id
      FROM event_log l
     WHERE l.source = NEW.source AND l.event_id = NEW.event_id;
END;
