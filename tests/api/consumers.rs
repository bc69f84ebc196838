//! The consumer side (SPEC section 4) against real SQLite files: atomic claims under real
//! concurrency, fenced completion, the sweeper, retries, and the loyalty guards.

use std::sync::{Arc, Barrier};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{InsertOutcome, Lane, Status};

use crate::helpers::*;
use crate::stores::{StoreKind, store_tests};

const ORDER: &str = "order.completed";

fn six_workers_released_together_handle_each_of_240_events_exactly_once(kind: StoreKind) {
    six_workers_handle_each_event_once(kind, false);
}

/// The pool's loop: each batch's completion and the next claim share a transaction.
fn six_pipelined_workers_released_together_handle_each_event_exactly_once(kind: StoreKind) {
    six_workers_handle_each_event_once(kind, true);
}

fn six_workers_handle_each_event_once(kind: StoreKind, pipelined: bool) {
    let h = Harness::on(kind, 5, 30);
    let deliveries: Vec<_> = (0..240)
        .map(|i| {
            (
                "shop",
                format!("evt-{i}"),
                ORDER,
                order_body(&format!("o-{i}"), &format!("c-{}", i % 7), 1 + i % 5),
            )
        })
        .collect();
    let refs: Vec<_> = deliveries
        .iter()
        .map(|(s, id, t, b)| (*s, id.as_str(), *t, b.clone()))
        .collect();
    assert!(h.insert(&refs).iter().all(|o| *o == InsertOutcome::Queued));

    let workers = 6;
    let barrier = Arc::new(Barrier::new(workers));
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let consumer = Arc::clone(&h.consumer);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let mut claimed = 0;
                // Small batches so that the workers really interleave; bounded passes.
                for _ in 0..500 {
                    let n = if pipelined {
                        consumer
                            .run_until_idle(&format!("w{w}"), 4, &|| false)
                            .unwrap()
                    } else {
                        consumer.run_once(&format!("w{w}"), 4, &|| false).unwrap()
                    };
                    if n == 0 {
                        break;
                    }
                    claimed += n;
                }
                claimed
            })
        })
        .collect();
    let per_worker: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        per_worker.iter().sum::<usize>(),
        240,
        "claims: {per_worker:?}"
    );
    assert!(
        per_worker.iter().filter(|n| **n > 0).count() > 1,
        "only one worker worked: {per_worker:?}"
    );

    // One handler call, one attempt, one history row, one effect per event.
    assert_eq!(h.loyalty.total_calls(), 240);
    for i in 0..240 {
        assert_eq!(h.loyalty.calls_for(&format!("evt-{i}")), 1, "evt-{i}");
    }
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE status = 'completed' AND attempts = 1"),
        240
    );
    assert_eq!(h.count("SELECT count(*) FROM event_attempts"), 240);
    assert_eq!(
        h.count("SELECT count(*) FROM event_attempts WHERE result = 'ok'"),
        240
    );
    assert_eq!(h.count("SELECT count(*) FROM loyalty_credits"), 240);
    let expected: i64 = (0..240).map(|i| 1 + i % 5).sum();
    assert_eq!(
        h.count("SELECT sum(balance) FROM loyalty_balances"),
        expected
    );
}

fn a_business_duplicate_completes_as_duplicate_order_and_moves_no_balance(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    h.insert(&[
        ("shop", "evt-1", ORDER, order_body("o-1", "c-1", 10)),
        ("shop", "evt-2", ORDER, order_body("o-1", "c-1", 10)),
        // The same order id as an integer is the same order.
        (
            "other",
            "evt-3",
            ORDER,
            r#"{"order_id": 77, "customer_id": "c-1", "points": 5}"#.into(),
        ),
        (
            "other",
            "evt-4",
            ORDER,
            r#"{"order_id": "77", "customer_id": "c-1", "points": 5}"#.into(),
        ),
    ]);
    h.drain();
    assert_eq!(h.balance("c-1"), 15);
    let outcomes: Vec<_> = ["evt-1", "evt-2"]
        .iter()
        .map(|id| h.detail("shop", id).event.outcome.unwrap())
        .collect();
    assert_eq!(outcomes, ["credited", "duplicate_order"]);
    assert_eq!(
        h.detail("other", "evt-4").event.outcome.as_deref(),
        Some("duplicate_order")
    );
    for (s, id) in [("shop", "evt-1"), ("shop", "evt-2"), ("other", "evt-4")] {
        assert_eq!(results(&h.detail(s, id)), ["ok"]);
    }
}

