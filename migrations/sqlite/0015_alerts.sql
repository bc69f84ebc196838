-- Alerts (SPEC section 15): what every node sharing this database agrees on about them.
--
-- `alert_state`: one row per alert key (`channel/condition/subject`). `holding_since` is when
-- some node first saw the condition hold (NULL: not holding); `active` and `episode` say
-- whether a "started" notice went out for the current episode. A node starts an episode with
-- one conditional UPDATE (`... WHERE active = 0`), and clears it with another
-- (`... WHERE active = 1`): of several nodes that see the same thing, one changes the row, and
-- only that one writes the notice, in the same transaction.
CREATE TABLE alert_state (
    alert         TEXT    NOT NULL PRIMARY KEY,
    holding_since INTEGER,
    active        INTEGER NOT NULL DEFAULT 0 CHECK (active = 0 OR active = 1),
    episode       INTEGER NOT NULL DEFAULT 0,
    -- When the current (or last) episode's condition started to hold, and its figure then.
    started_at    INTEGER,
    figure        TEXT,
    -- When an episode last started or cleared: the time the deciding node took its snapshot
    -- (before reading it). A start or clear applies only to a row last changed before the
    -- snapshot it comes from, so a node's stale snapshot cannot undo what a newer one did.
    changed_at    INTEGER
);

-- The outbox of notices: written with the state change that made them, sent by one node at a
-- time (a claim with a lease, fenced by `claimed_by`), marked sent after the channel took it,
-- retried with backoff while it fails. A restart neither repeats nor loses one.
CREATE TABLE alert_notices (
    id              INTEGER PRIMARY KEY,
    alert           TEXT    NOT NULL,
    episode         INTEGER NOT NULL,
    phase           TEXT    NOT NULL CHECK (phase = 'started' OR phase = 'cleared'),
    channel         TEXT    NOT NULL,
    title           TEXT    NOT NULL,
    figure          TEXT    NOT NULL,
    since           INTEGER NOT NULL,
    link            TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    claimed_by      TEXT,
    claimed_until   INTEGER,
    sent_at         INTEGER,
    last_error      TEXT,
    UNIQUE (alert, episode, phase)
);
CREATE INDEX alert_notices_unsent ON alert_notices (channel, next_attempt_at)
    WHERE sent_at IS NULL;

-- The failing attempts by when they finished, for the alerts' windowed count of failed states
-- (`store::alerts::FAILED_SINCE`): a read bounded by the window. Partial, so that only failing
-- attempts write an entry: a successful finish (the hot path) writes none.
CREATE INDEX event_attempts_failing ON event_attempts (finished_at)
    WHERE result = 'retryable_error' OR result = 'permanent_error' OR result = 'lease_expired';
