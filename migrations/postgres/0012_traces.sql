-- The W3C trace context a delivery came with, or that ingest's span gave it (as SQLite's
-- migration 0019). Beside the body: the claim reads both in one join, and the purge deletes
-- both.
ALTER TABLE event_payloads ADD COLUMN traceparent text;
