-- One registry of subscriptions: every node fans out, claims, sweeps and decides by this
-- table, never by its own config alone (nodes with different config files agree). Each
-- subscription's rules live beside its route, a version number says when any changed (a
-- node's cached view is checked against it in every claim), and each node records the
-- subscriptions its config names, so that a node restarted with an older config removes
-- none that another live node's config still names.
ALTER TABLE subscriptions ADD COLUMN mode TEXT NOT NULL DEFAULT 'at-least-once'
    CHECK (mode = 'at-least-once' OR mode = 'at-most-once');
ALTER TABLE subscriptions ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 15;
ALTER TABLE subscriptions ADD COLUMN backoff_base_ms INTEGER NOT NULL DEFAULT 1000;
ALTER TABLE subscriptions ADD COLUMN backoff_max_ms INTEGER NOT NULL DEFAULT 3600000;
-- Where it came from: a node's config, the API, a `listen` session.
ALTER TABLE subscriptions ADD COLUMN origin TEXT NOT NULL DEFAULT 'config'
    CHECK (origin = 'config' OR origin = 'api' OR origin = 'session');

-- The implicit `downstream` calls a system that may not honour idempotency keys: at most once
-- unless a node's config says otherwise (it applies its own when it starts).
UPDATE subscriptions SET mode = 'at-most-once' WHERE kind = 'downstream';

CREATE TABLE subscription_registry (
    id      INTEGER PRIMARY KEY CHECK (id = 0),
    -- Moved on by every change of a subscription's route, rules or life.
    version INTEGER NOT NULL
);
INSERT INTO subscription_registry (id, version) VALUES (0, 1);

-- Secrets a node generates for a subscription that names none (an `http` subscription's
-- signing secret, a `pull` subscription's token): made once, here, and shared by every node,
-- so that nodes with the same config sign alike. The first node to start after this version
-- brings the one in its data folder, if it has one.
CREATE TABLE subscription_secrets (
    name       TEXT    NOT NULL,
    purpose    TEXT    NOT NULL CHECK (purpose = 'signing' OR purpose = 'token'),
    value      TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (name, purpose)
);

-- The nodes that share this database, each with the subscriptions its config names (a JSON
-- list) and when it was last seen (a heartbeat; a node that stops cleanly deletes its row).
CREATE TABLE nodes (
    name          TEXT    PRIMARY KEY,
    subscriptions TEXT    NOT NULL,
    seen_at       INTEGER NOT NULL
);

-- Removed means finished: what a subscription removed by an earlier version left pending or
-- claimed is completed with outcome `removed` (its history stays), so that it no longer
-- counts as pending or lag and no longer holds back the purge.
UPDATE event_attempts SET finished_at = (SELECT u.removed_at FROM subscriptions u
                                          WHERE u.id = event_attempts.sub),
                          result = 'permanent_error', error = 'the subscription was removed'
 WHERE finished_at IS NULL
   AND sub IN (SELECT id FROM subscriptions WHERE removed_at IS NOT NULL);
UPDATE event_state
   SET status = 'completed', outcome = 'removed', next_attempt_at = NULL,
       claimed_until = NULL, claimed_by = NULL, claim_token = NULL,
       completed_at = (SELECT u.removed_at FROM subscriptions u WHERE u.id = event_state.sub),
       finished_at = (SELECT u.removed_at FROM subscriptions u WHERE u.id = event_state.sub)
 WHERE status IN ('pending', 'claimed')
   AND sub IN (SELECT id FROM subscriptions WHERE removed_at IS NOT NULL);

-- Ordering per key: a claim takes an event of a key only while none of the key is in flight
-- (`routes::Ordered::may_claim_sql`), a probe of this small index of claimed keyed states.
CREATE INDEX events_in_flight ON event_state (sub, order_key)
    WHERE status = 'claimed' AND order_key IS NOT NULL;
