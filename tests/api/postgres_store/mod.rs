//! The PostgreSQL store at the store level: each test gets a database of its own on the
//! server `TEST_POSTGRES_URL` names, and several pools on it play several nodes. Concurrency
//! guarantees are shown by threads released through a barrier.

mod cluster;
mod fresh;

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{
    Claimed, Effect, Expiry, Finish, Finished, InsertOutcome, Lane, Next, Outcome, Readiness,
    Status, Store, StoreError,
};

use crate::helpers::{new_delivery, order_body, results};
use fresh::FreshDb;

const ORDER: &str = "order.completed";

fn credit(order: &str, customer: &str, points: i64) -> Next {
    Next::Complete {
        effect: Some(Effect::LoyaltyCredit {
            consumer: "loyalty_credit",
            order_id: order.into(),
            customer_id: customer.into(),
            points,
        }),
        outcome: Outcome::Credited,
    }
}

fn finish(store: &dyn Store, claimed: &Claimed, next: Next) -> Finished {
    let item = Finish {
        claim: claimed.claim.clone(),
        next,
    };
    store.finish(&[item], now_ms()).unwrap()[0]
}

/// Poll `f` every 10 ms until it holds, at most `within`.
fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn postgres_migrations_apply_once_even_from_two_nodes_at_once_and_then_nothing() {
    let Some(db) = FreshDb::create() else { return };
    let (a, b) = (db.node(), db.node());
    assert_eq!(a.ready().unwrap(), Readiness::NotMigrated);
    let barrier = Barrier::new(2);
    let applied: Vec<Vec<u32>> = std::thread::scope(|s| {
        let runs = [&a, &b].map(|node| {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                node.migrate().unwrap()
            })
        });
        runs.map(|r| r.join().unwrap()).to_vec()
    });
    let all: Vec<u32> = webhook_inbox::store::postgres::MIGRATIONS
        .iter()
        .map(|m| m.0)
        .collect();
    let mut seen = applied.concat();
    seen.sort();
    assert_eq!(seen, all, "each migration applied by exactly one node");
    assert_eq!(
        a.migrate().unwrap(),
        Vec::<u32>::new(),
        "a second run applies nothing"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM schema_migrations"),
        all.len() as i64
    );
    assert_eq!(a.ready().unwrap(), Readiness::Ready);
    assert_eq!(b.ready().unwrap(), Readiness::Ready);
}

#[test]
fn postgres_duplicates_and_mismatches_within_a_batch_are_answered_as_on_sqlite() {
    let Some(db) = FreshDb::create() else { return };
    let store = db.migrated();
    let first = new_delivery("shop", "evt-1", ORDER, "{\"a\":1}");
    let other_body = new_delivery("shop", "evt-1", ORDER, "{\"a\":2}");
    let strict = webhook_inbox::store::NewDelivery {
        reject_mismatch: true,
        ..other_body.clone()
    };
    let unrelated = new_delivery("shop", "evt-2", ORDER, "{}");
    let batch = [first.clone(), first.clone(), other_body, strict, unrelated];
    use InsertOutcome::*;
    assert_eq!(
        store.insert_deliveries(&batch).unwrap(),
        [Queued, Duplicate, Mismatch, MismatchRejected, Queued]
    );
    // A later batch (another node's, say) sees the first body.
    assert_eq!(store.insert_deliveries(&[first]).unwrap(), [Duplicate]);
    let event = store.event("shop", "evt-1").unwrap().unwrap();
    assert_eq!(event.event.deliveries, 5);
    assert_eq!(event.event.payload_mismatches, 2);
    assert_eq!(event.payload, b"{\"a\":1}");
    assert_eq!(event.event.status, Status::Pending);
    assert_eq!(db.scalar("SELECT count(*) FROM events"), 2);
}

