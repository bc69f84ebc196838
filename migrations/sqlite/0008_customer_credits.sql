-- A customer's credits, for `GET /loyalty/{customer_id}`, kept in two parts so that crediting
-- does not write a page per credit.
--
-- The index this replaces, `loyalty_credits (customer_id, credited_at)`, took each new credit
-- into the last leaf of its customer's run: a batch of 256 credits for 1,000 customers wrote
-- about 230 different leaves, and that index was 1.22 of the drain's 1.52 WAL frames per credit
-- (measured 280,000 credits into a drain; without it the drain ran twice as fast). Now:
--
-- - a new credit is appended to `loyalty_unlisted_credits` (in insertion order: one last page),
--   by the trigger below, in the transaction that inserts the credit;
-- - once that log holds 8,192 credits, the consumer that finds it so moves them, sorted by
--   customer, into `loyalty_customer_credits` in one transaction (each leaf written once for
--   all of its customer's new credits), and empties the log.
--
-- A listing reads both parts in one snapshot: every credit is in exactly one of them. Both are
-- derived from `loyalty_credits` and `events` (`webhook-inbox copy` fills them by the trigger). Credits of
-- an event that no longer exists are not listed, as before (the listing joined `events`).
CREATE TABLE loyalty_customer_credits (
    customer_id TEXT    NOT NULL,
    -- The seq of the event that earned the credit: the order and cursor of the listing.
    seq         INTEGER NOT NULL,
    order_id    TEXT    NOT NULL,
    PRIMARY KEY (customer_id, seq, order_id)
) WITHOUT ROWID;

CREATE TABLE loyalty_unlisted_credits (
    id          INTEGER PRIMARY KEY,
    customer_id TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    order_id    TEXT    NOT NULL
);

INSERT INTO loyalty_customer_credits (customer_id, seq, order_id)
SELECT c.customer_id, e.seq, c.order_id
  FROM loyalty_credits c
  JOIN events e ON e.source = c.source AND e.event_id = c.event_id
 ORDER BY 1, 2, 3;

DROP INDEX loyalty_credits_customer;

CREATE TRIGGER loyalty_credits_unlisted AFTER INSERT ON loyalty_credits
BEGIN
    INSERT INTO loyalty_unlisted_credits (customer_id, seq, order_id)
    SELECT NEW.customer_id, e.seq, NEW.order_id
      FROM events e
     WHERE e.source = NEW.source AND e.event_id = NEW.event_id;
END;
