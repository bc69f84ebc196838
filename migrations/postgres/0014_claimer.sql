-- Who claims a subscription's events, as SQLite's migration 0021: `batch`, `one-at-a-time`
-- (`downstream`) or `own` (a forwarder, pull clients), decided by the kind in one place
-- (`subscriptions::Kind::claimer`) and kept, so that no claim lists kind strings.
ALTER TABLE subscriptions ADD COLUMN claimer text NOT NULL DEFAULT 'batch'
    CHECK (claimer IN ('batch', 'one-at-a-time', 'own'));
UPDATE subscriptions
   SET claimer = CASE WHEN kind IN ('http', 'nats', 'amqp', 'pull') THEN 'own'
                      WHEN kind = 'downstream' THEN 'one-at-a-time'
                      ELSE 'batch' END;
