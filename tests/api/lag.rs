//! `webhook_inbox_oldest_pending_seconds` measures due work only: an event waiting on its
//! backoff is not late, and one claimed but not yet done still is.

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{Finish, Lane, Next};

use crate::harness::Harness;
use crate::stores::{StoreKind, store_tests};

fn the_lag_counts_due_and_claimed_work_but_not_events_waiting_on_a_backoff(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let lag = |h: &Harness, now: i64| h.store.status_counts().unwrap().lag_seconds(now);
    assert_eq!(lag(&h, now_ms()), None, "nothing to do");
    h.insert(&[("shop", "evt-1", "customer.created", "{}".into())]);
    let due = now_ms();
    assert!(
        lag(&h, due + 5_000).unwrap() >= 4.9,
        "a due pending event waits"
    );
    let claimed = h
        .store
        .claim("w", Lane::InProcess, 1, 30_000, now_ms())
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(
        lag(&h, due + 5_000).unwrap() >= 4.9,
        "claimed is not done: it still counts"
    );
    let retry = Finish {
        claim: claimed[0].claim.clone(),
        next: Next::Retry {
            at: now_ms() + 3_600_000,
            error: "try again in an hour".into(),
        },
    };
    h.store.finish(&[retry], now_ms()).unwrap();
    assert_eq!(
        lag(&h, now_ms() + 5_000),
        Some(0.0),
        "waiting on a backoff is not lag"
    );
}

store_tests!(the_lag_counts_due_and_claimed_work_but_not_events_waiting_on_a_backoff,);
