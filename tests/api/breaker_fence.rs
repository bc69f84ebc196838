//! The breaker of a corrected subscription: a change of where it delivers closes its breaker
//! (`write_row`), and nothing of the target it replaced moves it again: not a failing call of
//! the old forwarder still in flight when the change landed, not the probe a stopped forwarder
//! gives back untried (the next probe is due at once, not a lease after that claim).

use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::Gate;
use webhook_inbox::subscriptions::HttpSettings;

use crate::endpoint::{Endpoint, receiver_available};
use crate::forwarding::{config, deliver_orders, options};
use crate::forwarding_store::subscriptions;
use crate::helpers::*;

crate::stores::store_tests!(
    the_replaced_targets_answers_leave_the_breaker_alone,
    a_410_of_the_replaced_target_pauses_nothing,
    a_probe_given_back_untried_is_due_again_at_once
);

/// After a change of its url, the old target's failure (an attempt in flight across the
/// change) does not open the breaker and its success does not close it; the new target's do.
/// Seen failing without the settings check in `open_breaker`: the gate was `WaitUntil`.
fn the_replaced_targets_answers_leave_the_breaker_alone(kind: crate::stores::StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let mut subs = subscriptions();
    let billing = h.store.sync_subscriptions(&subs, now_ms()).unwrap()[1];
    h.insert(&[("shop", "f-1", "order.created", "{}".to_string())]);
    let old = HttpSettings::of(subs[1].http.as_ref().unwrap());
    subs[1].http.as_mut().unwrap().url = "http://127.0.0.1:9/fixed".into();
    let new = HttpSettings::of(subs[1].http.as_ref().unwrap());
    let now = now_ms();
    h.store.sync_subscriptions(&subs, now).unwrap();
    let gate = |at| {
        h.store
            .claim_subscription("f", billing, 8, 30_000, at)
            .unwrap()
            .gate
    };
    h.store
        .open_breaker(billing, Some(&old), false, 60_000, 60_000, now + 1)
        .unwrap();
    assert_eq!(gate(now + 2), Gate::Open, "opened by the replaced target");
    h.store
        .open_breaker(billing, Some(&new), false, 60_000, 60_000, now + 3)
        .unwrap();
    assert_eq!(gate(now + 4), Gate::WaitUntil(now + 60_003));
    h.store.close_breaker(billing, Some(&old)).unwrap();
    assert_eq!(gate(now + 5), Gate::WaitUntil(now + 60_003), "closed by it");
    h.store.close_breaker(billing, Some(&new)).unwrap();
    assert_eq!(gate(now + 6), Gate::Open);
}

/// A 410 of the target a change replaced (a call in flight across the change) leaves the
/// corrected subscription running; the new target's 410 pauses it. Seen failing (both stores)
/// with the settings check left out of `pause_gone`: the old target's 410 paused it.
fn a_410_of_the_replaced_target_pauses_nothing(kind: crate::stores::StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let mut subs = subscriptions();
    let billing = h.store.sync_subscriptions(&subs, now_ms()).unwrap()[1];
    let old = HttpSettings::of(subs[1].http.as_ref().unwrap());
    subs[1].http.as_mut().unwrap().url = "http://127.0.0.1:9/fixed".into();
    let new = HttpSettings::of(subs[1].http.as_ref().unwrap());
    h.store.sync_subscriptions(&subs, now_ms()).unwrap();
    let name = subs[1].name.clone();
    let paused = |h: &Harness| {
        h.store
            .subscriptions(false)
            .unwrap()
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| s.paused)
    };
    assert!(!h.store.pause_gone(billing, &old).unwrap());
    assert_eq!(paused(&h), Some(false), "paused by the replaced target");
    assert!(h.store.pause_gone(billing, &new).unwrap());
    assert_eq!(paused(&h), Some(true));
}

