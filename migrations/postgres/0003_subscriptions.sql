-- Subscriptions (SPEC section 13), as far as this store has them: the implicit three of a
-- config that names none, each event handled by the one whose route takes it (a submitted
-- request by `downstream`, an `order.completed` by `loyalty`, anything else by `audit`), and
-- the state ops change per subscription (paused). The event's row keeps that subscription's
-- state; fanning one event out to several subscriptions needs the log/state split of SQLite's
-- migration 0011, not built here yet: a config naming other subscriptions is refused at start.
CREATE TABLE subscriptions (
    id         bigint  NOT NULL PRIMARY KEY,
    name       text    NOT NULL UNIQUE,
    kind       text    NOT NULL,
    paused     boolean NOT NULL DEFAULT false,
    created_at bigint  NOT NULL
);

INSERT INTO subscriptions (id, name, kind, created_at)
VALUES (1, 'loyalty', 'loyalty-credit', 0),
       (2, 'downstream', 'downstream', 0),
       (3, 'audit', 'audit', 0);
