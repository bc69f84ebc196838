-- The event table split in two, so that ingest appends one row and one key per new event, as a
-- bare group commit does (issue 17), and the consumers never rewrite a body.
--
-- - `event_log`: what a delivery brings, written by ingest: the key, the type, the body and its
--   sha256, the lane, and the redelivery counters (a redelivery rewrites its row: rare). The
--   `(source, event_id)` UNIQUE key is the dedup, the conflict target of ingest's `INSERT … ON
--   CONFLICT DO NOTHING`. A purge sets the body to NULL (the row is the tombstone).
-- - `event_state`: what the consumers and ops change (status, attempts, leases, outcome),
--   written at an event's first claim, and never by ingest. Its partial indexes are the
--   consumers' and ops' (due work that came back, leases, failures, tombstones).
--
-- An event of lane 0 has no `event_state` row until its first claim: it is a first attempt,
-- found in `seq` order after the lane's cursor. That is sound because writes are serialised
-- and `seq` is the log's rowid, `max + 1` at each insert: `seq` follows commit order, nothing is
-- ever inserted behind the cursor, and the claim moves the cursor only past the events it gave
-- a state row (or, when it found fewer than it had room for, to the last `seq`). So: a lane-0
-- event has a state row exactly when its `seq` is at most the cursor. Lane 1 (a submitted
-- request, delivered downstream) gets its state row when it is stored.
--
-- The log's `seq` has no gaps from here on (ingest lets SQLite number the rows it inserts, and
-- nothing deletes a log row), so the first attempts waiting are `max(seq) - after_seq` minus
-- the few state rows after the cursor (lane 1's): `/metrics` counts the log without reading it,
-- and ingest writes no counter.
--
-- `events` and `event_payloads` stay, as views with the columns they had: every reader (ops,
-- the copy, the dashboard) reads them as before; writers write the two tables.

CREATE TABLE event_log (
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
    UNIQUE (source, event_id)
);

INSERT INTO event_log (seq, source, event_id, event_type, payload_sha256, received_at, lane,
                       deliveries, payload_mismatches, last_delivered_at, payload, content_type)
SELECT e.seq, e.source, e.event_id, e.event_type, e.payload_sha256, e.received_at, e.lane,
       e.deliveries, e.payload_mismatches, e.last_delivered_at, p.payload, p.content_type
  FROM events e LEFT JOIN event_payloads p ON p.seq = e.seq
 ORDER BY e.seq;

CREATE TABLE event_state (
    seq             INTEGER PRIMARY KEY REFERENCES event_log (seq),
    -- A copy of the log's: each lane's due work is one range of `events_due`.
    lane            INTEGER NOT NULL CHECK (lane = 0 OR lane = 1),
    status          TEXT    NOT NULL
                    CHECK (status = 'pending' OR status = 'claimed' OR status = 'completed'
                           OR status = 'failed'),
    -- Claims so far; budget_floor is `attempts` at the last manual retry (a fresh budget).
    attempts        INTEGER NOT NULL DEFAULT 0,
    budget_floor    INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    claimed_until   INTEGER,
    claimed_by      TEXT,
    claim_token     TEXT,
    completed_at    INTEGER,
    outcome         TEXT,
    last_error      TEXT,
    -- Set when an at-most-once event's lease expired: the downstream may have acted.
    abandoned       INTEGER NOT NULL DEFAULT 0 CHECK (abandoned = 0 OR abandoned = 1),
    finished_at     INTEGER,
    purged_at       INTEGER
                    CHECK (purged_at IS NULL OR status = 'completed' OR status = 'failed'),
    CHECK ((status = 'claimed') = (claim_token IS NOT NULL)),
    CHECK (status <> 'pending' OR next_attempt_at IS NOT NULL)
);

-- Every event stored so far gets its state row: all of them are behind the new cursor.
INSERT INTO event_state (seq, lane, status, attempts, budget_floor, next_attempt_at,
                         claimed_until, claimed_by, claim_token, completed_at, outcome,
                         last_error, abandoned, finished_at, purged_at)
SELECT seq, lane, status, attempts, budget_floor, next_attempt_at, claimed_until, claimed_by,
       claim_token, completed_at, outcome, last_error, abandoned, finished_at, purged_at
  FROM events ORDER BY seq;

-- The history now references the state rows (an attempt exists only once claimed).
CREATE TABLE event_attempts_new (
    event_seq   INTEGER NOT NULL REFERENCES event_state (seq),
    attempt     INTEGER NOT NULL,
    worker      TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    result      TEXT CHECK (result = 'ok' OR result = 'already_processed'
                            OR result = 'retryable_error' OR result = 'permanent_error'
                            OR result = 'lease_expired'),
    error       TEXT,
    PRIMARY KEY (event_seq, attempt)
) WITHOUT ROWID;
INSERT INTO event_attempts_new SELECT event_seq, attempt, worker, started_at, finished_at,
                                      result, error
  FROM event_attempts ORDER BY event_seq, attempt;
DROP TABLE event_attempts;
ALTER TABLE event_attempts_new RENAME TO event_attempts;

DROP TABLE event_payloads;
DROP TABLE events;

-- Pending work in state rows: work that came back (a retry, a released or swept claim, an ops
-- retry), submitted requests, and first attempts stored before this migration.
CREATE INDEX events_due ON event_state (lane, next_attempt_at) WHERE status = 'pending';
CREATE INDEX events_leases ON event_state (claimed_until) WHERE status = 'claimed';
CREATE INDEX events_failed ON event_state (seq) WHERE status = 'failed';
CREATE INDEX events_purged ON event_state (seq) WHERE purged_at IS NOT NULL;

-- One cursor: lane 1's events have their state rows from the start.
DROP TABLE queue_cursors;
CREATE TABLE queue_cursors (
    lane      INTEGER NOT NULL PRIMARY KEY CHECK (lane = 0),
    -- Every lane-0 event with a larger seq is a first attempt with no state row yet.
    after_seq INTEGER NOT NULL
);
INSERT INTO queue_cursors (lane, after_seq) SELECT 0, ifnull(max(seq), 0) FROM event_log;

-- The event as it was one table: a state row's event, then the first attempts after the
-- cursor, which are pending, unclaimed and due since they were received. The second part's
-- constants are cast to their columns' types: with the same affinity in both parts, SQLite
-- flattens the view into a query and reads a page newest first as a merge of the two parts in
-- `seq` order (without, it sorts the whole history for each page of GET /events).
CREATE VIEW events AS
SELECT s.seq AS seq, l.source AS source, l.event_id AS event_id, l.event_type AS event_type,
       s.status AS status, l.payload_sha256 AS payload_sha256, l.deliveries AS deliveries,
       l.payload_mismatches AS payload_mismatches, l.received_at AS received_at,
       l.last_delivered_at AS last_delivered_at, s.attempts AS attempts,
       s.budget_floor AS budget_floor, s.next_attempt_at AS next_attempt_at,
       s.claimed_until AS claimed_until, s.claimed_by AS claimed_by,
       s.claim_token AS claim_token, s.completed_at AS completed_at, s.outcome AS outcome,
       s.last_error AS last_error, s.abandoned AS abandoned, s.lane AS lane,
       s.finished_at AS finished_at, s.purged_at AS purged_at
  FROM event_state s JOIN event_log l ON l.seq = s.seq
UNION ALL
SELECT l.seq, l.source, l.event_id, l.event_type, CAST('pending' AS TEXT), l.payload_sha256,
       l.deliveries, l.payload_mismatches, l.received_at, l.last_delivered_at,
       CAST(0 AS INTEGER), CAST(0 AS INTEGER), l.received_at, CAST(NULL AS INTEGER),
       CAST(NULL AS TEXT), CAST(NULL AS TEXT), CAST(NULL AS INTEGER), CAST(NULL AS TEXT),
       CAST(NULL AS TEXT), CAST(0 AS INTEGER), l.lane, CAST(NULL AS INTEGER),
       CAST(NULL AS INTEGER)
  FROM event_log l
 WHERE l.seq > (SELECT after_seq FROM queue_cursors WHERE lane = 0) AND l.lane = 0;

CREATE VIEW event_payloads AS
SELECT seq, payload, content_type FROM event_log WHERE payload IS NOT NULL;

-- Credits are listed by the seq of their event: found through the log's key.
DROP TRIGGER loyalty_credits_unlisted;
CREATE TRIGGER loyalty_credits_unlisted AFTER INSERT ON loyalty_credits
BEGIN
    INSERT INTO loyalty_unlisted_credits (customer_id, seq, order_id)
    SELECT NEW.customer_id, l.seq, NEW.order_id
      FROM event_log l
     WHERE l.source = NEW.source AND l.event_id = NEW.event_id;
END;

