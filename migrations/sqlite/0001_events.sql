-- The event table: one row per (source, event_id), whatever the number of deliveries.
-- Times are unix milliseconds (UTC). The primary key is the dedup: a redelivery cannot make a
-- second row, whatever the interleaving.
CREATE TABLE events (
    source             TEXT    NOT NULL,
    event_id           TEXT    NOT NULL,
    -- Store-assigned, strictly increasing in commit order (writes are serialised), never reused:
    -- the order of GET /events and its cursor.
    seq                INTEGER NOT NULL UNIQUE,
    event_type         TEXT    NOT NULL,
    status             TEXT    NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'claimed', 'completed', 'failed')),
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
    abandoned          INTEGER NOT NULL DEFAULT 0 CHECK (abandoned IN (0, 1)),
    PRIMARY KEY (source, event_id),
    CHECK ((status = 'claimed') = (claim_token IS NOT NULL)),
    CHECK (status <> 'pending' OR next_attempt_at IS NOT NULL)
);

-- The body exactly as received, beside its event rather than in it: an event's row is rewritten
-- at every state transition, and a large body would be copied each time.
CREATE TABLE event_payloads (
    seq          INTEGER NOT NULL PRIMARY KEY REFERENCES events (seq),
    payload      BLOB    NOT NULL,
    content_type TEXT
);

-- The claim query reads only due pending rows: its cost does not grow with completed history.
CREATE INDEX events_due ON events (next_attempt_at) WHERE status = 'pending';
-- The sweeper reads only claimed rows.
CREATE INDEX events_leases ON events (claimed_until) WHERE status = 'claimed';
-- Failed events are few and ops list them often. (A full index on status would be rewritten on
-- every transition, which the consumers make several times per event.)
CREATE INDEX events_failed ON events (seq) WHERE status = 'failed';
CREATE INDEX events_source_seq ON events (source, seq);

-- One row per claim of an event; `result` stays NULL while the attempt runs. Keyed by the
-- event's sequence rather than its (random) id, so that the rows of recent events sit together
-- and stay in cache however long the history grows.
CREATE TABLE event_attempts (
    event_seq   INTEGER NOT NULL REFERENCES events (seq),
    attempt     INTEGER NOT NULL,
    worker      TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    result      TEXT CHECK (result IN ('ok', 'already_processed', 'retryable_error',
                                       'permanent_error', 'lease_expired')),
    error       TEXT,
    PRIMARY KEY (event_seq, attempt)
) WITHOUT ROWID;

-- Consumer-side dedup: an effect's transaction inserts here first; a second run of the same
-- event finds the row and changes nothing.
CREATE TABLE processed_events (
    consumer     TEXT    NOT NULL,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    outcome      TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, source, event_id)
) WITHOUT ROWID;

-- The business key: one credit per order, whatever the number of events that describe it.
CREATE TABLE loyalty_credits (
    order_id    TEXT    NOT NULL PRIMARY KEY,
    customer_id TEXT    NOT NULL,
    points      INTEGER NOT NULL CHECK (points > 0),
    source      TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    credited_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX loyalty_credits_customer ON loyalty_credits (customer_id, credited_at);

CREATE TABLE loyalty_balances (
    customer_id TEXT    NOT NULL PRIMARY KEY,
    balance     INTEGER NOT NULL
) WITHOUT ROWID;
