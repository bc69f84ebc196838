-- One registry of subscriptions (as SQLite's migration 0014): each subscription's rules
-- beside its route, a version number that a node's cached view is checked against, the nodes
-- with the subscriptions their configs name, and what removed subscriptions left unfinished
-- completed with outcome `removed`.
ALTER TABLE subscriptions
    ADD COLUMN mode text NOT NULL DEFAULT 'at-least-once'
        CHECK (mode IN ('at-least-once', 'at-most-once')),
    ADD COLUMN max_attempts bigint NOT NULL DEFAULT 15,
    ADD COLUMN backoff_base_ms bigint NOT NULL DEFAULT 1000,
    ADD COLUMN backoff_max_ms bigint NOT NULL DEFAULT 3600000,
    ADD COLUMN origin text NOT NULL DEFAULT 'config' CHECK (origin IN ('config', 'api', 'session'));

-- The implicit `downstream`: at most once unless a node's config says otherwise.
UPDATE subscriptions SET mode = 'at-most-once' WHERE kind = 'downstream';

CREATE TABLE subscription_registry (
    id      bigint NOT NULL PRIMARY KEY CHECK (id = 0),
    version bigint NOT NULL
);
INSERT INTO subscription_registry (id, version) VALUES (0, 1);

-- Secrets a node generates for a subscription that names none: made once, shared by every
-- node (see SQLite's migration 0014).
CREATE TABLE subscription_secrets (
    name       text   NOT NULL,
    purpose    text   NOT NULL CHECK (purpose IN ('signing', 'token')),
    value      text   NOT NULL,
    created_at bigint NOT NULL,
    PRIMARY KEY (name, purpose)
);

CREATE TABLE nodes (
    name          text   NOT NULL PRIMARY KEY,
    subscriptions text   NOT NULL,
    seen_at       bigint NOT NULL
);

UPDATE event_attempts a
   SET finished_at = u.removed_at, result = 'permanent_error',
       error = 'the subscription was removed'
  FROM subscriptions u
 WHERE u.id = a.sub AND u.removed_at IS NOT NULL AND a.finished_at IS NULL;
UPDATE event_state s
   SET status = 'completed', outcome = 'removed', next_attempt_at = NULL,
       claimed_until = NULL, claimed_by = NULL, claim_token = NULL,
       completed_at = u.removed_at, finished_at = u.removed_at
  FROM subscriptions u
 WHERE u.id = s.sub AND u.removed_at IS NOT NULL AND s.status IN ('pending', 'claimed');

-- Ordering per key: a claim takes an event of a key only while none of the key is in flight
-- (`routes::Ordered::may_claim_sql`), a probe of this small index of claimed keyed states.
CREATE INDEX events_in_flight ON event_state (sub, order_key)
    WHERE status = 'claimed' AND order_key IS NOT NULL;
