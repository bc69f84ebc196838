//! Filters over HTTP (issue 61): a filter that cannot compile is refused with 422 naming its
//! path and operator, nothing stored; `GET /subscriptions` shows one; an event a filter left
//! out says so in its view and has no state there; `POST /subscriptions/preview` decides a
//! stored event or a body without changing anything.

use serde_json::{Value, json};

use crate::helpers::*;
use crate::stores::{StoreKind, async_store_tests};

async_store_tests!(
    a_filter_that_cannot_compile_is_refused_naming_its_path_and_operator,
    an_event_a_filter_leaves_out_has_no_state_there_and_says_so,
    preview_decides_a_stored_event_or_a_body_and_changes_nothing,
);

async fn create(app: &TestApp, body: Value) -> Reply {
    app.admin_post("/subscriptions", Some(body)).await
}

fn usd_over_1000() -> Value {
    json!({"all": [{"path": "/data/object/currency", "eq": "usd"},
                   {"path": "/data/object/amount", "gte": 1000}]})
}

fn charge(currency: &str, amount: Value) -> String {
    json!({"type": "charge.succeeded",
           "data": {"object": {"currency": currency, "amount": amount}}})
    .to_string()
}

fn message(reply: &Reply) -> String {
    reply.body["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn a_filter_that_cannot_compile_is_refused_naming_its_path_and_operator(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let cases = [
        (
            json!({"path": "/data/object/amount", "gte": {"v": 1}}),
            "`/data/object/amount` `gte`",
        ),
        (
            json!({"path": "/data/object/amount", "around": 3}),
            "unknown operator `around`",
        ),
        (json!({"path": "data", "eq": 3}), "JSON pointer"),
        (
            json!({"all": [{"path": "/a", "eq": 1}, {"path": "/b'; DROP TABLE subscriptions; --", "in": "x"}]}),
            "all[1]: `/b'; DROP TABLE subscriptions; --` `in`",
        ),
        (json!(["not", "an", "object"]), "a filter is an object"),
    ];
    for (filter, named) in cases {
        let reply = create(
            &app,
            json!({"name": "picky", "kind": "pull", "sources": ["shop"], "filter": filter}),
        )
        .await;
        reply.assert_error(422, "invalid_request");
        let text = message(&reply);
        assert!(text.starts_with("filter: "), "{text}");
        assert!(text.contains(named), "{named} not named: {text}");
        assert_eq!(
            app.get("/subscriptions/picky").await.status,
            404,
            "nothing stored"
        );
    }
    // A PATCH is checked the same way, and leaves the subscription as it was.
    let made = create(
        &app,
        json!({"name": "picky", "kind": "pull", "filter": usd_over_1000()}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let reply = app
        .client
        .patch(app.url("/subscriptions/picky"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"filter": {"path": "/x", "exists": "maybe"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 422);
    assert_eq!(
        app.get("/subscriptions/picky").await.body["filter"],
        usd_over_1000()
    );
}

async fn an_event_a_filter_leaves_out_has_no_state_there_and_says_so(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let made = create(
        &app,
        json!({"name": "big-usd", "kind": "pull", "sources": ["shop"], "filter": usd_over_1000()}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["filter"], usd_over_1000());
    let listed = app.get("/subscriptions").await;
    let shown = listed.body["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "big-usd")
        .unwrap()
        .clone();
    assert_eq!(shown["filter"], usd_over_1000());
    for (id, body) in [
        ("big", charge("usd", json!(1000.0))),
        ("small", charge("usd", json!(999))),
        ("text", charge("usd", json!("5000"))),
    ] {
        assert_eq!(app.deliver("shop", id, &body).await.status, 200);
    }
    // Before the fan-out, the event's view already leaves the filtered subscription out.
    let waiting = app.event("shop", "small").await;
    assert_eq!(waiting["filtered_out"], json!(["big-usd"]), "{waiting}");
    app.drain().await;
    let big = app.event("shop", "big").await;
    assert!(big.get("filtered_out").is_none(), "{big}");
    let names: Vec<&str> = big["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"big-usd"), "{big}");
    for id in ["small", "text"] {
        let event = app.event("shop", id).await;
        assert_eq!(event["filtered_out"], json!(["big-usd"]), "{event}");
        let states = event["subscriptions"].as_array().unwrap();
        assert!(states.iter().all(|s| s["name"] != "big-usd"), "{event}");
    }
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("webhook_inbox_filtered_out_total{subscription=\"big-usd\"} 2"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("filtered"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

async fn preview_decides_a_stored_event_or_a_body_and_changes_nothing(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let body = charge("usd", json!(2500));
    assert_eq!(app.deliver("shop", "ch_1", &body).await.status, 200);
    let preview = |v: Value| {
        let app = &app;
        async move { app.admin_post("/subscriptions/preview", Some(v)).await }
    };
    let by_event = preview(json!({"filter": usd_over_1000(),
                                  "event": {"source": "shop", "event_id": "ch_1"}}))
    .await;
    assert_eq!(by_event.status, 200, "{}", by_event.body);
    assert_eq!(by_event.body["matches"], true);
    assert_eq!(
        by_event.body["delivered"],
        serde_json::from_str::<Value>(&body).unwrap()
    );
    assert_eq!(by_event.body["error"], Value::Null);
    let by_body = preview(json!({"filter": usd_over_1000(),
                                 "body": {"data": {"object": {"currency": "usd", "amount": "2500"}}}}))
    .await;
    assert_eq!(by_body.status, 200, "{}", by_body.body);
    assert_eq!(
        by_body.body,
        json!({"matches": false, "delivered": null, "error": null, "outcome": "not_matched"})
    );
    let no_filter = preview(json!({"body": [1, 2]})).await;
    assert_eq!(no_filter.body["matches"], true);
    assert_eq!(no_filter.body["delivered"], json!([1, 2]));
    // Refusals: each names its field; an unknown event is 404.
    let transform = preview(json!({"transform": ".data |", "body": {}})).await;
    transform.assert_error(422, "invalid_request");
    assert!(
        message(&transform).starts_with("transform: "),
        "{}",
        transform.body
    );
    let bad = preview(json!({"filter": {"path": "/a", "lt": [1]}, "body": {}})).await;
    bad.assert_error(422, "invalid_request");
    assert!(message(&bad).contains("`/a` `lt`"), "{}", bad.body);
    let neither = preview(json!({"filter": usd_over_1000()})).await;
    neither.assert_error(422, "invalid_request");
    assert!(message(&neither).starts_with("event: "), "{}", neither.body);
    let unknown = preview(json!({"event": {"source": "shop", "event_id": "nope"}})).await;
    unknown.assert_error(404, "not_found");
    let stray = preview(json!({"body": {}, "subscription": "x"})).await;
    stray.assert_error(422, "invalid_request");
    // Nothing changed: the event is as it was, still waiting for its fan-out.
    let event = app.event("shop", "ch_1").await;
    assert_eq!(event["status"], "pending", "{event}");
    // A subscription named `preview` keeps its routes.
    let made = create(&app, json!({"name": "preview", "kind": "pull"})).await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(app.get("/subscriptions/preview").await.status, 200);
}

/// `subscriptions create --filter` and `subscriptions preview NAME --event SOURCE/ID`, with the
/// real binary against a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_a_filter_and_previews_an_event() {
    let app = spawn_app().await;
    let filter = usd_over_1000().to_string();
    let made = crate::cli::cli(
        &app,
        &[
            "subscriptions",
            "create",
            "big-usd",
            "--kind",
            "pull",
            "--filter",
            &filter,
        ],
    )
    .await;
    assert!(made.status.success(), "{made:?}");
    assert_eq!(
        app.get("/subscriptions/big-usd").await.body["filter"],
        usd_over_1000()
    );
    for (id, amount) in [("big", 5000), ("small", 5)] {
        let body = charge("usd", json!(amount));
        assert_eq!(app.deliver("shop", id, &body).await.status, 200);
    }
    let taken = crate::cli::cli(
        &app,
        &["subscriptions", "preview", "big-usd", "--event", "shop/big"],
    )
    .await;
    assert!(taken.status.success(), "{taken:?}");
    let out = crate::cli::stdout(&taken);
    assert!(
        out.contains("big-usd: takes shop/big") && out.contains("5000"),
        "{out}"
    );
    let left = crate::cli::cli(
        &app,
        &[
            "subscriptions",
            "preview",
            "big-usd",
            "--event",
            "shop/small",
            "--json",
        ],
    )
    .await;
    assert!(left.status.success(), "{left:?}");
    let answer: Value = serde_json::from_str(&crate::cli::stdout(&left)).unwrap();
    assert_eq!(answer["matches"], false);
    let refused = crate::cli::cli(
        &app,
        &[
            "subscriptions",
            "update",
            "big-usd",
            "--filter",
            "{\"path\":\"/a\",\"gt\":null}",
        ],
    )
    .await;
    assert!(!refused.status.success());
    let err = crate::cli::stderr(&refused);
    assert!(err.contains("filter") && err.contains("`/a` `gt`"), "{err}");
}
