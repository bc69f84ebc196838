-- The fan-out's cursor under PostgreSQL's name and shape (its migration 0003): `queue_cursor`,
-- one row of id 0. Here it was `queue_cursors`, keyed by a lane, from when each lane had a
-- cursor (0007); since 0009 it holds lane 0's only, and the two names were an accident that
-- every shared statement had to go round (issue 59). Both renames are SQLite's own
-- `ALTER TABLE`, which carries the row, the CHECK and the `events` view's references along:
-- nothing is rewritten, whatever the number of events.
ALTER TABLE queue_cursors RENAME TO queue_cursor;
ALTER TABLE queue_cursor RENAME COLUMN lane TO id;
