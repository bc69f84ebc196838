//! Transformations beyond the forwarder (SPEC section 13): a pull claim hands out the
//! transformed body and never an event its transform left out or failed on; the registry
//! keeps, shows and removes a transform on both stores, and refuses a bad one; the preview
//! answers what would be delivered.

use serde_json::{Value, json};
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::pgdb::{self, PgDatabase};
use crate::pull::pull_config;
use crate::registry_routes::{assert_names, create, patch};
use crate::transforms::until_state;

const PROGRAM: &str =
    r#"select(.kind != "noise") | {order: .order_id, total: (.lines | map(.qty * .price) | add)}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_claim_gets_the_transformed_body_and_never_what_the_transform_left_out() {
    let extra = format!("transform = '''{PROGRAM}'''");
    let app = spawn_app_with(pull_config(&extra), BuildOptions::default()).await;
    let bodies = [
        (
            "p1",
            json!({"order_id": "o-1", "lines": [{"qty": 2, "price": 5}, {"qty": 1, "price": 3}]}),
        ),
        ("p2", json!({"kind": "noise", "order_id": "o-2"})),
        ("p3", json!({"order_id": "o-3", "lines": "not a list"})),
    ];
    for (id, body) in &bodies {
        assert_eq!(app.deliver("shop", id, &body.to_string()).await.status, 200);
    }
    // A claim beside recent ingest may take fewer than asked: claim until each was decided.
    let mut claims = Vec::new();
    for _ in 0..50 {
        claims.extend(app.claim(json!({"max": 10, "wait_ms": 100})).await);
        let event = app.event("shop", "p3").await;
        if event["subscriptions"][0]["status"] == "failed" && !claims.is_empty() {
            break;
        }
    }
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0]["event_id"], "p1");
    assert_eq!(claims[0]["body"], json!({"order": "o-1", "total": 13}));
    assert_eq!(claims[0]["content_type"], "application/json");
    let filtered = until_state(&app, "p2", "orders", "completed").await;
    assert_eq!(filtered["outcome"], "filtered");
    let failed = until_state(&app, "p3", "orders", "failed").await;
    let error = failed["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("transform: the program failed: "),
        "{error}"
    );
    assert!(
        app.claim(json!({})).await.is_empty(),
        "nothing else is handed out"
    );
    // The stored body is the original.
    assert_eq!(app.event("shop", "p1").await["payload"], bodies[0].1);
    let acked = app
        .pull(
            "ack",
            json!({"results": [{"token": claims[0]["token"], "outcome": "done"}]}),
        )
        .await;
    assert_eq!(acked.body["results"][0]["applied"], true, "{}", acked.body);
    app.stop().await;
}

