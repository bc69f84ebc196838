//! The alert state and outbox at the store level, on both stores: several stores on one
//! database play several nodes, released together through a barrier. Each episode's "started"
//! and "cleared" is written once whichever nodes race for it; each notice is claimed by one
//! sender; a condition starts only once it has held for its duration.

use std::sync::{Arc, Barrier};

use webhook_inbox::store::Store;
use webhook_inbox::store::alerts::{Notice, Observation};

use crate::stores::{StoreKind, TestDb, store_tests};

const NODES: usize = 8;

fn seen(holding: bool, for_ms: i64) -> Observation {
    Observation {
        alert: "ops/breaker_open/billing".into(),
        channel: "ops".into(),
        holding,
        for_ms,
        title: "subscription `billing`: endpoint down".into(),
        figure: if holding { "open" } else { "closed" }.into(),
        link: "/ui/#subscriptions".into(),
    }
}

/// Every node observes `o` at `now` at once; the notices each wrote.
fn race(nodes: &[Arc<dyn Store>], o: &Observation, now: i64) -> Vec<Notice> {
    let barrier = Barrier::new(nodes.len());
    std::thread::scope(|s| {
        let runs: Vec<_> = nodes
            .iter()
            .map(|node| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    node.alerts().observe(std::slice::from_ref(o), now).unwrap()
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    })
}

fn nodes(db: &TestDb) -> Vec<Arc<dyn Store>> {
    (0..NODES).map(|_| db.open_store()).collect()
}

fn racing_nodes_write_each_notice_of_an_episode_once(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let nodes = nodes(&db);
    let t = 1_000_000;
    for round in 0..5 {
        let at = t + round * 10_000;
        let started = race(&nodes, &seen(true, 0), at);
        assert_eq!(started.len(), 1, "round {round}: {started:?}");
        assert_eq!(
            (started[0].phase.as_str(), started[0].episode),
            ("started", round + 1)
        );
        // Still holding: nothing more.
        assert!(race(&nodes, &seen(true, 0), at + 1).is_empty());
        let cleared = race(&nodes, &seen(false, 0), at + 2);
        assert_eq!(cleared.len(), 1, "round {round}: {cleared:?}");
        assert_eq!(
            (
                cleared[0].phase.as_str(),
                cleared[0].episode,
                cleared[0].since
            ),
            ("cleared", round + 1, at)
        );
        assert!(race(&nodes, &seen(false, 0), at + 3).is_empty());
    }
    assert_eq!(db.count("SELECT count(*) FROM alert_notices"), 10);
    assert_eq!(
        db.count("SELECT count(DISTINCT episode) FROM alert_notices"),
        5
    );
}

fn a_condition_starts_only_once_it_has_held_for_its_duration(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let store = db.open_store();
    let alerts = store.alerts();
    let t = 5_000_000;
    assert!(alerts.observe(&[seen(true, 1_000)], t).unwrap().is_empty());
    assert!(
        alerts
            .observe(&[seen(true, 1_000)], t + 999)
            .unwrap()
            .is_empty()
    );
    let started = alerts.observe(&[seen(true, 1_000)], t + 1_000).unwrap();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].since, t, "since: when it started to hold");
    assert_eq!(alerts.active_alerts().unwrap().len(), 1);
    // A blip that stops holding before its duration starts nothing, and the next run counts
    // from its own start.
    let cleared = alerts.observe(&[seen(false, 1_000)], t + 2_000).unwrap();
    assert_eq!(cleared.len(), 1);
    assert!(alerts.active_alerts().unwrap().is_empty());
    assert!(
        alerts
            .observe(&[seen(true, 1_000)], t + 3_000)
            .unwrap()
            .is_empty()
    );
    assert!(
        alerts
            .observe(&[seen(false, 1_000)], t + 3_500)
            .unwrap()
            .is_empty()
    );
    assert!(
        alerts
            .observe(&[seen(true, 1_000)], t + 4_000)
            .unwrap()
            .is_empty()
    );
    let again = alerts.observe(&[seen(true, 1_000)], t + 5_000).unwrap();
    assert_eq!((again.len(), again[0].since), (1, t + 4_000));
}

