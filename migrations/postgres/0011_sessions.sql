-- When a `listen` session (origin `session`) last claimed, in ms (as SQLite's migration 0018).
ALTER TABLE subscriptions ADD COLUMN seen_at bigint;