#[test]
fn postgres_one_delivery_sent_to_many_nodes_at_once_is_queued_exactly_once() {
    let Some(db) = FreshDb::create() else { return };
    db.migrated();
    const NODES: usize = 8;
    let nodes: Vec<_> = (0..NODES).map(|_| db.node()).collect();
    let barrier = Barrier::new(NODES);
    let delivery = new_delivery("shop", "evt-race", ORDER, &order_body("o-1", "c-1", 5));
    let outcomes: Vec<InsertOutcome> = std::thread::scope(|s| {
        let runs: Vec<_> = nodes
            .iter()
            .map(|node| {
                let (barrier, delivery) = (&barrier, &delivery);
                s.spawn(move || {
                    barrier.wait();
                    node.insert_deliveries(std::slice::from_ref(delivery))
                        .unwrap()[0]
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let queued = outcomes
        .iter()
        .filter(|o| **o == InsertOutcome::Queued)
        .count();
    assert_eq!(queued, 1, "{outcomes:?}");
    assert_eq!(db.scalar("SELECT deliveries FROM events"), NODES as i64);
}

#[test]
fn postgres_concurrent_claims_from_two_nodes_never_hand_one_event_to_two_workers() {
    let Some(db) = FreshDb::create() else { return };
    let nodes = [db.migrated(), db.node()];
    const EVENTS: usize = 300;
    let batch: Vec<_> = (0..EVENTS)
        .map(|i| new_delivery("shop", &format!("e-{i}"), "audit.thing", "{}"))
        .collect();
    nodes[0].insert_deliveries(&batch).unwrap();
    const WORKERS: usize = 8;
    let barrier = Barrier::new(WORKERS);
    let claimed: Vec<Vec<i64>> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (node, barrier) = (&nodes[w % 2], &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut mine = Vec::new();
                    // Bounded: every round claims at least one event or ends the loop.
                    for _ in 0..EVENTS {
                        let got = node
                            .claim(&format!("w{w}"), Lane::InProcess, 7, 60_000, now_ms())
                            .unwrap();
                        if got.is_empty() {
                            break;
                        }
                        mine.extend(got.iter().map(|c| c.claim.seq));
                    }
                    mine
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let all: Vec<i64> = claimed.concat();
    let distinct: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(
        all.len(),
        distinct.len(),
        "an event was handed to two workers"
    );
    assert_eq!(distinct.len(), EVENTS, "every due event was claimed");
    assert_eq!(
        db.scalar("SELECT count(*) FROM event_attempts"),
        EVENTS as i64
    );
    assert_eq!(db.scalar("SELECT max(attempts) FROM events"), 1);
}

#[test]
fn postgres_a_completion_after_lease_loss_writes_nothing() {
    let Some(db) = FreshDb::create() else { return };
    let store = db.migrated();
    store
        .insert_deliveries(&[new_delivery(
            "shop",
            "evt-1",
            ORDER,
            &order_body("o-1", "c-1", 10),
        )])
        .unwrap();
    let a = store.claim("A", Lane::InProcess, 1, 50, now_ms()).unwrap();
    assert_eq!(a.len(), 1);
    // The lease runs out by the database's clock (polled, bounded).
    wait_until(Duration::from_secs(5), "the lease to expire", || {
        db.scalar(&format!(
            "SELECT count(*) FROM events WHERE claimed_until <= {}",
            webhook_inbox::store::postgres::NOW_MS
        )) == 1
    });
    assert_eq!(
        finish(store.as_ref(), &a[0], credit("o-1", "c-1", 10)),
        Finished::LeaseLost
    );
    assert_eq!(store.loyalty("c-1", page()).unwrap().balance, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM loyalty_credits"), 0);
    assert_eq!(db.scalar("SELECT count(*) FROM processed_events"), 0);
    let retry = |_: &_| Expiry::Retry {
        error: "lease expired".into(),
    };
    assert_eq!(store.sweep(now_ms(), &retry).unwrap(), 1);
    let b = store
        .claim("B", Lane::InProcess, 1, 60_000, now_ms())
        .unwrap();
    assert_eq!(b.len(), 1);
    // A is still refused while B holds the event; B credits.
    assert_eq!(
        finish(store.as_ref(), &a[0], credit("o-1", "c-1", 10)),
        Finished::LeaseLost
    );
    assert!(matches!(
        finish(store.as_ref(), &b[0], credit("o-1", "c-1", 10)),
        Finished::Completed {
            outcome: Outcome::Credited,
            ..
        }
    ));
    assert_eq!(store.loyalty("c-1", page()).unwrap().balance, 10);
    let d = store.event("shop", "evt-1").unwrap().unwrap();
    assert_eq!(d.event.status, Status::Completed);
    assert_eq!(results(&d), ["lease_expired", "ok"]);
}

fn page() -> webhook_inbox::store::Page {
    webhook_inbox::store::Page {
        limit: 50,
        before_seq: None,
    }
}

#[test]
fn postgres_two_events_of_one_order_finished_at_once_on_two_nodes_credit_once() {
    let Some(db) = FreshDb::create() else { return };
    let nodes = [db.migrated(), db.node()];
    const ROUNDS: usize = 20;
    for round in 0..ROUNDS {
        let order = format!("o-{round}");
        let body = order_body(&order, "c-1", 7);
        nodes[0]
            .insert_deliveries(&[
                new_delivery("shop", &format!("a-{round}"), ORDER, &body),
                new_delivery("shop", &format!("b-{round}"), ORDER, &body),
            ])
            .unwrap();
        let claimed = nodes[0]
            .claim("w", Lane::InProcess, 2, 60_000, now_ms())
            .unwrap();
        assert_eq!(claimed.len(), 2);
        let barrier = Barrier::new(2);
        let finished: Vec<Finished> = std::thread::scope(|s| {
            let runs: Vec<_> = claimed
                .iter()
                .zip(&nodes)
                .map(|(c, node)| {
                    let (barrier, order) = (&barrier, &order);
                    s.spawn(move || {
                        barrier.wait();
                        finish(node.as_ref(), c, credit(order, "c-1", 7))
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let outcomes: Vec<Outcome> = finished
            .iter()
            .map(|f| match f {
                Finished::Completed { outcome, .. } => *outcome,
                other => panic!("round {round}: {other:?}"),
            })
            .collect();
        assert!(
            outcomes.contains(&Outcome::Credited) && outcomes.contains(&Outcome::DuplicateOrder),
            "round {round}: {outcomes:?}"
        );
    }
    assert_eq!(
        nodes[1].loyalty("c-1", page()).unwrap().balance,
        7 * ROUNDS as i64
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM loyalty_credits"),
        ROUNDS as i64
    );
}

#[test]
fn postgres_two_nodes_sweeping_at_once_settle_each_expired_claim_once() {
    let Some(db) = FreshDb::create() else { return };
    let nodes = [db.migrated(), db.node()];
    const EVENTS: usize = 100;
    let batch: Vec<_> = (0..EVENTS)
        .map(|i| new_delivery("requests", &format!("r-{i}"), "request.submitted", "{}"))
        .collect();
    nodes[0].insert_deliveries(&batch).unwrap();
    let claimed: Vec<Claimed> = (0..EVENTS)
        .flat_map(|_| {
            nodes[0]
                .claim("dead", Lane::CallOut, 1, 1, now_ms())
                .unwrap()
        })
        .collect();
    assert_eq!(claimed.len(), EVENTS);
    // One claim completes before the sweep: a terminal state is never overwritten.
    let survivor = nodes[0]
        .insert_deliveries(&[new_delivery(
            "requests",
            "r-live",
            "request.submitted",
            "{}",
        )])
        .map(|_| {
            nodes[0]
                .claim("live", Lane::CallOut, 1, 60_000, now_ms())
                .unwrap()
        })
        .unwrap();
    wait_until(
        Duration::from_secs(5),
        "every short lease to expire",
        || {
            db.scalar(&format!(
                "SELECT count(*) FROM events WHERE claimed_until <= {}",
                webhook_inbox::store::postgres::NOW_MS
            )) == EVENTS as i64
        },
    );
    let abandon = |_: &_| Expiry::Fail {
        error: "abandoned".into(),
        abandoned: true,
    };
    let barrier = Barrier::new(2);
    let swept: usize = std::thread::scope(|s| {
        let runs: Vec<_> = nodes
            .iter()
            .map(|node| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    node.sweep(now_ms(), &abandon).unwrap()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).sum()
    });
    assert_eq!(swept, EVENTS, "each expired claim settled once");
    assert_eq!(
        db.scalar("SELECT count(*) FROM event_attempts WHERE result = 'lease_expired'"),
        EVENTS as i64
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM events WHERE status = 'failed' AND abandoned"),
        EVENTS as i64
    );
    // The live claim was left alone and completes; nothing more to sweep, nothing due.
    let done = finish(
        nodes[1].as_ref(),
        &survivor[0],
        Next::Complete {
            effect: None,
            outcome: Outcome::Delivered,
        },
    );
    assert!(matches!(done, Finished::Completed { .. }));
    assert_eq!(nodes[1].sweep(now_ms(), &abandon).unwrap(), 0);
    assert!(
        nodes[1]
            .claim("w", Lane::CallOut, 10, 1000, now_ms())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn postgres_readiness_and_writes_on_a_stopped_server_are_unavailable_and_recover() {
    let Some(server) = cluster::Cluster::start() else {
        return;
    };
    let store =
        webhook_inbox::store::postgres::PostgresStore::open(&server.url(), Default::default())
            .unwrap();
    store.migrate().unwrap();
    assert_eq!(store.ready().unwrap(), Readiness::Ready);
    server.stop();
    let started = Instant::now();
    assert!(matches!(store.ready(), Err(StoreError::Unavailable(_))));
    let delivery = new_delivery("shop", "evt-down", ORDER, "{}");
    assert!(matches!(
        store.insert_deliveries(std::slice::from_ref(&delivery)),
        Err(StoreError::Unavailable(_))
    ));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answers took {:?}: a wait is not bounded",
        started.elapsed()
    );
    server.start_again();
    // The pool replaces its dead connections by itself (bounded poll).
    wait_until(
        Duration::from_secs(15),
        "readiness after the restart",
        || matches!(store.ready(), Ok(Readiness::Ready)),
    );
    assert_eq!(
        store.insert_deliveries(&[delivery]).unwrap(),
        [InsertOutcome::Queued]
    );
}

#[test]
fn postgres_a_commit_that_queues_work_wakes_idle_consumers_on_another_node() {
    let Some(db) = FreshDb::create() else { return };
    let (listening, sending) = (db.migrated(), db.node());
    let wake = Arc::new(tokio::sync::Notify::new());
    listening.on_queued(Arc::clone(&wake));
    // Wait until the listener's LISTEN is in place (its first wake-up is then past).
    wait_until(Duration::from_secs(10), "the LISTEN connection", || {
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        ) == 1
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    for i in 0..3 {
        let woken = runtime.block_on(async {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            sending
                .insert_deliveries(&[new_delivery("shop", &format!("n-{i}"), ORDER, "{}")])
                .unwrap();
            tokio::time::timeout(Duration::from_secs(5), notified).await
        });
        assert!(woken.is_ok(), "delivery {i} woke nobody on the other node");
    }
}

#[test]
fn postgres_a_sqlite_database_copied_in_keeps_every_row_and_its_dedup() {
    use webhook_inbox::store::copy::{TABLES, copy_all};
    use webhook_inbox::store::sqlite::{SqliteOptions, SqliteStore};
    let Some(db) = FreshDb::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(&dir.path().join("s.db"), SqliteOptions::default()).unwrap();
    sqlite.migrate().unwrap();
    let batch: Vec<_> = (0..30)
        .map(|i| {
            new_delivery(
                "shop",
                &format!("e-{i}"),
                ORDER,
                &order_body(&format!("o-{}", i % 20), "c-1", 3),
            )
        })
        .collect();
    sqlite.insert_deliveries(&batch).unwrap();
    for c in sqlite
        .claim("w", Lane::InProcess, 30, 60_000, now_ms())
        .unwrap()
    {
        let order = format!("o-{}", c.claim.event_id[2..].parse::<usize>().unwrap() % 20);
        finish(&sqlite, &c, credit(&order, "c-1", 3));
    }
    let now = now_ms();
    sqlite.create_request("req-1", now).unwrap();
    let doc = webhook_inbox::store::NewDocument {
        id: "doc-1".into(),
        name: "a.pdf".into(),
        content_type: "application/pdf".into(),
        content: vec![0, 159, 146, 150],
    };
    sqlite.add_document("req-1", &doc, now).unwrap();
    sqlite.submit_request("req-1", now).unwrap();
    let pg = db.migrated();
    copy_all(&sqlite, pg.as_ref(), false, &mut |_, _, _| {}).unwrap();
    for table in TABLES {
        assert_eq!(
            pg.copy_out(table, &[], 10_000).unwrap(),
            sqlite.copy_out(table, &[], 10_000).unwrap(),
            "table {}",
            table.name
        );
    }
    let balance = sqlite.loyalty("c-1", page()).unwrap().balance;
    assert!(balance > 0);
    assert_eq!(pg.loyalty("c-1", page()).unwrap().balance, balance);
    // The copied keys go on deduplicating; a new event gets a seq after every copied one.
    assert_eq!(
        pg.insert_deliveries(&batch[..1]).unwrap(),
        [InsertOutcome::Duplicate]
    );
    pg.insert_deliveries(&[new_delivery("shop", "new", ORDER, "{}")])
        .unwrap();
    let newest = pg.event("shop", "new").unwrap().unwrap().event.seq;
    assert!(newest > db.scalar("SELECT max(seq) FROM events WHERE event_id <> 'new'"));
}
