-- PostgreSQL checks a foreign key by locking the parent row (`SELECT … FOR KEY SHARE`), which
-- writes that row and a WAL record for every child inserted: every body locked its log row,
-- every state row its log row and its subscription, every attempt its state row. Those locks
-- were the largest part of a fan-out's time (4.2 of 8.7 ms for 256 events). The statements
-- already write each child only from its parent in the same statement (a body with its log
-- row, a state row from a log row and a live subscription, an attempt with its claim);
-- nothing deletes a log row or a state row, and a subscription is deleted only while it has
-- no state row, under the locks every fan-out takes (`subscriptions::sync`); the test suite
-- checks each test's database for children without a parent. Dropping a constraint
-- rewrites nothing, and older nodes run beside it.
ALTER TABLE event_payloads DROP CONSTRAINT event_payloads_seq_fkey;
ALTER TABLE event_state DROP CONSTRAINT event_state_seq_fkey;
ALTER TABLE event_state DROP CONSTRAINT event_state_sub_fkey;
ALTER TABLE event_attempts DROP CONSTRAINT event_attempts_event_seq_sub_fkey;

-- The fan-out's and the lag's reads of the log after the cursor walk the primary key as well
-- (submitted requests, the only other lane, are few): an index that every delivery paid for
-- and no read needed.
DROP INDEX event_log_fan_out;
