//! Ordering per key where events reach an ordered subscription by another way than its fan-out
//! (a backfill) or run again (a forced or bulk retry of an earlier event of a key): at most one
//! event of a key in flight, the earliest unfinished, on both stores.

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{
    AttemptResult, Claimed, EventFilter, Finish, Lane, Next, Outcome, RetryOutcome,
};
use webhook_inbox::subscriptions::{Kind, OnFailure};

use crate::harness::Harness;
use crate::helpers::{order_body, test_subscription};
use crate::ordering::ordered_pull;
use crate::stores::StoreKind;

crate::stores::store_tests!(
    a_backfill_gives_an_ordered_subscription_its_keys,
    a_forced_retry_waits_for_the_later_event_of_its_key_in_flight,
    a_bulk_retry_leaves_a_failed_event_whose_key_went_on_until_the_key_is_free,
    a_backfilled_earlier_event_waits_for_the_one_of_its_key_in_flight,
    an_order_key_under_a_field_with_a_backslash_is_read,
);

fn ids(claims: &[Claimed]) -> Vec<String> {
    let mut ids: Vec<String> = claims.iter().map(|c| c.claim.event_id.clone()).collect();
    ids.sort();
    ids
}

/// Every claimable state of `sub`, over a few claims (SQLite may claim fewer than asked at a
/// time).
fn claim_all(h: &Harness, sub: i64) -> Vec<Claimed> {
    let mut all = Vec::new();
    for _ in 0..5 {
        all.extend(
            h.store
                .claim_subscription("c", sub, 10, 30_000, now_ms())
                .unwrap()
                .claims,
        );
    }
    all
}

fn done(c: &Claimed) -> Finish {
    Finish {
        claim: c.claim.clone(),
        next: Next::Complete {
            effect: None,
            outcome: Outcome::Delivered,
        },
    }
}

fn keyed(h: &Harness, events: &[(&str, &str)]) {
    let deliveries: Vec<_> = events
        .iter()
        .map(|(id, key)| ("shop", *id, "order.completed", order_body(id, key, 1)))
        .collect();
    h.insert(&deliveries);
}

/// Events stored before an ordered subscription was added, handed to it by a backfill: a
/// claim takes the first of each key (and the keyless one), not a key's events together.
/// Seen failing (both stores) with the backfill's `order_key` left out: one claim returned
/// all five.
fn a_backfill_gives_an_ordered_subscription_its_keys(kind: StoreKind) {
    let h = Harness::on(kind, 1000, 30);
    let base = test_subscription("base", Kind::Audit);
    h.store
        .sync_subscriptions(std::slice::from_ref(&base), now_ms())
        .unwrap();
    keyed(
        &h,
        &[
            ("a0", "A"),
            ("a1", "A"),
            ("a2", "A"),
            ("b0", "B"),
            ("b1", "B"),
        ],
    );
    h.insert(&[(
        "shop",
        "n0",
        "order.completed",
        serde_json::json!({"type": "order.completed", "data": {"n": 1}}).to_string(),
    )]);
    // Fanned out to `base`: behind the cursor, where only a backfill reaches them.
    let fanned = h
        .store
        .claim("w", Lane::InProcess, 100, 600_000, now_ms())
        .unwrap();
    assert_eq!(fanned.len(), 6);
    let subs = h
        .store
        .sync_subscriptions(&[base, ordered_pull(OnFailure::Hold)], now_ms())
        .unwrap();
    let orders = subs[1];
    assert_eq!(h.store.backfill("orders", 0, now_ms()).unwrap(), Some(6));
    let claim = || claim_all(&h, orders);
    let first = claim();
    assert_eq!(
        ids(&first),
        ["a0", "b0", "n0"],
        "one per key, and the keyless one"
    );
    assert!(claim().is_empty(), "the keys' next events wait");
    h.store
        .finish(&first.iter().map(done).collect::<Vec<_>>(), now_ms())
        .unwrap();
    assert_eq!(ids(&claim()), ["a1", "b1"]);
}

/// A forced retry of a completed event while a later event of its key is claimed would put
/// two of the key's events in flight: refused, naming the one in flight; once that one is
/// finished, the retry goes through. Seen failing (both stores) without the check: the retry
/// answered Retried and the next claim handed out a0 beside a1.
fn a_forced_retry_waits_for_the_later_event_of_its_key_in_flight(kind: StoreKind) {
    let h = Harness::on(kind, 1000, 30);
    let sub = h
        .store
        .sync_subscriptions(&[ordered_pull(OnFailure::Hold)], now_ms())
        .unwrap()[0];
    keyed(&h, &[("a0", "A"), ("a1", "A")]);
    let claim = || claim_all(&h, sub);
    let a0 = claim();
    assert_eq!(ids(&a0), ["a0"]);
    h.store.finish(&[done(&a0[0])], now_ms()).unwrap();
    let a1 = claim();
    assert_eq!(ids(&a1), ["a1"]);
    match h
        .store
        .retry("shop", "a0", Some("orders"), true, now_ms())
        .unwrap()
    {
        RetryOutcome::KeyInFlight(event, (source, id)) => {
            assert_eq!(event.event_id, "a0");
            assert_eq!((source.as_str(), id.as_str()), ("shop", "a1"));
        }
        other => panic!("a0 retried beside a1 in flight: {other:?}"),
    }
    assert!(claim().is_empty(), "nothing of the key beside a1");
    h.store.finish(&[done(&a1[0])], now_ms()).unwrap();
    assert!(matches!(
        h.store
            .retry("shop", "a0", Some("orders"), true, now_ms())
            .unwrap(),
        RetryOutcome::Retried(_)
    ));
    assert_eq!(ids(&claim()), ["a0"]);
}

