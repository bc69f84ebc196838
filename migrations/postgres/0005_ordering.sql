-- Ordering per key (SPEC section 13, "Ordering"): a subscription with `ordered_by` (a JSON
-- pointer into the body) handles the events of one key one at a time, in the order they were
-- stored. The key is read once, when the event is fanned out, into its state row; a claim of an
-- ordered subscription takes a due state only if no state of the same subscription and key
-- with a lower `seq` is unfinished (not completed; with on_failure 'skip', not failed either).
-- Nullable columns and a new index: nothing is rewritten, and older nodes run beside it
-- (they never set a key, and this version's claims of unordered subscriptions are theirs).
ALTER TABLE subscriptions ADD COLUMN ordered_by text;
ALTER TABLE subscriptions ADD COLUMN on_failure text NOT NULL DEFAULT 'hold';
ALTER TABLE event_state ADD COLUMN order_key text;
CREATE INDEX events_ordered ON event_state (sub, order_key, seq)
    WHERE order_key IS NOT NULL AND status <> 'completed';

-- The key of one body: the text at `path`, or NULL when the body is not JSON, has no such
-- field, or is not UTF-8 (a body is never refused here: it only has no key).
CREATE FUNCTION webhook_inbox_order_key(body bytea, path text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(body, 'UTF8')::jsonb #>> path;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
