-- A subscription's filter (SPEC section 13, issue 61): conditions on the body as JSON text,
-- checked when written and compiled into the fan-out statement. NULL: every event its route
-- takes. A nullable column: nothing is rewritten, and older nodes run beside it (they fan out
-- without the filter until they are upgraded).
ALTER TABLE subscriptions ADD COLUMN filter TEXT;
