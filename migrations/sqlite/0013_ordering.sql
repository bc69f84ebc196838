-- Ordering per key (SPEC section 13, "Ordering"): a subscription with `ordered_by` (a JSON
-- pointer into the body) handles the events of one key one at a time, in the order they were
-- stored. The key is read once, when the event is fanned out, into its state row; a claim of an
-- ordered subscription takes a due state only if no state of the same subscription and key
-- with a lower `seq` is unfinished (not completed; with on_failure 'skip', not failed either).
ALTER TABLE subscriptions ADD COLUMN ordered_by TEXT;
ALTER TABLE subscriptions ADD COLUMN on_failure TEXT NOT NULL DEFAULT 'hold';
ALTER TABLE event_state ADD COLUMN order_key TEXT;
-- The unfinished states of each key, in order: what a claim of an ordered subscription asks
-- about each candidate ("is an earlier one of its key unfinished?"), and the held keys.
CREATE INDEX events_ordered ON event_state (sub, order_key, seq)
    WHERE order_key IS NOT NULL AND status <> 'completed';
