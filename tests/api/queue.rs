//! The log-structured queue (migrations 0007 and 0009): a first attempt of lane 0 is a row of
//! the log with no state row, claimed in `seq` order from the cursor; submitted requests and
//! work that comes back have their state row and are claimed through the partial index
//! `events_due`. No event is skipped, none is claimed twice, and the counts `/metrics`
//! reports still add up.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{Claimed, Lane};

use crate::harness::Harness;

const LEASE_MS: i64 = 30_000;

fn claim(h: &Harness, lane: Lane, limit: usize) -> Vec<String> {
    ids(h.store.claim("w", lane, limit, LEASE_MS, now_ms()).unwrap())
}

/// Claims of up to `limit` until one finds nothing (bounded). Right after a store, the store
/// lets a consumer take only a quarter of its batch (ingest comes first), so one claim may
/// take fewer than it could.
fn claim_all(h: &Harness, lane: Lane, limit: usize) -> Vec<String> {
    let mut all = Vec::new();
    for _ in 0..100 {
        let got = claim(h, lane, limit);
        if got.is_empty() {
            break;
        }
        all.extend(got);
    }
    all
}

fn ids(claimed: Vec<Claimed>) -> Vec<String> {
    claimed.into_iter().map(|c| c.claim.event_id).collect()
}

fn event(id: &str) -> (&str, &str, &str, String) {
    ("shop", id, "customer.created", "{}".into())
}

fn request(id: &str) -> (&str, &str, &str, String) {
    ("requests", id, "request.submitted", "{}".into())
}

fn pending(h: &Harness) -> i64 {
    h.store.status_counts().unwrap().pending
}

#[test]
fn first_attempts_are_claimed_in_log_order_and_each_lane_skips_the_others() {
    let h = Harness::new(5, 30);
    h.insert(&[
        event("a"),
        request("r1"),
        event("b"),
        event("c"),
        request("r2"),
        event("d"),
    ]);
    // Stored events are in the log only: no state row, nothing in the index of due work;
    // the two requests have theirs.
    assert_eq!(
        h.count("SELECT count(*) FROM event_state WHERE lane = 0"),
        0
    );
    assert_eq!(
        h.count(
            "SELECT count(*) FROM event_state INDEXED BY events_due
              WHERE status = 'pending' AND lane = 1"
        ),
        2
    );
    assert_eq!(pending(&h), 6);
    assert_eq!(claim(&h, Lane::InProcess, 1), ["a"]);
    assert_eq!(claim(&h, Lane::InProcess, 1), ["b"]);
    assert_eq!(claim(&h, Lane::CallOut, 1), ["r1"]);
    assert_eq!(claim(&h, Lane::InProcess, 1), ["c"]);
    assert_eq!(pending(&h), 2);
    assert_eq!(claim_all(&h, Lane::InProcess, 3), ["d"]);
    assert_eq!(claim_all(&h, Lane::CallOut, 1), ["r2"]);
    assert!(claim(&h, Lane::InProcess, 3).is_empty());
    assert!(claim(&h, Lane::CallOut, 1).is_empty());
    assert_eq!(pending(&h), 0);
    assert_eq!(h.store.status_counts().unwrap().claimed, 6);
}

#[test]
fn a_lane_that_found_nothing_still_claims_what_arrives_later() {
    let h = Harness::new(5, 30);
    h.insert(&[event("a"), event("b")]);
    // The call-out lane finds nothing: its cursor moves to the end of the log.
    assert!(claim(&h, Lane::CallOut, 1).is_empty());
    assert!(claim(&h, Lane::CallOut, 1).is_empty());
    h.insert(&[request("r1"), event("c")]);
    assert_eq!(claim(&h, Lane::CallOut, 1), ["r1"]);
    // The in-process lane still starts where it was, and takes what came after too.
    assert_eq!(claim_all(&h, Lane::InProcess, 10), ["a", "b", "c"]);
    h.insert(&[event("d")]);
    assert_eq!(claim_all(&h, Lane::InProcess, 10), ["d"]);
    assert_eq!(pending(&h), 0);
}

#[test]
fn work_that_comes_back_is_claimed_through_the_index_before_new_work() {
    let h = Harness::new(5, 30);
    h.insert(&[event("a"), event("b")]);
    let claimed = h
        .store
        .claim("w", Lane::InProcess, 1, LEASE_MS, now_ms())
        .unwrap();
    assert_eq!(claimed[0].claim.event_id, "a");
    // Released (as at shutdown): pending again, due now, with one attempt used.
    let refs: Vec<_> = claimed.into_iter().map(|c| c.claim).collect();
    assert_eq!(h.store.release(&refs, now_ms()).unwrap(), 1);
    assert_eq!(
        h.count(
            "SELECT count(*) FROM event_state INDEXED BY events_due
              WHERE status = 'pending' AND lane = 0"
        ),
        1
    );
    h.insert(&[event("c")]);
    assert_eq!(pending(&h), 3);
    let counts = h.store.status_counts().unwrap();
    assert!(counts.oldest_due_at.is_some());
    assert_eq!(claim(&h, Lane::InProcess, 1), ["a"]);
    assert_eq!(claim_all(&h, Lane::InProcess, 5), ["b", "c"]);
    assert_eq!(h.detail("shop", "a").event.attempts, 2);
    assert_eq!(pending(&h), 0);
}

