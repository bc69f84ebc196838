//! `POST /subscriptions/{name}/recover?since=TIME` (SPEC section 13), as Svix's recover after
//! an endpoint's outage: every failed state of one subscription that failed since a time goes
//! back to pending, once. Through the HTTP API, the CLI, and each store.

use serde_json::Value;
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::stores::StoreKind;

const TWO: &str = r#"
[[subscriptions]]
name = "points"
kind = "loyalty-credit"
types = ["order.completed"]

[[subscriptions]]
name = "ledger"
kind = "audit"
"#;

/// An `order.completed` the loyalty handler fails permanently (no order id).
const BAD: &str = r#"{"type":"order.completed","data":{"customer_id":"c","points":1}}"#;

fn status_of(event: &Value, name: &str) -> String {
    event["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .map(|s| s["status"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Seen failing before the route existed (404 for every call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_retries_a_subscriptions_failures_since_a_time_once() {
    let app = spawn_app_with(|c| c.push_str(TWO), BuildOptions::default()).await;
    for id in ["a", "b"] {
        app.deliver("shop", id, BAD).await;
    }
    app.drain().await;
    assert_eq!(status_of(&app.event("shop", "a").await, "points"), "failed");
    // A failure older than `since` stays as it is.
    rusqlite::Connection::open(app.dir.path().join("inbox.db"))
        .unwrap()
        .execute(
            "UPDATE event_attempts SET finished_at = 1000 WHERE event_seq =
               (SELECT seq FROM event_log WHERE event_id = 'a')",
            [],
        )
        .unwrap();
    let r = app
        .admin_post(
            "/subscriptions/points/recover?since=2000-01-01T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, serde_json::json!({"retried": 1}));
    assert_eq!(
        status_of(&app.event("shop", "b").await, "points"),
        "pending"
    );
    assert_eq!(status_of(&app.event("shop", "a").await, "points"), "failed");
    assert_eq!(
        status_of(&app.event("shop", "b").await, "ledger"),
        "completed"
    );
    // Idempotent: the first moved it to pending.
    let r = app
        .admin_post(
            "/subscriptions/points/recover?since=2000-01-01T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(r.body["retried"], 0, "{}", r.body);
    // Since the epoch: the older one too.
    let r = app
        .admin_post(
            "/subscriptions/points/recover?since=1970-01-01T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(r.body["retried"], 1, "{}", r.body);
    // Another subscription's failures are its own.
    let r = app
        .admin_post(
            "/subscriptions/ledger/recover?since=1970-01-01T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(r.body["retried"], 0, "{}", r.body);

    app.admin_post(
        "/subscriptions/nope/recover?since=2020-01-01T00:00:00Z",
        None,
    )
    .await
    .assert_error(404, "not_found");
    for path in [
        "/subscriptions/points/recover",
        "/subscriptions/points/recover?since=yesterday",
        "/subscriptions/points/recover?since=2020-01-01T00:00:00Z&x=1",
    ] {
        let r = app.admin_post(path, None).await;
        r.assert_error(422, "invalid_request");
        if !path.ends_with("x=1") {
            assert!(
                r.body["message"].as_str().unwrap().contains("since"),
                "{}",
                r.body
            );
        }
    }
    app.post(
        "/subscriptions/points/recover?since=2020-01-01T00:00:00Z",
        None,
        None,
    )
    .await
    .assert_error(401, "unauthorized");
    app.stop().await;
}

/// The CLI's `subscriptions recover NAME --since TIME`. Seen failing before the command
/// existed (clap refused `recover`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_recovers_a_subscription() {
    use crate::cli::{cli, stderr, stdout};
    let app = spawn_app_with(|c| c.push_str(TWO), BuildOptions::default()).await;
    app.deliver("shop", "a", BAD).await;
    app.drain().await;
    let o = cli(
        &app,
        &["subscriptions", "recover", "points", "--since", "1h"],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("retried 1"), "{}", stdout(&o));
    let o = cli(
        &app,
        &[
            "subscriptions",
            "recover",
            "points",
            "--since",
            "1h",
            "--json",
        ],
    )
    .await;
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["retried"], 0);
    let o = cli(&app, &["subscriptions", "recover", "nope", "--since", "1h"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nope"), "{}", stderr(&o));
    app.stop().await;
}

crate::stores::store_tests!(
    a_recover_takes_the_states_that_failed_since_a_time,
    event_counts_count_each_event_once
);

/// The store's side of a recover, on each store: `failed_since` compares the end of each
/// state's last attempt, in the one subscription. Seen failing on both stores without the
/// clause (2 retried, the old failure too).
fn a_recover_takes_the_states_that_failed_since_a_time(kind: StoreKind) {
    use webhook_inbox::domain::time::now_ms;
    use webhook_inbox::store::EventFilter;
    let h = crate::harness::Harness::on(kind, 1, 30);
    h.insert(&[
        ("shop", "a", "order.completed", BAD.to_string()),
        ("shop", "b", "order.completed", BAD.to_string()),
    ]);
    h.drain();
    assert_eq!(h.detail("shop", "a").event.status.as_str(), "failed");
    h.db.execute(
        "UPDATE event_attempts SET finished_at = 1000 WHERE event_seq =
           (SELECT seq FROM event_log WHERE event_id = 'a')",
    );
    let filter = EventFilter {
        subscription: Some("loyalty".into()),
        failed_since: Some(2000),
        ..Default::default()
    };
    assert_eq!(h.store.retry_failed(&filter, now_ms()).unwrap(), 1);
    assert_eq!(h.store.retry_failed(&filter, now_ms()).unwrap(), 0);
    assert_eq!(h.detail("shop", "a").event.status.as_str(), "failed");
    assert_eq!(h.detail("shop", "b").event.status.as_str(), "pending");
    let other = EventFilter {
        subscription: Some("audit".into()),
        failed_since: Some(0),
        ..Default::default()
    };
    assert_eq!(h.store.retry_failed(&other, now_ms()).unwrap(), 0);
}

/// The overview's event counts run on each store: with the implicit subscriptions each event
/// has one state, so they agree with the state counts. (The browser test of the overview has
/// events in several subscriptions.)
fn event_counts_count_each_event_once(kind: StoreKind) {
    let h = crate::harness::Harness::on(kind, 1, 30);
    h.insert(&[
        ("shop", "a", "order.completed", BAD.to_string()),
        ("shop", "b", "thing.done", "{}".to_string()),
        ("shop", "c", "thing.done", "{}".to_string()),
    ]);
    h.drain();
    let events = h.store.event_counts().unwrap();
    let states = h.store.status_counts().unwrap();
    assert_eq!(
        (
            events.failed,
            events.completed,
            events.pending,
            events.claimed
        ),
        (1, 2, 0, 0)
    );
    assert_eq!((states.failed, states.completed), (1, 2));
}
