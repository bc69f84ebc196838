-- The settings of a subscription's kind, beside its rules (JSON; for `http`: url, timeout_ms,
-- concurrency, rate_per_second, ca_file): every node runs the registry's forwarders with
-- these, not with its own config's. NULL for the kinds that have none (a `pull`
-- subscription's token is kept in `subscription_secrets`).
ALTER TABLE subscriptions ADD COLUMN settings TEXT;
