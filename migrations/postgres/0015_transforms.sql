-- A subscription's transform (SPEC section 13, issue 61), as SQLite's migration 0022: a jq
-- program run at delivery, as text; NULL for none.
ALTER TABLE subscriptions ADD COLUMN transform text;