/// A probe claimed and given back untried (its forwarder stopped, or the claim came back
/// stale) costs the event nothing and makes the next probe due at once; given back after the
/// breaker closed, it leaves it closed. Seen failing with a plain `give_back`: the gate was
/// `WaitUntil` a lease after the probe's claim.
fn a_probe_given_back_untried_is_due_again_at_once(kind: crate::stores::StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let subs = subscriptions();
    let billing = h.store.sync_subscriptions(&subs, now_ms()).unwrap()[1];
    h.insert(&[
        ("shop", "g-1", "order.created", "{}".to_string()),
        ("shop", "g-2", "order.created", "{}".to_string()),
    ]);
    let settings = HttpSettings::of(subs[1].http.as_ref().unwrap());
    let now = now_ms();
    h.store
        .open_breaker(billing, Some(&settings), false, 200, 1_000, now)
        .unwrap();
    let claim = |at| {
        h.store
            .claim_subscription("f", billing, 8, 30_000, at)
            .unwrap()
    };
    let probe = claim(now + 200);
    assert_eq!(probe.gate, Gate::Probe);
    assert_eq!(probe.claims.len(), 1, "{probe:?}");
    let given = &probe.claims[0].claim;
    assert!(h.store.give_back_probe(given, now + 300).unwrap());
    assert!(!h.store.give_back_probe(given, now + 300).unwrap(), "twice");
    let again = claim(now + 301);
    assert_eq!(again.gate, Gate::Probe, "{again:?}");
    assert_eq!(again.claims.len(), 1, "{again:?}");
    assert_eq!(again.claims[0].claim.event_id, given.event_id);
    assert_eq!(
        again.claims[0].claim.attempt, given.attempt,
        "no attempt counted"
    );
    h.store.close_breaker(billing, Some(&settings)).unwrap();
    assert!(
        h.store
            .give_back_probe(&again.claims[0].claim, now + 400)
            .unwrap()
    );
    assert_eq!(claim(now + 401).gate, Gate::Open);
}

/// The whole path against real endpoints: a subscription whose endpoint hangs is corrected
/// (PATCH of its url) while four of its calls are in flight; when they time out, a run of
/// five failures is complete, which used to open the breaker of the corrected subscription
/// for `backoff_base_ms` (30 s here). The new endpoint gets every event but the eight the old
/// one held (retried after their own backoff) within 15 s of the change, at the 8 calls a
/// second the change also sets. Seen failing without the settings check in `open_breaker`:
/// about half were delivered, the rest waited for the probe.
#[tokio::test]
async fn a_corrected_subscription_is_not_held_back_by_its_old_targets_failures() {
    if !receiver_available() {
        return;
    }
    let (dead_dir, good_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dead = Endpoint::start(dead_dir.path(), SW_SECRET);
    let good = Endpoint::start(good_dir.path(), SW_SECRET);
    dead.set_mode("hang", None, None).await;
    let extra = "concurrency = 4\nmax_attempts = 100\n\
                 backoff_base_ms = 30000\nbackoff_max_ms = 60000";
    let app = spawn_app_with(config(&dead.hook_url(), extra), options()).await;
    let (events, _) = deliver_orders(&app, "c", 40).await;
    // Four calls timed out, four more hang: the old forwarder's run of failures is at four.
    let deadline = Instant::now() + Duration::from_secs(20);
    while dead.count("calls").await < 8 {
        assert!(Instant::now() < deadline, "{}", dead.stats().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body = serde_json::json!({ "url": good.hook_url(), "rate_per_second": 8 }).to_string();
    let changed = crate::registry_routes::patch(&app, "billing", &body).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    let held = i64::try_from(events).unwrap() - 8;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let delivered = good.count("verified").await;
        if delivered >= held {
            break;
        }
        let view = app.get("/subscriptions/billing").await.body;
        assert!(
            Instant::now() < deadline,
            "{delivered} of {held} delivered to the corrected endpoint: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}