/// The count of first attempts waiting is the length of the log after the cursor, read
/// without the log: it holds only while the log's `seq` has no gaps. Batches with
/// redeliveries (within a batch and of stored events) and requests mixed in leave none, and
/// the counts stay exact through claims.
#[test]
fn batches_with_redeliveries_leave_no_gap_in_the_log_and_the_counts_stay_exact() {
    let h = Harness::new(5, 30);
    let gaps = |h: &Harness| h.count("SELECT max(seq) - min(seq) + 1 - count(*) FROM event_log");
    h.insert(&[
        event("a"),
        event("b"),
        event("a"),
        request("r1"),
        event("c"),
    ]);
    assert_eq!(gaps(&h), 0);
    assert_eq!(pending(&h), 4);
    h.insert(&[
        event("b"),
        event("d"),
        request("r1"),
        request("r2"),
        event("e"),
    ]);
    h.insert(&[event("a"), event("e")]);
    h.insert(&[event("f")]);
    assert_eq!(gaps(&h), 0);
    assert_eq!(h.count("SELECT count(*) FROM event_log"), 8);
    assert_eq!(pending(&h), 8);
    assert_eq!(claim(&h, Lane::InProcess, 1), ["a"]);
    assert_eq!(claim(&h, Lane::InProcess, 1), ["b"]);
    assert_eq!(pending(&h), 6);
    assert_eq!(claim(&h, Lane::CallOut, 1), ["r1"]);
    assert_eq!(pending(&h), 5);
    h.insert(&[event("g"), event("c")]);
    assert_eq!(gaps(&h), 0);
    assert_eq!(pending(&h), 6);
    assert_eq!(
        claim_all(&h, Lane::InProcess, 10),
        ["c", "d", "e", "f", "g"]
    );
    assert_eq!(pending(&h), 1);
    assert_eq!(claim_all(&h, Lane::CallOut, 10), ["r2"]);
    let counts = h.store.status_counts().unwrap();
    assert_eq!((counts.pending, counts.claimed), (0, 9));
    let deliveries = h.count("SELECT sum(deliveries) FROM event_log");
    assert_eq!(deliveries, 15, "every redelivery was counted on its event");
}

/// Four claimers released through a barrier while a writer keeps appending to both lanes:
/// every event is claimed exactly once, none is left behind a cursor.
#[test]
fn claimers_racing_appends_claim_every_event_exactly_once() {
    let h = Arc::new(Harness::new(5, 30));
    let total = 400;
    let barrier = Arc::new(Barrier::new(5));
    let writer = {
        let (h, barrier) = (Arc::clone(&h), Arc::clone(&barrier));
        std::thread::spawn(move || {
            barrier.wait();
            let mut n = 0;
            let mut size = 1;
            while n < total {
                let batch: Vec<(String, &str)> = (n..(n + size).min(total))
                    .map(|i| {
                        (
                            format!("e{i}"),
                            if i % 7 == 0 { "requests" } else { "shop" },
                        )
                    })
                    .collect();
                let refs: Vec<_> = batch
                    .iter()
                    .map(|(id, source)| {
                        if *source == "requests" {
                            request(id)
                        } else {
                            event(id)
                        }
                    })
                    .collect();
                h.insert(&refs);
                n += batch.len();
                size = size % 9 + 1;
            }
        })
    };
    let claimers: Vec<_> = (0..4)
        .map(|k| {
            let (h, barrier) = (Arc::clone(&h), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let lane = if k == 0 {
                    Lane::CallOut
                } else {
                    Lane::InProcess
                };
                let mut got = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(30);
                // Bounded: stop once everything was stored and a claim found nothing.
                while Instant::now() < deadline {
                    let stored = h.count("SELECT count(*) FROM events");
                    let claimed = h
                        .store
                        .claim(&format!("w{k}"), lane, 5, LEASE_MS, now_ms())
                        .unwrap();
                    if claimed.is_empty() && stored == total as i64 {
                        break;
                    }
                    got.extend(ids(claimed));
                }
                got
            })
        })
        .collect();
    writer.join().unwrap();
    let mut all: Vec<String> = claimers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    all.sort();
    let before = all.len();
    all.dedup();
    assert_eq!(before, all.len(), "an event was claimed twice");
    assert_eq!(all.len(), total, "an event was never claimed");
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE attempts <> 1"),
        0
    );
    assert_eq!(pending(&h), 0);
}

/// The cursor is what keeps a first attempt from being claimed twice, and the state row's
/// primary key backs it: a cursor put back behind claimed events (a hand edit, a bad restore)
/// makes the claim fail loudly, never claim an event a second time.
#[test]
fn a_cursor_put_back_cannot_claim_an_event_twice() {
    let h = Harness::new(5, 30);
    h.insert(&[event("a"), event("b")]);
    assert_eq!(claim_all(&h, Lane::InProcess, 5), ["a", "b"]);
    h.db.execute("UPDATE queue_cursor SET after_seq = 0");
    let again = h.store.claim("w", Lane::InProcess, 5, LEASE_MS, now_ms());
    assert!(again.is_err(), "claimed again: {again:?}");
    assert_eq!(
        h.count("SELECT count(*) FROM event_state WHERE attempts = 1 AND status = 'claimed'"),
        2
    );
    assert_eq!(h.count("SELECT count(*) FROM event_attempts"), 2);
}
