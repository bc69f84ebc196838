-- The W3C trace context a delivery came with, or that ingest's span gave it (`[telemetry]`):
-- the spans of its handling and the `traceparent` of its forwards and pull claims continue
-- that trace. NULL when tracing is off and the provider sent none (every row before this
-- migration). Read with the body, and freed with it by the purge.
ALTER TABLE event_log ADD COLUMN traceparent TEXT;

DROP VIEW event_payloads;
CREATE VIEW event_payloads AS
SELECT seq, payload, content_type, traceparent FROM event_log WHERE payload IS NOT NULL;
