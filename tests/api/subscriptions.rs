//! Subscriptions (SPEC section 13): every event is handled once per subscription whose route
//! matches it, with its own state; pause, resume, backfill, removal and retries per
//! subscription, through the HTTP API of a real server on a real database file.

use serde_json::Value;
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;

/// Three subscriptions that all take an `order.completed` from `shop`, and a fourth that takes
/// invoices only.
pub const FAN_OUT: &str = r#"
[[subscriptions]]
name = "points"
kind = "loyalty-credit"
types = ["order.completed"]

[[subscriptions]]
name = "ledger"
kind = "audit"

[[subscriptions]]
name = "archive"
kind = "audit"
sources = ["shop", "stripe"]

[[subscriptions]]
name = "invoices"
kind = "audit"
types = ["invoice.*", "charge.refunded"]
"#;

async fn app_with(subscriptions: &str) -> TestApp {
    let subscriptions = subscriptions.to_string();
    spawn_app_with(move |c| c.push_str(&subscriptions), BuildOptions::default()).await
}

/// Each subscription's `(name, status)` of an event, in the API's order.
fn states(event: &Value) -> Vec<(String, String)> {
    event["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn all(names: &[&str], status: &str) -> Vec<(String, String)> {
    names
        .iter()
        .map(|n| (n.to_string(), status.to_string()))
        .collect()
}

fn typed(ty: &str, body: &str) -> String {
    let mut v: Value = serde_json::from_str(body).unwrap_or_else(|_| serde_json::json!({}));
    v["type"] = Value::String(ty.into());
    v.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_handled_once_by_each_subscription_whose_route_matches() {
    let app = app_with(FAN_OUT).await;
    for (source, id, body) in [
        ("shop", "o-1", order_body("order-1", "c-1", 5)),
        ("shop", "o-2", order_body("order-2", "c-1", 7)),
        ("shop", "cust", typed("customer.created", "{}")),
        ("hmac", "push", typed("push", "{}")),
        ("shop", "inv", typed("invoice.paid", "{}")),
        ("shop", "ref", typed("charge.refunded", "{}")),
    ] {
        let r = app.deliver(source, id, &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Before any claim: pending in each subscription that will take it.
    let first = app.event("shop", "o-1").await;
    assert_eq!(first["status"], "pending");
    assert_eq!(
        states(&first),
        all(&["points", "ledger", "archive"], "pending")
    );
    app.drain().await;
    let expected: [(&str, &str, &[&str]); 6] = [
        ("shop", "o-1", &["points", "ledger", "archive"]),
        ("shop", "o-2", &["points", "ledger", "archive"]),
        ("shop", "cust", &["ledger", "archive"]),
        ("hmac", "push", &["ledger"]),
        ("shop", "inv", &["ledger", "archive", "invoices"]),
        ("shop", "ref", &["ledger", "archive", "invoices"]),
    ];
    for (source, id, names) in expected {
        let event = app.event(source, id).await;
        assert_eq!(event["status"], "completed", "{event}");
        assert_eq!(states(&event), all(names, "completed"), "{source}/{id}");
        // One attempt per subscription, each naming its subscription.
        let mut attempted: Vec<String> = event["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["subscription"].as_str().unwrap().to_string())
            .collect();
        attempted.sort();
        let mut names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        names.sort();
        assert_eq!(attempted, names, "{source}/{id}");
    }
    // The credit happened once, by the one loyalty-credit subscription.
    assert_eq!(app.balance("c-1").await, 12);
    let outcome = app.event("shop", "o-1").await["subscriptions"][0]["outcome"].clone();
    assert_eq!(outcome, "credited");
    // A redelivery reaches no subscription again.
    let r = app
        .deliver("shop", "o-1", &order_body("order-1", "c-1", 5))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(app.drain().await, 0);
    // Filters by subscription.
    let page = app.get("/events?subscription=invoices").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let ids: Vec<&str> = page.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ref", "inv"]);
    let page = app
        .get("/events?subscription=points&status=completed")
        .await;
    assert_eq!(page.body["events"].as_array().unwrap().len(), 2);
    let page = app.get("/events?subscription=points&status=failed").await;
    assert_eq!(page.body["events"].as_array().unwrap().len(), 0);
    // Counts per subscription.
    let subs = app.get("/subscriptions").await;
    assert_eq!(subs.status, 200, "{}", subs.body);
    let counts: Vec<(String, i64, i64)> = subs.body["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["counts"]["completed"].as_i64().unwrap(),
                s["lag"].as_i64().unwrap(),
            )
        })
        .collect();
    let count = |n: &str, c: i64| (n.to_string(), c, 0);
    assert_eq!(
        counts,
        [
            count("points", 2),
            count("ledger", 6),
            count("archive", 5),
            count("invoices", 2)
        ]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_no_route_matches_is_stored_listed_and_deduplicated() {
    let app = app_with(
        r#"
[[subscriptions]]
name = "invoices"
kind = "audit"
types = ["invoice.*"]
"#,
    )
    .await;
    let r = app
        .deliver("shop", "x", &typed("customer.created", "{}"))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    app.drain().await;
    let event = app.event("shop", "x").await;
    assert_eq!(event["status"], "stored", "{event}");
    assert_eq!(states(&event), []);
    let r = app
        .deliver("shop", "x", &typed("customer.created", "{}"))
        .await;
    assert_eq!(r.status, 200, "a redelivery is a duplicate: {}", r.body);
    let page = app.get("/events?status=stored").await;
    assert_eq!(
        page.body["events"].as_array().unwrap().len(),
        1,
        "{}",
        page.body
    );
    // Nothing to run again.
    let r = app.admin_post("/events/shop/x/retry", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "stored");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_subscription_claims_nothing_and_holds_back_no_other() {
    let app = app_with(FAN_OUT).await;
    let r = app.admin_post("/subscriptions/archive/pause", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "paused");
    for i in 0..5 {
        let body = order_body(&format!("order-{i}"), "c-1", 1);
        app.deliver("shop", &format!("e-{i}"), &body).await;
    }
    app.drain().await;
    for i in 0..5 {
        let event = app.event("shop", &format!("e-{i}")).await;
        assert_eq!(event["status"], "pending", "{event}");
        assert_eq!(
            states(&event),
            [
                ("points".into(), "completed".into()),
                ("ledger".into(), "completed".into()),
                ("archive".into(), "pending".into())
            ]
        );
    }
    assert_eq!(app.balance("c-1").await, 5);
    let archive = app.get("/subscriptions/archive").await;
    assert_eq!(archive.body["lag"], 5, "{}", archive.body);
    assert_eq!(archive.body["state"], "paused");
    let ledger = app.get("/subscriptions/ledger").await;
    assert_eq!(ledger.body["lag"], 0, "{}", ledger.body);
    let metrics = app.metrics_text().await;
    for line in [
        "webhook_inbox_subscription_lag{subscription=\"archive\"} 5",
        "webhook_inbox_subscription_paused{subscription=\"archive\"} 1",
        "webhook_inbox_subscription_lag{subscription=\"ledger\"} 0",
        "webhook_inbox_subscription_events{subscription=\"archive\",status=\"pending\"} 5",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    // Resumed: the waiting events go.
    let r = app.admin_post("/subscriptions/archive/resume", None).await;
    assert_eq!(r.body["state"], "active", "{}", r.body);
    app.drain().await;
    for i in 0..5 {
        let event = app.event("shop", &format!("e-{i}")).await;
        assert_eq!(event["status"], "completed", "{event}");
    }
    assert_eq!(app.balance("c-1").await, 5, "no credit twice");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_added_later_takes_newer_events_and_older_ones_by_backfill() {
    let app = app_with(
        r#"
[[subscriptions]]
name = "ledger"
kind = "audit"
"#,
    )
    .await;
    for i in 0..3 {
        app.deliver("shop", &format!("old-{i}"), &typed("thing.done", "{}"))
            .await;
    }
    app.drain().await;
    let dir = app.stop().await;
    let config = format!(
        "{}{}",
        test_config(&dir),
        r#"
[[subscriptions]]
name = "ledger"
kind = "audit"

[[subscriptions]]
name = "late"
kind = "audit"
"#
    );
    let app = spawn_in(dir, &config, BuildOptions::default()).await;
    for i in 0..2 {
        app.deliver("shop", &format!("new-{i}"), &typed("thing.done", "{}"))
            .await;
    }
    app.drain().await;
    let old = app.event("shop", "old-0").await;
    assert_eq!(states(&old), all(&["ledger"], "completed"));
    let new = app.event("shop", "new-0").await;
    assert_eq!(states(&new), all(&["ledger", "late"], "completed"));
    // Backfill: the three older events, once.
    let r = app
        .admin_post(
            "/subscriptions/late/backfill?since=2000-01-01T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["backfilled"], 3);
    app.drain().await;
    let old = app.event("shop", "old-0").await;
    assert_eq!(states(&old), all(&["ledger", "late"], "completed"));
    let r = app
        .admin_post(
            "/subscriptions/late/backfill?since=2000-01-01T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(r.body["backfilled"], 0, "nothing twice");
    // Removing it stops its work and keeps its history.
    let dir = app.stop().await;
    let config = format!(
        "{}{}",
        test_config(&dir),
        r#"
[[subscriptions]]
name = "ledger"
kind = "audit"
"#
    );
    let app = spawn_in(dir, &config, BuildOptions::default()).await;
    app.deliver("shop", "after", &typed("thing.done", "{}"))
        .await;
    app.drain().await;
    let after = app.event("shop", "after").await;
    assert_eq!(states(&after), all(&["ledger"], "completed"));
    let kept = app.event("shop", "new-1").await;
    assert_eq!(states(&kept), all(&["ledger", "late"], "completed"));
    let subs = app.get("/subscriptions").await;
    let late = subs.body["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "late")
        .cloned()
        .unwrap();
    assert_eq!(late["state"], "removed", "{late}");
    assert_eq!(late["counts"]["completed"], 5);
    let r = app.admin_post("/subscriptions/late/pause", None).await;
    r.assert_error(404, "not_found");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_one_subscription_is_retried_there_alone() {
    let app = app_with(FAN_OUT).await;
    // No order_id: the credit fails at once; the audits complete.
    let r = app
        .deliver(
            "shop",
            "bad",
            r#"{"type":"order.completed","data":{"customer_id":"c","points":1}}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    app.drain().await;
    let event = app.event("shop", "bad").await;
    assert_eq!(event["status"], "failed", "{event}");
    assert_eq!(
        states(&event),
        [
            ("points".into(), "failed".into()),
            ("ledger".into(), "completed".into()),
            ("archive".into(), "completed".into())
        ]
    );
    assert!(
        event["last_error"].as_str().unwrap().contains("order_id"),
        "{event}"
    );
    // A completed subscription's state needs force; the failed one goes back alone.
    let r = app
        .admin_post("/events/shop/bad/retry?subscription=ledger", None)
        .await;
    r.assert_error(409, "conflict");
    let r = app.admin_post("/events/shop/bad/retry", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        states(&r.body),
        [
            ("points".into(), "pending".into()),
            ("ledger".into(), "completed".into()),
            ("archive".into(), "completed".into())
        ]
    );
    app.drain().await;
    let event = app.event("shop", "bad").await;
    let attempts: Vec<&str> = event["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["subscription"].as_str().unwrap())
        .collect();
    assert_eq!(
        attempts.iter().filter(|s| **s == "points").count(),
        2,
        "{event}"
    );
    assert_eq!(attempts.iter().filter(|s| **s == "ledger").count(), 1);
    // A forced retry of the ledger's state runs the ledger alone.
    let r = app
        .admin_post(
            "/events/shop/bad/retry?subscription=ledger&force=true",
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    app.drain().await;
    let event = app.event("shop", "bad").await;
    let ledger = event["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["subscription"] == "ledger")
        .count();
    assert_eq!(ledger, 2);
    // Bulk retry by subscription.
    let r = app
        .admin_post(
            "/events/retry",
            Some(serde_json::json!({"subscription": "points"})),
        )
        .await;
    assert_eq!(r.body["retried"], 1, "{}", r.body);
    let r = app
        .admin_post(
            "/events/retry",
            Some(serde_json::json!({"subscription": "ledger"})),
        )
        .await;
    assert_eq!(r.body["retried"], 0, "{}", r.body);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_subscriptions_are_named_in_the_errors() {
    let app = app_with(FAN_OUT).await;
    app.deliver("shop", "e", &typed("thing.done", "{}")).await;
    for path in [
        "/events?subscription=nope",
        "/events/export?subscription=nope",
    ] {
        let r = app.get(path).await;
        r.assert_error(422, "invalid_request");
        assert!(
            r.body["message"].as_str().unwrap().contains("nope"),
            "{}",
            r.body
        );
    }
    let r = app
        .admin_post("/events/shop/e/retry?subscription=nope", None)
        .await;
    r.assert_error(422, "invalid_request");
    let r = app
        .admin_post(
            "/events/retry",
            Some(serde_json::json!({"subscription": "nope"})),
        )
        .await;
    r.assert_error(422, "invalid_request");
    for path in [
        "/subscriptions/nope/pause",
        "/subscriptions/nope/resume",
        "/subscriptions/nope/backfill?since=2020-01-01T00:00:00Z",
    ] {
        let r = app.admin_post(path, None).await;
        r.assert_error(404, "not_found");
    }
    app.get("/subscriptions/nope")
        .await
        .assert_error(404, "not_found");
    for path in [
        "/subscriptions/ledger/backfill",
        "/subscriptions/ledger/backfill?since=yesterday",
        "/subscriptions/ledger/backfill?since=2020-01-01T00:00:00Z&x=1",
    ] {
        let r = app.admin_post(path, None).await;
        r.assert_error(422, "invalid_request");
    }
    let r = app.post("/subscriptions/ledger/pause", None, None).await;
    r.assert_error(401, "unauthorized");
    app.stop().await;
}

crate::stores::store_tests!(six_workers_released_together_handle_each_event_once_per_subscription);

/// Six workers released together over three subscriptions that all take every event: each
/// event is handled exactly once by each, whatever the interleaving (a real database, real
/// threads through a barrier). Seen failing on SQLite with a fan-out that claims again
/// (`INSERT OR REPLACE` without the cursor), and on PostgreSQL with the fan-out lock taken in
/// the fan-out's own statement (an older snapshot of the cursor fanned events out twice).
fn six_workers_released_together_handle_each_event_once_per_subscription(
    kind: crate::stores::StoreKind,
) {
    use std::sync::{Arc, Barrier};
    use webhook_inbox::store::InsertOutcome;
    use webhook_inbox::subscriptions::Kind;

    let h = Harness::on(kind, 5, 30);
    let sub = test_subscription;
    let subs = [
        sub("points", Kind::LoyaltyCredit),
        sub("ledger", Kind::Audit),
        sub("archive", Kind::Audit),
    ];
    h.store
        .sync_subscriptions(&subs, webhook_inbox::domain::time::now_ms())
        .unwrap();
    let consumer = h.consumer_of(&subs, 4);
    let events = 240;
    let deliveries: Vec<_> = (0..events)
        .map(|i| {
            (
                "shop",
                format!("evt-{i}"),
                "order.completed",
                // Orders repeat: the business key must hold across workers too.
                order_body(&format!("o-{}", i % 200), &format!("c-{}", i % 7), 1),
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
            let consumer = Arc::clone(&consumer);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let mut claimed = 0;
                for _ in 0..2_000 {
                    let n = if w % 2 == 0 {
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
    let claimed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(claimed, 3 * events, "one claim per event and subscription");
    for i in 0..events {
        let id = format!("evt-{i}");
        assert_eq!(h.loyalty.calls_for(&id), 1, "{id}: credited once");
        assert_eq!(h.audit.calls_for(&id), 2, "{id}: logged once by each audit");
        let detail = h.detail("shop", &id);
        let states: Vec<_> = detail
            .event
            .subscriptions
            .iter()
            .map(|s| (s.name.as_str(), s.status.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("points", "completed"),
                ("ledger", "completed"),
                ("archive", "completed")
            ],
            "{id}"
        );
        assert_eq!(detail.history.len(), 3, "{id}");
    }
    // 200 distinct orders over 7 customers, one point each.
    let total: i64 = (0..7).map(|c| h.balance(&format!("c-{c}"))).sum();
    assert_eq!(total, 200);
    assert_eq!(
        h.count("SELECT count(*) FROM event_attempts"),
        3 * events as i64
    );
}

/// The CLI over the same routes: list, pause, resume, backfill, and `--subscription` on
/// `events list`, `show` and `retry`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_pauses_resumes_and_backfills_subscriptions() {
    use crate::cli::{cli, stderr, stdout};
    let app = app_with(FAN_OUT).await;
    let o = cli(&app, &["subscriptions", "list"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for expected in [
        "points",
        "loyalty-credit",
        "archive",
        "shop, stripe: *",
        "invoice.*",
    ] {
        assert!(out.contains(expected), "{expected} in:\n{out}");
    }
    let o = cli(&app, &["subscriptions", "pause", "archive"]).await;
    assert!(
        stdout(&o).contains("paused"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    app.deliver("shop", "e-1", &order_body("o-1", "c-1", 2))
        .await;
    app.drain().await;
    let o = cli(
        &app,
        &[
            "events",
            "list",
            "--subscription",
            "archive",
            "--status",
            "pending",
            "--json",
        ],
    )
    .await;
    let page: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(page["events"].as_array().unwrap().len(), 1, "{page}");
    let o = cli(&app, &["events", "show", "shop", "e-1"]).await;
    let out = stdout(&o);
    assert!(
        out.contains("SUBSCRIPTION") && out.contains("archive") && out.contains("credited"),
        "{out}"
    );
    let o = cli(&app, &["subscriptions", "resume", "archive", "--json"]).await;
    let resumed: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(resumed["state"], "active");
    let o = cli(&app, &["subscriptions", "pause", "nope"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nope"), "{}", stderr(&o));
    let o = cli(
        &app,
        &[
            "subscriptions",
            "backfill",
            "ledger",
            "--since",
            "1h",
            "--json",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let handed: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(handed["backfilled"], 0, "ledger took every event already");
    let o = cli(
        &app,
        &["events", "retry", "shop", "e-1", "--subscription", "ledger"],
    )
    .await;
    assert!(!o.status.success(), "a completed state needs --force");
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    app.stop().await;
}

/// A purge takes an event's body only when every subscription is done with it: one failed
/// state past its age does not make an event due while another subscription's state waits.
/// (Seen failing without the check: the waiting state's claim then found no body.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waits_until_every_subscription_is_done_with_an_event() {
    let app = app_with(FAN_OUT).await;
    let r = app.admin_post("/subscriptions/archive/pause", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let bad = r#"{"type":"order.completed","data":{"customer_id":"c","points":1}}"#;
    app.deliver("shop", "bad", bad).await;
    app.drain().await;
    let event = app.event("shop", "bad").await;
    assert_eq!(
        states(&event),
        [
            ("points".into(), "failed".into()),
            ("ledger".into(), "completed".into()),
            ("archive".into(), "pending".into())
        ]
    );
    let future = "2100-01-01T00:00:00Z";
    let purge = serde_json::json!({"completed_before": future, "failed_before": future});
    let r = app.admin_post("/events/purge", Some(purge.clone())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["purged"], 0, "{}", r.body);
    let event = app.event("shop", "bad").await;
    assert_eq!(event["purged"], false, "{event}");
    assert_eq!(event["payload"]["type"], "order.completed", "{event}");
    // Resumed, the archive takes it (its body is there), and then the purge may.
    app.admin_post("/subscriptions/archive/resume", None).await;
    app.drain().await;
    let event = app.event("shop", "bad").await;
    assert_eq!(event["subscriptions"][2]["status"], "completed", "{event}");
    let r = app.admin_post("/events/purge", Some(purge)).await;
    assert_eq!(r.body["purged"], 1, "{}", r.body);
    app.stop().await;
}

/// `copy` carries a database whose events fan out (SQLite to SQLite here; both directions
/// through PostgreSQL in tests/api/copy_registry.rs): every row, each subscription's state
/// of the event included, and a node on the copy shows them as the source's did. Seen failing
/// before the copy carried the registry: refused, naming `points`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_carries_a_database_with_its_own_subscriptions() {
    let app = app_with(FAN_OUT).await;
    app.deliver("shop", "e", &order_body("o-1", "c-1", 1)).await;
    app.drain().await;
    let shown = app.event("shop", "e").await["subscriptions"].clone();
    let dir = app.stop().await;
    let out = tokio::task::spawn_blocking({
        let path = dir.path().to_path_buf();
        move || {
            crate::copy::copy(
                &path,
                &["--from", "sqlite://inbox.db", "--to", "sqlite://copy.db"],
            )
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (source, copied) = (dir.path().join("inbox.db"), dir.path().join("copy.db"));
    crate::copy::assert_same_rows(&source, &copied);
    let mut config = test_config(&dir).replace("inbox.db\"", "copy.db\"");
    config.push_str(FAN_OUT);
    let node = spawn_in(dir, &config, BuildOptions::default()).await;
    let event = node.event("shop", "e").await;
    assert_eq!(event["subscriptions"], shown, "{event}");
    assert_eq!(
        event["subscriptions"].as_array().unwrap().len(),
        3,
        "{event}"
    );
    node.stop().await;
}