fn a_redelivered_event_reaches_the_handler_once(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let body = order_body("o-1", "c-1", 10);
    let first = h.insert(&[("shop", "evt-1", ORDER, body.clone())]);
    h.drain();
    let again = h.insert(&[
        ("shop", "evt-1", ORDER, body.clone()),
        ("shop", "evt-1", ORDER, body),
    ]);
    assert_eq!(first, [InsertOutcome::Queued]);
    assert_eq!(again, [InsertOutcome::Duplicate, InsertOutcome::Duplicate]);
    assert_eq!(h.drain(), 0);
    assert_eq!(h.loyalty.calls_for("evt-1"), 1);
    assert_eq!(h.balance("c-1"), 10);
    let d = h.detail("shop", "evt-1");
    assert_eq!(d.event.deliveries, 3);
    assert_eq!(results(&d), ["ok"]);
}

fn a_bad_payload_fails_at_once_naming_the_field(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    h.insert(&[
        (
            "shop",
            "no-order",
            ORDER,
            r#"{"data": {"customer_id": "c", "points": 1}}"#.into(),
        ),
        (
            "shop",
            "no-customer",
            ORDER,
            r#"{"order_id": "o", "points": 1}"#.into(),
        ),
        (
            "shop",
            "bad-points",
            ORDER,
            r#"{"order_id": "o", "customer_id": "c", "points": -3}"#.into(),
        ),
        (
            "shop",
            "str-points",
            ORDER,
            r#"{"order_id": "o", "customer_id": "c", "points": "3"}"#.into(),
        ),
    ]);
    h.drain();
    for (id, field) in [
        ("no-order", "order_id"),
        ("no-customer", "customer_id"),
        ("bad-points", "points"),
        ("str-points", "points"),
    ] {
        let d = h.detail("shop", id);
        assert_eq!(d.event.status, Status::Failed, "{id}");
        assert_eq!(
            d.event.attempts, 1,
            "{id}: permanent errors are not retried"
        );
        assert!(
            d.event.last_error.as_deref().unwrap().contains(field),
            "{id}: {:?}",
            d.event.last_error
        );
        assert_eq!(results(&d), ["permanent_error"]);
    }
    assert_eq!(h.count("SELECT count(*) FROM loyalty_credits"), 0);
}

/// One event whose effect the database refuses fails alone, with the database's reason: its
/// savepoint undoes its own writes (the consumer dedup row included) and the other events of
/// the same batch commit.
fn an_effect_the_database_refuses_fails_that_event_alone(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    h.db.refuse_credits_for("o-poison");
    h.insert(&[
        ("shop", "evt-1", ORDER, order_body("o-1", "c-1", 10)),
        ("shop", "evt-2", ORDER, order_body("o-poison", "c-1", 100)),
        ("shop", "evt-3", ORDER, order_body("o-3", "c-1", 5)),
    ]);
    assert_eq!(h.drain(), 3);
    assert_eq!(h.balance("c-1"), 15);
    for id in ["evt-1", "evt-3"] {
        let d = h.detail("shop", id);
        assert_eq!(d.event.status, Status::Completed, "{id}");
        assert_eq!(results(&d), ["ok"], "{id}");
    }
    let d = h.detail("shop", "evt-2");
    assert_eq!(d.event.status, Status::Failed);
    assert_eq!(d.event.attempts, 1, "a refused effect is not retried");
    let error = d.event.last_error.clone().unwrap();
    assert!(error.contains("order o-poison is refused"), "{error}");
    assert_eq!(results(&d), ["permanent_error"]);
    assert_eq!(h.loyalty.calls_for("evt-2"), 1);
    assert_eq!(
        h.count("SELECT count(*) FROM processed_events WHERE event_id = 'evt-2'"),
        0,
        "the refused event's dedup row went with its savepoint"
    );
    assert_eq!(h.count("SELECT count(*) FROM loyalty_credits"), 2);
}

/// Store an `order.completed` event for each of `ids` and claim them all (right after an
/// ingest write the store hands out smaller batches: claim until all are), in `seq` order.
fn store_and_claim(h: &Harness, ids: &[&str], now: i64) -> Vec<webhook_inbox::store::Claimed> {
    let deliveries: Vec<_> = ids
        .iter()
        .map(|id| ("shop", *id, ORDER, "{}".to_string()))
        .collect();
    h.insert(&deliveries);
    let mut claimed = Vec::new();
    for _ in 0..10 {
        claimed.extend(
            h.store
                .claim("w", Lane::InProcess, 10, 30_000, now)
                .unwrap(),
        );
    }
    claimed.sort_by_key(|c| c.claim.seq);
    assert_eq!(claimed.len(), ids.len());
    claimed
}

