-- Two lanes of work. Events whose handler calls an external system (lane 1: a submitted
-- request, delivered downstream) are claimed apart from in-process ones (lane 0: credits, the
-- audit log), one at a time and by their own workers, so that a slow downstream never holds a
-- batch of credits behind its call, and a claim's lease always covers the one call it leads to.
-- The lane is set when the event is stored; `events_due` leads with it, so each lane's claim
-- is one range of that index.
ALTER TABLE events ADD COLUMN lane INTEGER NOT NULL DEFAULT 0 CHECK (lane = 0 OR lane = 1);
UPDATE events SET lane = 1 WHERE source = 'requests' AND event_type = 'request.submitted';
DROP INDEX events_due;
CREATE INDEX events_due ON events (lane, next_attempt_at) WHERE status = 'pending';

-- A claimed event keeps `next_attempt_at` (the time it became due) until it ends, so that the
-- lag gauge sees work that is claimed but not yet done; terminal events clear it.
UPDATE events SET next_attempt_at = NULL WHERE status = 'completed' OR status = 'failed';

-- A balance is an integer, always. SQLite turns an integer sum that overflows into a REAL;
-- with this CHECK such an update is refused (the credit's event fails alone with the reason)
-- instead of storing a balance that no reader can take as an integer. Points per order are
-- bounded by the handler (see `domain::order`), so this is the backstop, not the rule.
-- A REAL stored before this migration saturates to the largest integer.
CREATE TABLE loyalty_balances_new (
    customer_id TEXT    NOT NULL PRIMARY KEY,
    balance     INTEGER NOT NULL CHECK (typeof(balance) = 'integer')
) WITHOUT ROWID;
INSERT INTO loyalty_balances_new (customer_id, balance)
SELECT customer_id, CAST(balance AS INTEGER) FROM loyalty_balances;
DROP TABLE loyalty_balances;
ALTER TABLE loyalty_balances_new RENAME TO loyalty_balances;
