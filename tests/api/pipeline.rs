//! Deliveries through to effects over HTTP: `POST /events/run`, `GET /events?status=`, the
//! attempt history, `GET /loyalty/{customer}`, the worker pool, and SIGTERM on the binary.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::*;
use crate::process::{ServerProcess, free_port, send_signed, write_config};

#[tokio::test]
async fn a_drain_pass_credits_orders_and_records_history() {
    let app = spawn_app().await;
    app.deliver("shop", "e1", &order_body("o-1", "c-1", 10))
        .await;
    app.deliver("shop", "e2", &order_body("o-2", "c-1", 5))
        .await;
    app.deliver("shop", "e3", &order_body("o-1", "c-1", 10))
        .await; // business duplicate
    app.deliver(
        "shop",
        "e4",
        r#"{"type":"order.completed","data":{"customer_id":"c-1"}}"#,
    )
    .await;
    app.deliver("shop", "e5", r#"{"type":"customer.created"}"#)
        .await;

    let pending = app.get("/events?status=pending").await;
    assert_eq!(pending.body["events"].as_array().unwrap().len(), 5);
    let r = app.admin_post("/events/run?limit=100", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, json!({"claimed": 5}));
    assert_eq!(
        app.admin_post("/events/run", None).await.body,
        json!({"claimed": 0})
    );

    let account = app.get("/loyalty/c-1").await.body;
    assert_eq!(account["balance"], 15);
    assert_eq!(account["credits"].as_array().unwrap().len(), 2);
    assert_eq!(
        app.get("/loyalty/nobody").await.body,
        json!({"customer_id": "nobody", "balance": 0, "credits": [], "next_cursor": null})
    );

    let e3 = app.event("shop", "e3").await;
    assert_eq!(e3["status"], "completed");
    assert_eq!(e3["outcome"], "duplicate_order");
    let e4 = app.event("shop", "e4").await;
    assert_eq!(e4["status"], "failed");
    assert!(e4["last_error"].as_str().unwrap().contains("order_id"));
    assert_eq!(e4["history"][0]["result"], "permanent_error");
    assert_eq!(app.event("shop", "e5").await["outcome"], "logged");
    let e1 = app.event("shop", "e1").await;
    assert_eq!(e1["attempts"], 1);
    let attempt = &e1["history"][0];
    assert_eq!(attempt["attempt"], 1);
    assert_eq!(attempt["result"], "ok");
    assert!(attempt["worker"].as_str().unwrap().ends_with("-run"));
    assert!(attempt["started_at"].as_str().unwrap().ends_with('Z'));
    assert!(attempt["finished_at"].is_string());
    assert_eq!(attempt["error"], serde_json::Value::Null);

    let failed = app.get("/events?status=failed").await.body;
    let ids: Vec<_> = failed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].clone())
        .collect();
    assert_eq!(ids, [json!("e4")]);
    app.get("/events?status=sideways")
        .await
        .assert_error(422, "invalid_request");
    app.admin_post("/events/run?limit=0", None)
        .await
        .assert_error(422, "invalid_request");
    app.admin_post("/events/run?limit=abc", None)
        .await
        .assert_error(422, "invalid_request");
}

#[tokio::test]
async fn the_worker_pool_processes_deliveries_without_being_asked() {
    let app = spawn_app_with(
        |c| *c = c.replace("workers = 0", "workers = 2"),
        Default::default(),
    )
    .await;
    for i in 0..20 {
        app.deliver(
            "shop",
            &format!("e{i}"),
            &order_body(&format!("o-{i}"), "c-pool", 2),
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.balance("c-pool").await != 40 {
        assert!(Instant::now() < deadline, "the pool did not drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dir = app.stop().await;
    drop(dir);
}

#[test]
fn sigterm_stops_the_binary_cleanly_and_a_restart_finishes_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (config, settings) = write_config(dir.path(), port, "", "workers = 2");
    let mut server = ServerProcess::start(dir.path(), &config, port, "a.log");
    let client = reqwest::blocking::Client::new();
    for i in 0..50 {
        let body = order_body(&format!("o-{i}"), "c-t", 1);
        assert_eq!(
            send_signed(&client, &server.base, &settings, &format!("e{i}"), &body),
            200
        );
    }
    let status = server.terminate(Duration::from_secs(40));
    assert!(status.success(), "exit status {status}: {}", server.logs());
    assert!(server.logs().contains("stopped"), "{}", server.logs());
    // Nothing is left claimed by the stopped process.
    let conn = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
    let claimed: i64 = conn
        .query_row(
            "SELECT count(*) FROM events WHERE status = 'claimed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(claimed, 0);
    let server = ServerProcess::start(dir.path(), &config, port, "b.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let account: serde_json::Value = client
            .get(format!("{}/loyalty/c-t", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if account["balance"] == 50 {
            break;
        }
        assert!(Instant::now() < deadline, "not drained: {account}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn json_logs_carry_the_request_id_and_never_a_secret_or_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let top = format!("log_format = \"json\"\nsubmission_tokens = [\"{SUBMIT_TOKEN}\"]");
    let (config, settings) = write_config(dir.path(), port, &top, "workers = 1");
    let mut server = ServerProcess::start(dir.path(), &config, port, "json.log");
    let client = reqwest::blocking::Client::new();
    // The audit handler logs each event it records, naming it.
    let body = r#"{"type":"customer.created"}"#;
    assert_eq!(
        send_signed(&client, &server.base, &settings, "logged-1", body),
        200
    );
    // A refused delivery and a refused token, with our own request id.
    let r = client
        .post(format!("{}/webhooks/shop", server.base))
        .header("x-request-id", "trace-me-42")
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .get(format!("{}/events", server.base))
        .bearer_auth("not-the-token")
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .get(format!("{}/events", server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    client
        .post(format!("{}/requests", server.base))
        .bearer_auth(SUBMIT_TOKEN)
        .send()
        .unwrap();
    // Let the worker process the event, then stop so that the log is complete.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server.logs().contains("event received") {
        assert!(Instant::now() < deadline, "{}", server.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.terminate(Duration::from_secs(30)).success());
    let logs = server.logs();
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
    let refused = logs
        .lines()
        .find(|l| l.contains("trace-me-42"))
        .unwrap_or_else(|| panic!("the caller's request id is logged: {logs}"));
    assert!(
        refused.contains("\"path\":\"/webhooks/shop\"")
            && refused.contains("\"method\":\"POST\"")
            && refused.contains("\"status\":401"),
        "the refusal says what was refused: {refused}"
    );
    let received = logs.lines().find(|l| l.contains("event received")).unwrap();
    assert!(
        received.contains("\"event_id\":\"logged-1\"") && received.contains("\"source\":\"shop\""),
        "{received}"
    );
    for secret in [
        ADMIN_TOKEN,
        SUBMIT_TOKEN,
        SW_SECRET,
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "not-the-token",
    ] {
        assert!(!logs.contains(secret), "{secret} leaked into the logs");
    }
}
