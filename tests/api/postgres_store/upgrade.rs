//! PostgreSQL's migration 0003 (subscriptions) on a database of migration 0002 with events in
//! every state: each keeps its state, under the implicit subscription that handled it, its
//! history follows, and the store serves it as before.

use webhook_inbox::config::Database;
use webhook_inbox::store::Status;

use crate::pgdb::{PgDatabase, available};

#[test]
fn postgres_every_event_keeps_its_state_under_the_subscription_that_handled_it() {
    if !available() {
        return;
    }
    let db = PgDatabase::create();
    db.execute(include_str!("../../../migrations/postgres/0001_schema.sql"));
    db.execute(include_str!(
        "../../../migrations/postgres/0002_rejections.sql"
    ));
    db.execute(
        "CREATE TABLE schema_migrations (version integer NOT NULL PRIMARY KEY, name text NOT NULL,
                                         applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO schema_migrations (version, name) VALUES (1, 'schema'), (2, 'rejections');
         INSERT INTO events (seq, source, event_id, event_type, status, payload_sha256,
                             received_at, last_delivered_at, attempts, next_attempt_at,
                             claimed_until, claimed_by, claim_token, completed_at, outcome,
                             last_error, abandoned, lane, finished_at, purged_at)
         VALUES (1, 'shop', 'done', 'order.completed', 'completed', decode(repeat('00', 32), 'hex'),
                 1, 1, 1, NULL, NULL, NULL, NULL, 10, 'credited', NULL, false, 0, NULL, NULL),
                (2, 'shop', 'retrying', 'order.completed', 'pending', decode(repeat('00', 32), 'hex'),
                 2, 2, 2, 50, NULL, NULL, NULL, NULL, NULL, 'boom', false, 0, NULL, NULL),
                (3, 'shop', 'claimed', 'customer.created', 'claimed', decode(repeat('00', 32), 'hex'),
                 3, 3, 1, 3, 99, 'w', 'tok', NULL, NULL, NULL, false, 0, NULL, NULL),
                (4, 'shop', 'failed', 'customer.created', 'failed', decode(repeat('00', 32), 'hex'),
                 4, 4, 3, NULL, NULL, NULL, NULL, NULL, NULL, 'bad', false, 0, NULL, NULL),
                (5, 'requests', 'abandoned', 'request.submitted', 'failed',
                 decode(repeat('00', 32), 'hex'), 5, 5, 1, NULL, NULL, NULL, NULL, NULL, NULL,
                 'unknown', true, 1, NULL, NULL),
                (6, 'shop', 'purged', 'thing.done', 'completed', decode(repeat('00', 32), 'hex'),
                 6, 6, 1, NULL, NULL, NULL, NULL, 11, 'logged', NULL, false, 0, 12, 13),
                (7, 'requests', 'queued', 'request.submitted', 'pending',
                 decode(repeat('00', 32), 'hex'), 7, 7, 0, 7, NULL, NULL, NULL, NULL, NULL, NULL, false,
                 1, NULL, NULL);
         SELECT setval(pg_get_serial_sequence('events', 'seq'), 7);
         INSERT INTO event_payloads (seq, payload)
         SELECT seq, '{}'::bytea FROM events WHERE seq <> 6;
         INSERT INTO event_attempts (event_seq, attempt, worker, started_at, finished_at, result,
                                     error)
         VALUES (1, 1, 'w', 1, 2, 'ok', NULL), (2, 1, 'w', 2, 3, 'retryable_error', 'boom'),
                (2, 2, 'w', 4, 5, 'retryable_error', 'boom'), (3, 1, 'w', 3, NULL, NULL, NULL),
                (5, 1, 'w', 5, 6, 'lease_expired', 'lease expired');",
    );
    let store = webhook_inbox::store::open(&Database::Postgres(db.url.clone())).unwrap();
    // Every migration after the first two (a later one adds to the list by itself).
    let later: Vec<u32> = webhook_inbox::store::postgres::MIGRATIONS[2..]
        .iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(store.migrate().unwrap(), later);
    let expected = [
        (
            "shop",
            "done",
            "loyalty",
            Status::Completed,
            1,
            Some("credited"),
        ),
        ("shop", "retrying", "loyalty", Status::Pending, 2, None),
        ("shop", "claimed", "audit", Status::Claimed, 1, None),
        ("shop", "failed", "audit", Status::Failed, 3, None),
        (
            "requests",
            "abandoned",
            "downstream",
            Status::Failed,
            1,
            None,
        ),
        (
            "shop",
            "purged",
            "audit",
            Status::Completed,
            1,
            Some("logged"),
        ),
        ("requests", "queued", "downstream", Status::Pending, 0, None),
    ];
    for (source, id, sub, status, attempts, outcome) in expected {
        let detail = store.event(source, id).unwrap().expect("the event is kept");
        let e = &detail.event;
        assert_eq!((e.status, e.attempts), (status, attempts), "{id}");
        assert_eq!(e.outcome.as_deref(), outcome, "{id}");
        let states: Vec<_> = e.subscriptions.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(states, [sub], "{id}");
        for a in &detail.history {
            assert_eq!(a.subscription, sub, "{id}");
        }
    }
    let abandoned = store.event("requests", "abandoned").unwrap().unwrap().event;
    assert!(abandoned.abandoned);
    let purged = store.event("shop", "purged").unwrap().unwrap().event;
    assert_eq!(purged.purged_at, Some(13));
    assert_eq!(db.count("SELECT count(*) FROM event_attempts"), 5);
    assert_eq!(db.count("SELECT count(*) FROM event_state"), 7);
    // Served as before: a new event is fanned out and handled; the old pending one is due.
    let counts = store.status_counts().unwrap();
    assert_eq!((counts.pending, counts.claimed, counts.failed), (2, 1, 2));
}
