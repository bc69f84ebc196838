//! The downstream's circuit breaker (`handlers::downstream`): a run of calls that reached no
//! answer stops the claims of its subscription until a probe is due; the probe's answer closes
//! it, and the events that waited go on, each still called once.

use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::handlers::{CallFailure, DownstreamError};
use webhook_inbox::store::Status;

use crate::helpers::*;
use crate::stores::{StoreKind, store_tests};

store_tests!(an_unreachable_downstream_is_probed_not_called_for_every_attempt);

fn breaker_of(h: &Harness) -> Option<i64> {
    let subs = h.store.subscriptions(false).unwrap();
    subs.iter()
        .find(|s| s.name == "downstream")
        .expect("the implicit downstream subscription")
        .probe_at
}

/// Seen failing without the breaker: the calls went on, every attempt of the three requests
/// (15 calls), where the breaker stops them at 5.
fn an_unreachable_downstream_is_probed_not_called_for_every_attempt(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    *h.downstream.fail_with.lock().unwrap() = Some(DownstreamError::new(
        CallFailure::NotSent,
        "could not connect to the downstream (nothing was sent)",
    ));
    let ids = ["req-1", "req-2", "req-3"];
    for id in ids {
        h.store.create_request(id, now_ms()).unwrap();
        h.store.submit_request(id, now_ms()).unwrap();
    }
    // Each failure is retried after 1 to 4 ms: drained until five calls, or until the claims
    // stop for good (no breaker: every attempt is called).
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.downstream.calls().len() < 5 && Instant::now() < deadline {
        h.drain();
    }
    let opened = breaker_of(&h).expect("five calls without an answer open the breaker");
    // Well before the first probe (a second after the opening): nothing is claimed.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(20));
        h.drain();
    }
    assert_eq!(
        h.downstream.calls().len(),
        5,
        "claims stop while it is open"
    );
    assert!(opened > now_ms(), "the probe is not due yet");

    // The downstream is back: the probe, one event, closes the breaker and the rest go on.
    *h.downstream.fail_with.lock().unwrap() = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids
        .iter()
        .any(|id| h.detail("requests", id).event.status != Status::Completed)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
        h.drain();
    }
    for id in ids {
        assert_eq!(
            h.detail("requests", id).event.status,
            Status::Completed,
            "{id}"
        );
    }
    assert_eq!(breaker_of(&h), None, "the probe's answer closed it");
    assert_eq!(h.downstream.calls().len(), 5 + ids.len());
}