fn one_sender_claims_a_notice_and_a_failed_one_waits_for_its_retry(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let nodes = nodes(&db);
    let t = 9_000_000;
    nodes[0].alerts().observe(&[seen(true, 0)], t).unwrap();
    let barrier = Barrier::new(NODES);
    let claims: Vec<(usize, Vec<Notice>)> = std::thread::scope(|s| {
        let runs: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let who = format!("node{i}");
                    let got = node
                        .alerts()
                        .claim_notices("ops", &who, 5, 30_000, 10, t + 1)
                        .unwrap();
                    (i, got)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let winners: Vec<_> = claims.iter().filter(|(_, got)| !got.is_empty()).collect();
    assert_eq!(winners.len(), 1, "{claims:?}");
    let (winner, got) = winners[0];
    let id = got[0].id;
    assert_eq!(got[0].attempts, 1);
    let store = &nodes[0];
    let me = format!("node{winner}");
    // Another claimer cannot fail or send it.
    assert!(!store.alerts().notice_sent(id, "someone", t + 2).unwrap());
    assert!(
        store
            .alerts()
            .notice_failed(id, &me, "503", t + 1_000)
            .unwrap()
    );
    assert!(
        store
            .alerts()
            .claim_notices("ops", "x", 5, 30_000, 10, t + 999)
            .unwrap()
            .is_empty(),
        "not before its retry"
    );
    let retried = store
        .alerts()
        .claim_notices("ops", "x", 5, 30_000, 10, t + 1_000)
        .unwrap();
    assert_eq!((retried.len(), retried[0].attempts), (1, 2));
    assert!(store.alerts().notice_sent(id, "x", t + 1_001).unwrap());
    assert!(
        store
            .alerts()
            .claim_notices("ops", "y", 5, 30_000, 10, t + 100_000)
            .unwrap()
            .is_empty(),
        "a sent notice is never claimed again"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM alert_notices WHERE sent_at IS NOT NULL"),
        1
    );
}

/// What the windowed conditions count: failed states by their last attempt's end, refused
/// deliveries by their arrival.
fn failed_states_and_refusals_are_counted_from_a_time_on(kind: StoreKind) {
    use webhook_inbox::store::{AttemptResult, Finish, Lane, NewRejection, Next};
    let h = crate::harness::Harness::on(kind, 5, 30);
    let body = || "{}".to_string();
    h.insert(&[
        ("shop", "f-1", "order.completed", body()),
        ("shop", "f-2", "order.completed", body()),
    ]);
    let t = webhook_inbox::domain::time::now_ms();
    let mut claimed = Vec::new();
    for _ in 0..10 {
        claimed.extend(h.store.claim("w", Lane::InProcess, 10, 30_000, t).unwrap());
    }
    let failing: Vec<Finish> = claimed
        .into_iter()
        // Orders go to the implicit `loyalty` alone (`audit` takes every other type).
        .map(|c| Finish {
            claim: c.claim,
            next: Next::Fail {
                error: "bad".into(),
                result: AttemptResult::PermanentError,
                abandoned: false,
            },
        })
        .collect();
    assert_eq!(failing.len(), 2);
    h.store.finish(&failing, t).unwrap();
    let alerts = h.store.alerts();
    assert_eq!(
        alerts.failed_since(t - 1_000).unwrap(),
        [("loyalty".to_string(), 2)]
    );
    assert!(alerts.failed_since(t + 1).unwrap().is_empty());

    let refused = |source: &str, at: i64| NewRejection {
        received_at: at,
        source: source.into(),
        peer: None,
        reason: "invalid_signature".into(),
        status: 401,
        message: "no match".into(),
        headers: "{}".into(),
        body_bytes: Some(2),
        body_sha256: None,
    };
    let batch = [
        refused("shop", t - 5_000),
        refused("shop", t),
        refused("stripe", t),
    ];
    h.store.record_rejections(&batch, 100, 0).unwrap();
    assert_eq!(
        alerts.rejected_since(t - 1_000).unwrap(),
        [("shop".to_string(), 1), ("stripe".to_string(), 1)]
    );
    assert_eq!(
        alerts.rejected_since(t - 10_000).unwrap(),
        [("shop".to_string(), 2), ("stripe".to_string(), 1)]
    );
}

/// Two nodes' snapshots applied in the wrong order: the older one, applied after a newer one
/// started (or cleared) the episode, changes nothing.
fn a_stale_snapshot_undoes_nothing_a_newer_one_did(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let (a, b) = (db.open_store(), db.open_store());
    let t = 7_000_000;
    // Node B took its snapshot at t + 10 and saw it hold; node A's, taken at t, saw it not.
    assert_eq!(
        b.alerts().observe(&[seen(true, 0)], t + 10).unwrap().len(),
        1
    );
    assert!(a.alerts().observe(&[seen(false, 0)], t).unwrap().is_empty());
    assert_eq!(a.alerts().active_alerts().unwrap().len(), 1, "still open");
    // B clears at t + 30 from a snapshot that saw it stop; A's older one (t + 20) saw it hold.
    assert_eq!(
        b.alerts().observe(&[seen(false, 0)], t + 30).unwrap().len(),
        1
    );
    assert!(
        a.alerts()
            .observe(&[seen(true, 0)], t + 20)
            .unwrap()
            .is_empty()
    );
    assert!(
        a.alerts().active_alerts().unwrap().is_empty(),
        "still cleared"
    );
    assert_eq!(db.count("SELECT count(*) FROM alert_notices"), 2);
    // A newer snapshot still starts the next episode.
    let next = a.alerts().observe(&[seen(true, 0)], t + 40).unwrap();
    assert_eq!((next.len(), next[0].episode), (1, 2));
}

/// A "cleared" never goes out before its "started": while the started notice waits for its
/// retry, the cleared one is not claimed.
fn a_cleared_notice_waits_for_its_started_one(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let alerts = db.open_store();
    let alerts = alerts.alerts();
    let t = 11_000_000;
    alerts.observe(&[seen(true, 0)], t).unwrap();
    let started = alerts
        .claim_notices("ops", "a", 5, 30_000, 10, t + 1)
        .unwrap();
    assert_eq!((started.len(), started[0].phase.as_str()), (1, "started"));
    assert!(
        alerts
            .notice_failed(started[0].id, "a", "503", t + 10_000)
            .unwrap()
    );
    assert_eq!(alerts.observe(&[seen(false, 0)], t + 2).unwrap().len(), 1);
    let early = alerts
        .claim_notices("ops", "b", 5, 30_000, 10, t + 3)
        .unwrap();
    assert!(early.is_empty(), "the cleared one went first: {early:?}");
    let retried = alerts
        .claim_notices("ops", "b", 5, 30_000, 10, t + 10_000)
        .unwrap();
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert_eq!(retried[0].phase, "started");
    assert!(alerts.notice_sent(retried[0].id, "b", t + 10_001).unwrap());
    let cleared = alerts
        .claim_notices("ops", "c", 5, 30_000, 10, t + 10_002)
        .unwrap();
    assert_eq!((cleared.len(), cleared[0].phase.as_str()), (1, "cleared"));
}

store_tests!(
    a_cleared_notice_waits_for_its_started_one,
    a_stale_snapshot_undoes_nothing_a_newer_one_did,
    failed_states_and_refusals_are_counted_from_a_time_on,
    racing_nodes_write_each_notice_of_an_episode_once,
    a_condition_starts_only_once_it_has_held_for_its_duration,
    one_sender_claims_a_notice_and_a_failed_one_waits_for_its_retry,
);

/// On SQLite a round that changes nothing, and a sender with nothing due, never take the
/// write lock ingest needs: they answer at once while another connection holds it.
#[test]
fn sqlite_an_idle_round_takes_no_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(StoreKind::Sqlite, dir.path());
    let store = db.open_store();
    let alerts = store.alerts();
    let holder = rusqlite::Connection::open(dir.path().join("inbox.db")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    assert!(alerts.observe(&[seen(false, 0)], 1_000).unwrap().is_empty());
    assert!(
        alerts
            .claim_notices("ops", "a", 5, 30_000, 10, 1_000)
            .unwrap()
            .is_empty()
    );
    assert!(
        started.elapsed() < std::time::Duration::from_millis(500),
        "waited {:?} for the write lock",
        started.elapsed()
    );
    holder.execute_batch("ROLLBACK").unwrap();
}
