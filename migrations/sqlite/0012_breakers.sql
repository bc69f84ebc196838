-- The circuit breaker of an `http` subscription (SPEC section 13). While calls to its endpoint
-- succeed, `probe_at` is NULL. After a run of failures it holds when the next probe (one
-- event) may start, and `probe_interval_ms` how long the last wait was: it doubles after each
-- failed probe, up to the subscription's `backoff_max_ms`. A probe that succeeds clears both.
-- Kept in the database so that every node sees it, and a restart does not call a dead
-- endpoint once per waiting event.
ALTER TABLE subscriptions ADD COLUMN probe_at INTEGER;
ALTER TABLE subscriptions ADD COLUMN probe_interval_ms INTEGER;
