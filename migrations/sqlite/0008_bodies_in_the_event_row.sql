-- The body moves into the event's own row: ingest then writes one row and its `(source,
-- event_id)` key per new event, as a bare group commit does, instead of a second row in a
-- second b-tree; a claim reads the body with the row it moves, instead of one lookup per
-- event. The columns go last in the row, so reading the small columns before them does not
-- decode the body.
--
-- A tombstone (migration 0006) has no body: `payload` is NULL exactly when `purged_at` is set.
--
-- `event_payloads` stays as a view over the same columns, for the readers that name it (the
-- export, `copy`, ops queries written against earlier versions); writing a row into the view
-- sets the body of its event, which is what `copy` does when it brings bodies over.
ALTER TABLE events ADD COLUMN payload BLOB;
ALTER TABLE events ADD COLUMN content_type TEXT;

UPDATE events
   SET (payload, content_type) = (SELECT p.payload, p.content_type
                                    FROM event_payloads AS p WHERE p.seq = events.seq)
 WHERE seq IN (SELECT seq FROM event_payloads);

DROP TABLE event_payloads;

CREATE VIEW event_payloads (seq, payload, content_type) AS
    SELECT seq, payload, content_type FROM events WHERE payload IS NOT NULL;

-- A body still needs its event, as the table's foreign key required.
CREATE TRIGGER event_payloads_insert INSTEAD OF INSERT ON event_payloads
BEGIN
    SELECT RAISE(ABORT, 'FOREIGN KEY constraint failed: a body needs its event')
     WHERE NOT EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq);
    UPDATE events SET payload = NEW.payload, content_type = NEW.content_type
     WHERE seq = NEW.seq;
END;
