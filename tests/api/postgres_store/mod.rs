//! The PostgreSQL store at the store level: each test gets a database of its own on the
//! server `TEST_POSTGRES_URL` names, and several pools on it play several nodes. Concurrency
//! guarantees are shown by threads released through a barrier.

mod cluster;
mod consumers;
mod contract;
mod deadlocks;
mod fresh;
mod operations;
mod subscriptions;
mod upgrade;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{
    Claimed, Effect, Finish, Finished, InsertOutcome, Next, Outcome, Readiness, Status, Store,
};

use crate::helpers::{new_delivery, order_body};
use fresh::FreshDb;

pub const ORDER: &str = "order.completed";

pub fn credit(order: &str, customer: &str, points: i64) -> Next {
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

pub fn finish(store: &dyn Store, claimed: &Claimed, next: Next) -> Finished {
    let item = Finish {
        claim: claimed.claim.clone(),
        next,
    };
    store.finish(&[item], now_ms()).unwrap()[0]
}

/// Poll `f` every 10 ms until it holds, at most `within`.
pub fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn page() -> webhook_inbox::store::Page {
    webhook_inbox::store::Page {
        limit: 50,
        before_seq: None,
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
