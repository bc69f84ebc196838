-- Retention (SPEC section 12). A purged event keeps its row in `events` as its own tombstone:
-- source, event id, body sha256, type, received time, final status and outcome are already
-- there, so the `(source, event_id)` UNIQUE key goes on deduplicating redeliveries with no
-- change to ingest, and a redelivered body is still compared with the kept sha256. Only the
-- body (`event_payloads`) and the history (`event_attempts`) are deleted.
--
-- `finished_at`: when the event became terminal, written by the purge (a completed event's
-- `completed_at`, a failed one's last attempt end) so that it outlives the deleted history.
-- `purged_at`: when the purge took the body; NULL while the event is whole. Only a terminal
-- event can be purged, and a purged event can never leave its terminal state (a retry, a claim
-- or a sweep that tried would break this CHECK), so it never reaches a consumer again.
ALTER TABLE events ADD COLUMN finished_at INTEGER;
ALTER TABLE events ADD COLUMN purged_at INTEGER
    CHECK (purged_at IS NULL OR status = 'completed' OR status = 'failed');

-- Tombstones are listed (`status=purged`) and counted (metrics) from here; the index holds no
-- entry for a live event, so ingest and consumers never write to it.
CREATE INDEX events_purged ON events (seq) WHERE purged_at IS NOT NULL;
