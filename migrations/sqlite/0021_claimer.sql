-- Who claims a subscription's events (issue 59), decided by its kind in one place
-- (`subscriptions::Kind::claimer`) and kept here, so that no claim lists kind strings: `batch`,
-- the consumer workers' batches of in-process effects; `one-at-a-time`, the consumer workers'
-- at-most-once calls (`downstream`); `own`, a worker of its own (a forwarder, pull clients). A
-- node of an older version that lists kinds does not know a newer kind; one that reads this
-- column leaves any `own` subscription alone.
ALTER TABLE subscriptions ADD COLUMN claimer TEXT NOT NULL DEFAULT 'batch'
    CHECK (claimer = 'batch' OR claimer = 'one-at-a-time' OR claimer = 'own');
-- The kinds as this version knows them (what each node writes from now on).
UPDATE subscriptions
   SET claimer = CASE WHEN kind = 'http' OR kind = 'nats' OR kind = 'amqp' OR kind = 'pull'
                      THEN 'own'
                      WHEN kind = 'downstream' THEN 'one-at-a-time'
                      ELSE 'batch' END;