/// Create, show, patch away and refuse transforms through the API, on the store `app` has.
async fn the_registry_keeps_shows_and_removes_a_transform(app: &TestApp) {
    let made = create(
        app,
        json!({"name": "shaped", "kind": "http", "url": "http://127.0.0.1:9/in",
               "sources": ["shop"], "timeout_ms": 2000, "transform": "{id}"}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["transform"], "{id}");
    let listed = app.get("/subscriptions").await.body.to_string();
    assert!(listed.contains(r#""transform":"{id}""#), "{listed}");
    let changed = patch(app, "shaped", r#"{"transform": "{id, type}"}"#).await;
    assert_eq!(changed.body["transform"], "{id, type}", "{}", changed.body);
    assert_eq!(
        app.get("/subscriptions/shaped").await.body["transform"],
        "{id, type}"
    );
    let removed = patch(app, "shaped", r#"{"transform": null}"#).await;
    assert_eq!(removed.status, 200, "{}", removed.body);
    assert_eq!(removed.body.get("transform"), None, "{}", removed.body);
    // A session is a pull subscription: it takes one.
    let session = app
        .admin_post(
            "/subscriptions?session=true",
            Some(json!({"name": "sess", "kind": "pull", "transform": ".data"})),
        )
        .await;
    assert_eq!(session.status, 201, "{}", session.body);
    assert_eq!(session.body["transform"], ".data");
    // Refused, naming the field, nothing stored.
    for (body, words) in [
        (
            json!({"name": "bad", "kind": "pull", "transform": "{id: .id"}),
            "expected closing brace at 1:9",
        ),
        (
            json!({"name": "bad", "kind": "pull", "transform": "nosuch(1)"}),
            "undefined filter `nosuch`",
        ),
        (
            json!({"name": "bad", "kind": "audit", "transform": "."}),
            "kind `audit`",
        ),
        (
            json!({"name": "bad", "kind": "pull", "transform": ".".repeat(20_000)}),
            "over the limit",
        ),
        (
            json!({"name": "bad", "kind": "pull", "transform": 7}),
            "invalid type",
        ),
    ] {
        let refused = create(app, body.clone()).await;
        assert_names(&refused, "transform");
        assert!(
            refused.body["message"].as_str().unwrap().contains(words),
            "{body}: {}",
            refused.body
        );
        assert_eq!(app.get("/subscriptions/bad").await.status, 404);
    }
    let refused = patch(app, "shaped", r#"{"transform": "if . then 1"}"#).await;
    assert_names(&refused, "transform");
    assert_eq!(
        app.get("/subscriptions/shaped").await.body.get("transform"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_shows_and_removes_a_transform() {
    let app = spawn_app().await;
    the_registry_keeps_shows_and_removes_a_transform(&app).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_shows_and_removes_a_transform() {
    if !pgdb::available() {
        return;
    }
    let db = PgDatabase::create();
    let url = db.url.clone();
    let on_postgres = move |c: &mut String| {
        let line = c
            .lines()
            .find(|l| l.starts_with("database_url"))
            .unwrap()
            .to_string();
        *c = c.replace(&line, &format!("database_url = \"{url}\""));
    };
    let app = spawn_app_with(on_postgres, BuildOptions::default()).await;
    the_registry_keeps_shows_and_removes_a_transform(&app).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preview_answers_what_a_transform_would_deliver() {
    let app = spawn_app().await;
    let body = r#"{"id":"ev_1","data":{"amount":1250}}"#;
    assert_eq!(app.deliver("shop", "ev_1", body).await.status, 200);
    let preview = |v: Value| {
        let app = &app;
        async move { app.admin_post("/subscriptions/preview", Some(v)).await }
    };
    let stored = json!({"source": "shop", "event_id": "ev_1"});
    let shaped = preview(json!({"transform": "{id, cents: .data.amount}", "event": stored})).await;
    assert_eq!(
        shaped.body,
        json!({"matches": true, "delivered": {"id": "ev_1", "cents": 1250}, "error": null, "outcome": "delivered"})
    );
    let none = preview(json!({"transform": "select(.data.amount > 5000)", "event": stored})).await;
    assert_eq!(
        none.body,
        json!({"matches": true, "delivered": null, "error": null, "outcome": "filtered"})
    );
    let failing = preview(
        json!({"transform": ".data.amount | ascii_downcase", "body": {"data": {"amount": 3}}}),
    )
    .await;
    assert_eq!(failing.body["outcome"], "failed", "{}", failing.body);
    assert!(
        failing.body["error"]
            .as_str()
            .unwrap()
            .starts_with("the program failed")
    );
    let looping = preview(json!({"transform": "last(range(1e18))", "body": {}})).await;
    assert!(
        looping.body["error"]
            .as_str()
            .unwrap()
            .contains("time budget"),
        "{}",
        looping.body
    );
    let filtered_first = preview(json!({"filter": {"path": "/data/amount", "gt": 5000},
                                        "transform": "{id}", "event": stored}))
    .await;
    assert_eq!(filtered_first.body["outcome"], "not_matched");
    let bad = preview(json!({"transform": "{", "body": {}})).await;
    assert_names(&bad, "transform");
    // Nothing changed.
    assert_eq!(
        app.event("shop", "ev_1").await["payload"],
        serde_json::from_str::<Value>(body).unwrap()
    );
    app.stop().await;
}

/// `listen --source shop --transform PROG`: the session's subscription carries the program,
/// and the local endpoint gets its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_transform_reshapes_what_the_session_forwards() {
    let app = spawn_app().await;
    let receiver = crate::receiver::Receiver::start(std::time::Duration::ZERO, 200);
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .args([
            "listen",
            "--source",
            "shop",
            "--transform",
            "{id, shaped: true}",
        ])
        .args(["--forward-to", &receiver.url, "--url", &app.url("")])
        .args(["--admin-token", ADMIN_TOKEN, "--signing-secret", SW_SECRET])
        .current_dir(dir.path())
        .env_remove("WEBHOOK_INBOX_ADMIN_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("listen.err")).unwrap())
        .spawn()
        .unwrap();
    let session_transform = async || {
        let list = app.get("/subscriptions").await.body;
        list["subscriptions"].as_array().and_then(|l| {
            l.iter()
                .find(|s| s["origin"] == "session")
                .map(|s| s["transform"].clone())
        })
    };
    crate::receiver::until(
        "the session opens",
        std::time::Duration::from_secs(20),
        async || session_transform().await.is_some(),
    )
    .await;
    assert_eq!(session_transform().await, Some(json!("{id, shaped: true}")));
    assert_eq!(
        app.deliver("shop", "s1", r#"{"id":"s1","secret":"x"}"#)
            .await
            .status,
        200
    );
    crate::receiver::until(
        "listen forwards",
        std::time::Duration::from_secs(20),
        async || !receiver.calls().is_empty(),
    )
    .await;
    let body: Value = serde_json::from_slice(&receiver.calls()[0].body).unwrap();
    assert_eq!(body, json!({"id": "s1", "shaped": true}));
    let _ = child.kill();
    let _ = child.wait();
    app.stop().await;
}
