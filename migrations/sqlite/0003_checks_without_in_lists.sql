-- The same tables, with every CHECK over a list written as comparisons joined by OR.
--
-- SQLite evaluates `x IN ('a', 'b', 'c')` in a CHECK by building a temporary b-tree of the
-- list for every row written: on `events` and `event_attempts` that was one b-tree per
-- delivery stored, per claim, per completion and per attempt row (measured with callgrind:
-- about 18,000 instructions per stored delivery, a tenth of the whole server's work for it).
-- The constraints themselves do not change.
--
-- SQLite cannot alter a CHECK, so both tables are rebuilt (the runner turns foreign keys off
-- around migrations and runs `PRAGMA foreign_key_check` before each commit). The indexes go
-- with the old tables and are made again.

CREATE TABLE events_new (
    source             TEXT    NOT NULL,
    event_id           TEXT    NOT NULL,
    -- Store-assigned, strictly increasing in commit order (writes are serialised), never reused:
    -- the order of GET /events and its cursor.
    seq                INTEGER NOT NULL UNIQUE,
    event_type         TEXT    NOT NULL,
    status             TEXT    NOT NULL DEFAULT 'pending'
                       CHECK (status = 'pending' OR status = 'claimed' OR status = 'completed'
                              OR status = 'failed'),
    payload_sha256     BLOB    NOT NULL CHECK (length(payload_sha256) = 32),
    deliveries         INTEGER NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    payload_mismatches INTEGER NOT NULL DEFAULT 0,
    received_at        INTEGER NOT NULL,
    last_delivered_at  INTEGER NOT NULL,
    -- Claims so far; budget_floor is `attempts` at the last manual retry (a fresh budget).
    attempts           INTEGER NOT NULL DEFAULT 0,
    budget_floor       INTEGER NOT NULL DEFAULT 0,
    next_attempt_at    INTEGER,
    claimed_until      INTEGER,
    claimed_by         TEXT,
    claim_token        TEXT,
    completed_at       INTEGER,
    outcome            TEXT,
    last_error         TEXT,
    -- Set when an at-most-once event's lease expired: the downstream may have acted.
    abandoned          INTEGER NOT NULL DEFAULT 0 CHECK (abandoned = 0 OR abandoned = 1),
    PRIMARY KEY (source, event_id),
    CHECK ((status = 'claimed') = (claim_token IS NOT NULL)),
    CHECK (status <> 'pending' OR next_attempt_at IS NOT NULL)
);

INSERT INTO events_new (
    source, event_id, seq, event_type, status, payload_sha256, deliveries,
    payload_mismatches, received_at, last_delivered_at, attempts, budget_floor, next_attempt_at,
    claimed_until, claimed_by, claim_token, completed_at, outcome, last_error, abandoned)
SELECT
    source, event_id, seq, event_type, status, payload_sha256, deliveries,
    payload_mismatches, received_at, last_delivered_at, attempts, budget_floor, next_attempt_at,
    claimed_until, claimed_by, claim_token, completed_at, outcome, last_error, abandoned
FROM events;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;

CREATE INDEX events_due ON events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX events_leases ON events (claimed_until) WHERE status = 'claimed';
CREATE INDEX events_failed ON events (seq) WHERE status = 'failed';
CREATE INDEX events_source_seq ON events (source, seq);

CREATE TABLE event_attempts_new (
    event_seq   INTEGER NOT NULL REFERENCES events (seq),
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

INSERT INTO event_attempts_new (event_seq, attempt, worker, started_at, finished_at, result, error)
SELECT event_seq, attempt, worker, started_at, finished_at, result, error FROM event_attempts;
DROP TABLE event_attempts;
ALTER TABLE event_attempts_new RENAME TO event_attempts;
