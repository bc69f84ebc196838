-- The settings of a subscription's kind, beside its rules (as SQLite's migration 0017): JSON
-- text, NULL for the kinds that have none.
ALTER TABLE subscriptions ADD COLUMN settings text;
