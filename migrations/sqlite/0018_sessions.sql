-- When a `listen` session (origin `session`) last claimed, in ms: the heartbeat removes a
-- session idle for longer than `session_idle_seconds`. NULL for every other subscription (a
-- session's row is written with its creation time).
ALTER TABLE subscriptions ADD COLUMN seen_at INTEGER;