/// The same at the store: a batch holding a credit, a refused credit, a lost claim and another
/// credit gets each its own result, and nothing of the refused or the lost one is written.
fn one_finish_batch_gives_each_event_its_own_result(kind: StoreKind) {
    use webhook_inbox::store::{AttemptResult, Effect, Finish, Finished, Next, Outcome};
    let h = Harness::on(kind, 5, 30);
    h.db.refuse_credits_for("o-2");
    let ids = ["evt-1", "evt-2", "evt-3", "evt-4"];
    let now = now_ms();
    let claimed = store_and_claim(&h, &ids, now);
    let items: Vec<Finish> = claimed
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let mut claim = c.claim;
            if i == 2 {
                claim.claim_token = "not-the-token".into();
            }
            Finish {
                claim,
                next: Next::Complete {
                    effect: Some(Effect::LoyaltyCredit {
                        consumer: "loyalty_credit",
                        order_id: format!("o-{}", i + 1),
                        customer_id: "c-1".into(),
                        points: 10 * (i as i64 + 1),
                    }),
                    outcome: Outcome::Credited,
                },
            }
        })
        .collect();
    let credited = Finished::Completed {
        outcome: Outcome::Credited,
        result: AttemptResult::Ok,
    };
    assert_eq!(
        h.store.finish(&items, now).unwrap(),
        [credited, Finished::Failed, Finished::LeaseLost, credited]
    );
    assert_eq!(h.balance("c-1"), 10 + 40);
    assert_eq!(h.count("SELECT count(*) FROM processed_events"), 2);
    assert_eq!(h.count("SELECT count(*) FROM loyalty_credits"), 2);
    let statuses: Vec<Status> = ids
        .iter()
        .map(|id| h.detail("shop", id).event.status)
        .collect();
    assert_eq!(
        statuses,
        [
            Status::Completed,
            Status::Failed,
            Status::Claimed,
            Status::Completed
        ]
    );
    assert_eq!(results(&h.detail("shop", "evt-2")), ["permanent_error"]);
    assert_eq!(results(&h.detail("shop", "evt-3")), ["open"]);
}

/// A batch finished at once (one statement per phase on PostgreSQL): completions, a retry, a
/// failure and a completion without effect side by side, two events of one order among them.
/// Each gets its own result, the order is credited once, to the first of its events.
fn one_finish_batch_of_every_transition_credits_a_shared_order_once(kind: StoreKind) {
    use webhook_inbox::store::{AttemptResult, Effect, Finish, Finished, Next, Outcome};
    let h = Harness::on(kind, 5, 30);
    let ids = ["evt-1", "evt-2", "evt-3", "evt-4", "evt-5", "evt-6"];
    let now = now_ms();
    let claimed = store_and_claim(&h, &ids, now);
    let credit = |order: &str, points| Next::Complete {
        effect: Some(Effect::LoyaltyCredit {
            consumer: "loyalty_credit",
            order_id: order.into(),
            customer_id: "c-1".into(),
            points,
        }),
        outcome: Outcome::Credited,
    };
    let next = [
        credit("o-1", 10),
        Next::Retry {
            at: now + 60_000,
            error: "try later".into(),
        },
        credit("o-1", 20),
        Next::Fail {
            error: "bad".into(),
            result: AttemptResult::PermanentError,
            abandoned: false,
        },
        Next::Complete {
            effect: None,
            outcome: Outcome::Logged,
        },
        credit("o-2", 5),
    ];
    let items: Vec<Finish> = claimed
        .into_iter()
        .zip(next)
        .map(|(c, next)| Finish {
            claim: c.claim,
            next,
        })
        .collect();
    let ok = |outcome| Finished::Completed {
        outcome,
        result: AttemptResult::Ok,
    };
    assert_eq!(
        h.store.finish(&items, now).unwrap(),
        [
            ok(Outcome::Credited),
            Finished::Retrying,
            ok(Outcome::DuplicateOrder),
            Finished::Failed,
            ok(Outcome::Logged),
            ok(Outcome::Credited),
        ]
    );
    assert_eq!(h.balance("c-1"), 15);
    assert_eq!(h.count("SELECT count(*) FROM loyalty_credits"), 2);
    assert_eq!(h.count("SELECT count(*) FROM processed_events"), 3);
    let outcome = |id| h.detail("shop", id).event.outcome;
    assert_eq!(outcome("evt-1").as_deref(), Some("credited"));
    assert_eq!(outcome("evt-3").as_deref(), Some("duplicate_order"));
    assert_eq!(outcome("evt-5").as_deref(), Some("logged"));
    let statuses: Vec<Status> = ids
        .iter()
        .map(|id| h.detail("shop", id).event.status)
        .collect();
    use Status::*;
    assert_eq!(
        statuses,
        [Completed, Pending, Completed, Failed, Completed, Completed]
    );
    let each: Vec<Vec<String>> = ids
        .iter()
        .map(|id| results(&h.detail("shop", id)))
        .collect();
    assert_eq!(
        each,
        [
            ["ok"],
            ["retryable_error"],
            ["ok"],
            ["permanent_error"],
            ["ok"],
            ["ok"]
        ]
    );
}

