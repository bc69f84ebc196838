//! The consumer side on PostgreSQL with several nodes: claims, fences, the loyalty guard and
//! the sweeper, raced through barriers.

use std::collections::HashSet;
use std::sync::Barrier;
use std::time::Duration;

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{
    Claimed, Expiry, Finished, InsertOutcome, Lane, Next, Outcome, Status, Store,
};

use super::fresh::FreshDb;
use super::{ORDER, credit, finish, page, wait_until};
use crate::helpers::{new_delivery, order_body, results};

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

/// A fan-out reads a bounded range of numbers past the cursor first (see
/// `plans::postgres_a_fan_out_reads_a_bounded_range_of_the_backlog_whatever_its_plan`); an event
/// behind a longer run of numbers that hold no event (each redelivery takes one) is still
/// claimed at the next claim, not one range further per claim.
#[test]
fn postgres_an_event_behind_a_long_run_of_redeliveries_is_claimed_at_the_next_claim() {
    let Some(db) = FreshDb::create() else { return };
    let store = db.migrated();
    let first = new_delivery("shop", "evt-1", ORDER, &order_body("o-1", "c-1", 5));
    store
        .insert_deliveries(std::slice::from_ref(&first))
        .unwrap();
    // 200 redeliveries, each in a group commit of its own (one takes a number; within a
    // batch they are answered together).
    for _ in 0..200 {
        assert_eq!(
            store
                .insert_deliveries(std::slice::from_ref(&first))
                .unwrap(),
            [InsertOutcome::Duplicate]
        );
    }
    let second = new_delivery("shop", "evt-2", ORDER, &order_body("o-2", "c-1", 5));
    store.insert_deliveries(&[second]).unwrap();
    let seqs: Vec<i64> = ["evt-1", "evt-2"]
        .iter()
        .map(|id| store.event("shop", id).unwrap().unwrap().event.seq)
        .collect();
    assert!(
        seqs[1] - seqs[0] > 2 * 4 * 10,
        "the redeliveries took no numbers between the two events: {seqs:?}"
    );
    // The first claim's range (four times its limit) holds the first event only; the second
    // one's, the next forty numbers, holds none.
    let a = store
        .claim("A", Lane::InProcess, 10, 60_000, now_ms())
        .unwrap();
    let ids =
        |c: &[Claimed]| -> Vec<String> { c.iter().map(|c| c.claim.event_id.clone()).collect() };
    assert_eq!(ids(&a), ["evt-1"]);
    let b = store
        .claim("A", Lane::InProcess, 10, 60_000, now_ms())
        .unwrap();
    assert_eq!(
        ids(&b),
        ["evt-2"],
        "the second claim reads past the run of numbers"
    );
    assert!(
        store
            .claim("A", Lane::InProcess, 10, 60_000, now_ms())
            .unwrap()
            .is_empty()
    );
}
