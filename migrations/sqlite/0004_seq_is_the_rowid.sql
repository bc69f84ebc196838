-- `seq` becomes the table's rowid (INTEGER PRIMARY KEY), and (source, event_id) a UNIQUE
-- constraint: the same dedup key, the same conflict target for `INSERT … ON CONFLICT`.
--
-- Before, `seq` was a separate UNIQUE index beside an implicit rowid: every stored delivery
-- wrote one more b-tree (and one more WAL page per commit), and every lookup by `seq` (the
-- fenced completion, the payload join, the attempt history) went through that index and then
-- the table. Now the row is found by `seq` in one descent, and rows sit in `seq` order.
--
-- The table is rebuilt as in 0003 (foreign keys off around migrations, `foreign_key_check`
-- before the commit); `event_payloads` and `event_attempts` keep referencing `events (seq)`.

CREATE TABLE events_new (
    -- Store-assigned, strictly increasing in commit order (writes are serialised), never reused:
    -- the order of GET /events and its cursor. Also the rowid.
    seq                INTEGER PRIMARY KEY,
    source             TEXT    NOT NULL,
    event_id           TEXT    NOT NULL,
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
    -- The dedup: one row per (source, event_id), whatever the number of deliveries.
    UNIQUE (source, event_id),
    CHECK ((status = 'claimed') = (claim_token IS NOT NULL)),
    CHECK (status <> 'pending' OR next_attempt_at IS NOT NULL)
);

INSERT INTO events_new (
    seq, source, event_id, event_type, status, payload_sha256, deliveries, payload_mismatches,
    received_at, last_delivered_at, attempts, budget_floor, next_attempt_at, claimed_until,
    claimed_by, claim_token, completed_at, outcome, last_error, abandoned)
SELECT
    seq, source, event_id, event_type, status, payload_sha256, deliveries, payload_mismatches,
    received_at, last_delivered_at, attempts, budget_floor, next_attempt_at, claimed_until,
    claimed_by, claim_token, completed_at, outcome, last_error, abandoned
FROM events ORDER BY seq;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;

CREATE INDEX events_due ON events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX events_leases ON events (claimed_until) WHERE status = 'claimed';
CREATE INDEX events_failed ON events (seq) WHERE status = 'failed';
CREATE INDEX events_source_seq ON events (source, seq);