/// With `on_failure = "skip"` a failed event lets its key go on; a bulk retry while the next
/// event of the key is in flight leaves it failed (it would run beside that one), and takes it
/// once the key is free. Seen failing (both stores) without the check: retried 1 at once.
fn a_bulk_retry_leaves_a_failed_event_whose_key_went_on_until_the_key_is_free(kind: StoreKind) {
    let h = Harness::on(kind, 1000, 30);
    let sub = h
        .store
        .sync_subscriptions(&[ordered_pull(OnFailure::Skip)], now_ms())
        .unwrap()[0];
    keyed(&h, &[("a0", "A"), ("a1", "A")]);
    let claim = || claim_all(&h, sub);
    let a0 = claim();
    assert_eq!(ids(&a0), ["a0"]);
    h.store
        .finish(
            &[Finish {
                claim: a0[0].claim.clone(),
                next: Next::Fail {
                    error: "bad".into(),
                    result: AttemptResult::PermanentError,
                    abandoned: false,
                },
            }],
            now_ms(),
        )
        .unwrap();
    let a1 = claim();
    assert_eq!(ids(&a1), ["a1"], "skip: the key goes on past the failed a0");
    let filter = EventFilter {
        subscription: Some("orders".into()),
        ..EventFilter::default()
    };
    assert_eq!(h.store.retry_failed(&filter, now_ms()).unwrap(), 0);
    assert!(claim().is_empty());
    h.store.finish(&[done(&a1[0])], now_ms()).unwrap();
    assert_eq!(h.store.retry_failed(&filter, now_ms()).unwrap(), 1);
    assert_eq!(ids(&claim()), ["a0"]);
}

/// An earlier event of a key handed to an ordered subscription by a backfill while a later
/// one of the key is in flight waits for it: at most one of a key in flight, whatever way an
/// earlier one came back. Seen failing (both stores) without the claim's in-flight condition:
/// a0 was claimed beside a1.
fn a_backfilled_earlier_event_waits_for_the_one_of_its_key_in_flight(kind: StoreKind) {
    let h = Harness::on(kind, 1000, 30);
    let base = test_subscription("base", Kind::Audit);
    h.store
        .sync_subscriptions(std::slice::from_ref(&base), now_ms())
        .unwrap();
    keyed(&h, &[("a0", "A")]);
    assert_eq!(
        h.store
            .claim("w", Lane::InProcess, 10, 600_000, now_ms())
            .unwrap()
            .len(),
        1
    );
    let orders = h
        .store
        .sync_subscriptions(&[base, ordered_pull(OnFailure::Hold)], now_ms())
        .unwrap()[1];
    keyed(&h, &[("a1", "A")]);
    let claim = || claim_all(&h, orders);
    let a1 = claim();
    assert_eq!(ids(&a1), ["a1"]);
    assert_eq!(h.store.backfill("orders", 0, now_ms()).unwrap(), Some(1));
    assert!(claim().is_empty(), "a0 beside a1 in flight");
    h.store.finish(&[done(&a1[0])], now_ms()).unwrap();
    assert_eq!(ids(&claim()), ["a0"]);
}

/// A key read from a field whose name holds a backslash (`/data/a\b`): one event of each key
/// in flight, as for any other field. Seen failing on SQLite with the path's backslash left
/// unescaped (SQLite read it as a JSON escape, every key was NULL and all four were claimed).
fn an_order_key_under_a_field_with_a_backslash_is_read(kind: StoreKind) {
    let h = Harness::on(kind, 1000, 30);
    let mut sub = ordered_pull(OnFailure::Hold);
    sub.ordering = Some(webhook_inbox::subscriptions::Ordering {
        pointer: "/data/a\\b".into(),
        path: vec!["data".into(), "a\\b".into()],
        on_failure: OnFailure::Hold,
    });
    let orders = h.store.sync_subscriptions(&[sub], now_ms()).unwrap()[0];
    let body = |key: &str| serde_json::json!({"type": "order.completed", "data": {"a\\b": key}});
    h.insert(&[
        ("shop", "a0", "order.completed", body("A").to_string()),
        ("shop", "a1", "order.completed", body("A").to_string()),
        ("shop", "b0", "order.completed", body("B").to_string()),
        ("shop", "b1", "order.completed", body("B").to_string()),
    ]);
    h.store
        .claim("w", Lane::InProcess, 100, 600_000, now_ms())
        .unwrap();
    let first = claim_all(&h, orders);
    assert_eq!(ids(&first), ["a0", "b0"], "one event of each key");
    h.store
        .finish(&first.iter().map(done).collect::<Vec<_>>(), now_ms())
        .unwrap();
    assert_eq!(ids(&claim_all(&h, orders)), ["a1", "b1"]);
}
