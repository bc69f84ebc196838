-- Subscriptions (SPEC section 13): every event is handled once per subscription whose route
-- matches it, each with its own state. The state of an event becomes one `event_state` row per
-- (event, subscription), and its history says which subscription each attempt was for.
--
-- Ingest is unchanged: one log row and one key per new event, whatever the number of
-- subscriptions. An event is fanned out when the lane-0 claim first reaches it after the
-- cursor: the claim gives it one state row per live subscription whose route matches, claimed
-- for the in-process ones that are not paused, pending for the others (a paused one, one served
-- by its own call-out workers). So an event after the cursor has no state row yet, and one at
-- or before it has all of its state rows or none (no route matched it: `stored`).
--
-- Every event stored so far keeps its state under the implicit subscription that handled it:
-- a submitted request (lane 1) under `downstream`, an `order.completed` under `loyalty`,
-- anything else under `audit`. Their ids are fixed here; the config's subscriptions are
-- matched to these rows by name when the service starts.

CREATE TABLE subscriptions (
    id              INTEGER PRIMARY KEY,
    name            TEXT    NOT NULL UNIQUE,
    kind            TEXT    NOT NULL,
    -- 0: claimed in batches by the in-process workers; 1: by call-out workers, one at a time.
    lane            INTEGER NOT NULL CHECK (lane = 0 OR lane = 1),
    -- The route, as JSON arrays: NULL sources is every source but `requests`; NULL types is
    -- every type (globs with `*` and `?`); except_types only for the implicit `audit`.
    sources         TEXT,
    types           TEXT,
    except_types    TEXT    NOT NULL DEFAULT '[]',
    -- It takes the events stored after this seq (those stored before it was added are handed
    -- to it only by a backfill).
    start_after_seq INTEGER NOT NULL DEFAULT 0,
    paused          INTEGER NOT NULL DEFAULT 0 CHECK (paused = 0 OR paused = 1),
    created_at      INTEGER NOT NULL,
    -- No longer in the config: no new work, its history kept.
    removed_at      INTEGER
);

INSERT INTO subscriptions (id, name, kind, lane, sources, types, except_types, created_at)
VALUES (1, 'loyalty', 'loyalty-credit', 0, NULL, '["order.completed"]', '[]', 0),
       (2, 'downstream', 'downstream', 1, '["requests"]', NULL, '[]', 0),
       (3, 'audit', 'audit', 0, NULL, NULL, '["order.completed"]', 0);

CREATE TABLE event_state_new (
    seq             INTEGER NOT NULL REFERENCES event_log (seq),
    sub             INTEGER NOT NULL REFERENCES subscriptions (id),
    -- The subscription's: each lane's due work is one range of `events_due` per subscription.
    lane            INTEGER NOT NULL CHECK (lane = 0 OR lane = 1),
    status          TEXT    NOT NULL
                    CHECK (status = 'pending' OR status = 'claimed' OR status = 'completed'
                           OR status = 'failed'),
    attempts        INTEGER NOT NULL DEFAULT 0,
    budget_floor    INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    claimed_until   INTEGER,
    claimed_by      TEXT,
    claim_token     TEXT,
    completed_at    INTEGER,
    outcome         TEXT,
    last_error      TEXT,
    abandoned       INTEGER NOT NULL DEFAULT 0 CHECK (abandoned = 0 OR abandoned = 1),
    finished_at     INTEGER,
    purged_at       INTEGER
                    CHECK (purged_at IS NULL OR status = 'completed' OR status = 'failed'),
    PRIMARY KEY (seq, sub),
    CHECK ((status = 'claimed') = (claim_token IS NOT NULL)),
    CHECK (status <> 'pending' OR next_attempt_at IS NOT NULL)
);

INSERT INTO event_state_new (seq, sub, lane, status, attempts, budget_floor, next_attempt_at,
                             claimed_until, claimed_by, claim_token, completed_at, outcome,
                             last_error, abandoned, finished_at, purged_at)
SELECT s.seq,
       CASE WHEN s.lane = 1 THEN 2 WHEN l.event_type = 'order.completed' THEN 1 ELSE 3 END,
       s.lane, s.status, s.attempts, s.budget_floor, s.next_attempt_at, s.claimed_until,
       s.claimed_by, s.claim_token, s.completed_at, s.outcome, s.last_error, s.abandoned,
       s.finished_at, s.purged_at
  FROM event_state s JOIN event_log l ON l.seq = s.seq
 ORDER BY s.seq;

CREATE TABLE event_attempts_new (
    event_seq   INTEGER NOT NULL,
    sub         INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    worker      TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    result      TEXT CHECK (result = 'ok' OR result = 'already_processed'
                            OR result = 'retryable_error' OR result = 'permanent_error'
                            OR result = 'lease_expired'),
    error       TEXT,
    PRIMARY KEY (event_seq, sub, attempt),
    FOREIGN KEY (event_seq, sub) REFERENCES event_state (seq, sub)
) WITHOUT ROWID;
INSERT INTO event_attempts_new (event_seq, sub, attempt, worker, started_at, finished_at,
                                result, error)
SELECT a.event_seq, s.sub, a.attempt, a.worker, a.started_at, a.finished_at, a.result, a.error
  FROM event_attempts a JOIN event_state_new s ON s.seq = a.event_seq
 ORDER BY a.event_seq, a.attempt;

DROP VIEW events;
DROP TABLE event_attempts;
DROP TABLE event_state;
ALTER TABLE event_state_new RENAME TO event_state;
ALTER TABLE event_attempts_new RENAME TO event_attempts;

CREATE INDEX events_due ON event_state (sub, next_attempt_at) WHERE status = 'pending';
CREATE INDEX events_leases ON event_state (claimed_until) WHERE status = 'claimed';
CREATE INDEX events_failed ON event_state (seq) WHERE status = 'failed';
CREATE INDEX events_purged ON event_state (seq) WHERE purged_at IS NOT NULL;
-- Submitted requests after the cursor, counted by `/metrics` without reading the log.
CREATE INDEX event_log_requests ON event_log (seq) WHERE lane = 1;

-- The event as one row, as every reader had it: the state that decides its summary status
-- (the first failed, else claimed, else pending, else completed one, among live subscriptions;
-- ties by subscription), or, with no state row, `pending` after the lane-0 cursor (not fanned
-- out yet) and `stored` at or before it (no route matched).
CREATE VIEW events AS
SELECT l.seq AS seq, l.source AS source, l.event_id AS event_id, l.event_type AS event_type,
       CASE WHEN s.status IS NOT NULL THEN s.status
            WHEN l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursors WHERE lane = 0)
            THEN 'pending'
            ELSE 'stored' END AS status,
       l.payload_sha256 AS payload_sha256, l.deliveries AS deliveries,
       l.payload_mismatches AS payload_mismatches, l.received_at AS received_at,
       l.last_delivered_at AS last_delivered_at, ifnull(s.attempts, 0) AS attempts,
       ifnull(s.budget_floor, 0) AS budget_floor,
       CASE WHEN s.status IS NOT NULL THEN s.next_attempt_at
            WHEN l.lane = 0 AND l.seq > (SELECT after_seq FROM queue_cursors WHERE lane = 0)
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