fn a_transient_failure_is_retried_with_backoff_to_success(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    h.loyalty
        .fail_first
        .store(2, std::sync::atomic::Ordering::SeqCst);
    h.insert(&[("shop", "evt-1", ORDER, order_body("o-1", "c-1", 10))]);
    h.drain();
    let d = h.detail("shop", "evt-1");
    assert_eq!(d.event.status, Status::Completed);
    assert_eq!(d.event.attempts, 3);
    assert_eq!(results(&d), ["retryable_error", "retryable_error", "ok"]);
    assert!(d.history[0].error.as_deref().unwrap().contains("transient"));
    assert_eq!(h.balance("c-1"), 10);
}

fn a_failure_that_persists_ends_failed_after_max_attempts(kind: StoreKind) {
    let h = Harness::on(kind, 4, 30);
    h.audit
        .fail_first
        .store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    h.insert(&[("shop", "evt-1", "ping", "{}".into())]);
    h.drain();
    let d = h.detail("shop", "evt-1");
    assert_eq!(d.event.status, Status::Failed);
    assert_eq!(d.event.attempts, 4);
    assert_eq!(results(&d), ["retryable_error"; 4]);
    assert!(
        d.event
            .last_error
            .as_deref()
            .unwrap()
            .contains("gave up after 4 attempts")
    );
    assert_eq!(d.event.next_attempt_at, None);
    assert_eq!(h.audit.calls_for("evt-1"), 4);
}

fn shutdown_releases_claims_whose_handler_never_started(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    h.insert(&[
        ("shop", "a", "ping", "{}".into()),
        ("shop", "b", "ping", "{}".into()),
        ("shop", "c", "ping", "{}".into()),
    ]);
    let started = std::sync::atomic::AtomicUsize::new(0);
    // Right after the inserts the SQLite store claims an eighth of the limit (ingest first):
    // 64 still takes all three.
    let claimed = h
        .consumer
        .run_once("w", 64, &|| {
            started.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 1
        })
        .unwrap();
    assert_eq!(claimed, 3);
    assert_eq!(h.audit.total_calls(), 1, "only the first handler started");
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE status = 'pending'"),
        2
    );
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE status = 'completed'"),
        1
    );
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE status = 'claimed'"),
        0
    );
    h.drain();
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE status = 'completed'"),
        3
    );
    assert_eq!(h.audit.total_calls(), 3);
}

fn a_forced_rerun_of_a_completed_credit_moves_nothing(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    h.insert(&[("shop", "evt-1", ORDER, order_body("o-1", "c-1", 10))]);
    h.drain();
    let r = h
        .store
        .retry("shop", "evt-1", None, false, now_ms())
        .unwrap();
    assert!(matches!(
        r,
        webhook_inbox::store::RetryOutcome::NeedsForce(_)
    ));
    let r = h
        .store
        .retry("shop", "evt-1", None, true, now_ms())
        .unwrap();
    assert!(matches!(r, webhook_inbox::store::RetryOutcome::Retried(_)));
    h.drain();
    assert_eq!(h.balance("c-1"), 10);
    let d = h.detail("shop", "evt-1");
    assert_eq!(d.event.status, Status::Completed);
    assert_eq!(d.event.outcome.as_deref(), Some("credited"));
    assert_eq!(results(&d), ["ok", "already_processed"]);
    assert_eq!(h.loyalty.calls_for("evt-1"), 2);
}

store_tests!(
    six_workers_released_together_handle_each_of_240_events_exactly_once,
    six_pipelined_workers_released_together_handle_each_event_exactly_once,
    a_business_duplicate_completes_as_duplicate_order_and_moves_no_balance,
    a_redelivered_event_reaches_the_handler_once,
    a_bad_payload_fails_at_once_naming_the_field,
    an_effect_the_database_refuses_fails_that_event_alone,
    one_finish_batch_gives_each_event_its_own_result,
    one_finish_batch_of_every_transition_credits_a_shared_order_once,
    a_transient_failure_is_retried_with_backoff_to_success,
    a_failure_that_persists_ends_failed_after_max_attempts,
    shutdown_releases_claims_whose_handler_never_started,
    a_forced_rerun_of_a_completed_credit_moves_nothing,
);
