//! Lock order between a node finishing claimed events and another node's ingest counting
//! redeliveries of the same events (issue 40: "the fence/redelivery-counter deadlock"). Before
//! the log/state split (migration 0003) both wrote the event's one row, each batch in its own
//! order, and PostgreSQL aborted one of two such batches now and then. Since the split the
//! fence writes `event_state` and the redelivery `event_log` (the state's key share on its log
//! row does not conflict with an update of the counters), so neither waits for the other.
//! Hammered here: every call must succeed, none may be aborted as a deadlock. Seen failing
//! with the fence made to write the event's log row too (the shape before the split):
//! `deadlock detected (SQLSTATE 40P01)` within the first rounds.

use std::sync::{Arc, Barrier};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{Finish, InsertOutcome, Lane, Store};

use super::fresh::FreshDb;
use super::{ORDER, credit};
use crate::helpers::{new_delivery, order_body};

const EVENTS: usize = 64;
const ROUNDS: usize = 12;

#[test]
fn postgres_finishing_beside_another_nodes_redeliveries_never_deadlocks() {
    let Some(db) = FreshDb::create() else {
        return;
    };
    let worker_node = db.migrated();
    let ingest_node = db.node();
    for round in 0..ROUNDS {
        let deliveries: Vec<_> = (0..EVENTS)
            .map(|i| {
                // Order ids run the other way from event ids: a batch finished in order-id
                // order locks its events last first, a redelivery batch first first.
                let body = order_body(
                    &format!("o-{round}-{:03}", 999 - i),
                    &format!("c-{}", i % 5),
                    1,
                );
                new_delivery("shop", &format!("e-{round}-{i}"), ORDER, &body)
            })
            .collect();
        let stored = worker_node.insert_deliveries(&deliveries).unwrap();
        assert!(stored.iter().all(|o| *o == InsertOutcome::Queued));
        let claimed = worker_node
            .claim("w", Lane::InProcess, EVENTS, 60_000, now_ms())
            .unwrap();
        assert_eq!(claimed.len(), EVENTS);
        let barrier = Arc::new(Barrier::new(2));
        let finishing = {
            let (store, barrier) = (Arc::clone(&worker_node), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                for batch in claimed.chunks(32) {
                    let items: Vec<Finish> = batch
                        .iter()
                        .map(|c| {
                            let body: serde_json::Value =
                                serde_json::from_slice(&c.payload).unwrap();
                            let data = &body["data"];
                            Finish {
                                claim: c.claim.clone(),
                                next: credit(
                                    data["order_id"].as_str().unwrap(),
                                    data["customer_id"].as_str().unwrap(),
                                    1,
                                ),
                            }
                        })
                        .collect();
                    store.finish(&items, now_ms()).unwrap();
                }
            })
        };
        let redelivering = {
            let (store, barrier) = (Arc::clone(&ingest_node), Arc::clone(&barrier));
            let again = deliveries.clone();
            std::thread::spawn(move || {
                barrier.wait();
                // The same events, three times over, as a provider's retries.
                for _ in 0..3 {
                    for batch in again.chunks(32) {
                        let answers = store.insert_deliveries(batch).unwrap();
                        assert!(answers.iter().all(|o| *o == InsertOutcome::Duplicate));
                    }
                }
            })
        };
        finishing.join().expect("finishing: a batch was refused");
        redelivering
            .join()
            .expect("redelivering: a batch was refused");
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM event_state WHERE status = 'completed'"),
        (EVENTS * ROUNDS) as i64
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM loyalty_credits"),
        (EVENTS * ROUNDS) as i64
    );
}
