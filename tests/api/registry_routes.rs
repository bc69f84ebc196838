//! The registry's runtime routes over HTTP (SPEC section 13): `POST`, `PATCH` and `DELETE
//! /subscriptions` answer as the table says, refuse what the config refuses with 422 naming
//! the field, never answer 500 to bad input, and an api-made subscription outlives a restart
//! whose config does not name it.

use serde_json::{Value, json};
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::stores::{StoreKind, async_store_tests};

async_store_tests!(
    create_answers_201_once_with_the_generated_secret_and_409_for_a_taken_name,
    the_view_shows_the_settings_and_the_url_only_as_its_origin,
    bad_bodies_are_refused_naming_the_field_never_500,
    patch_changes_the_given_fields_and_refuses_name_kind_and_what_the_config_refuses,
    delete_finishes_the_unfinished_states_and_a_later_event_gets_none,
);

pub(crate) async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<&str>,
) -> Reply {
    let mut req = app
        .client
        .request(method, app.url(path))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    Reply {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        headers,
    }
}

pub(crate) async fn create(app: &TestApp, body: Value) -> Reply {
    send(
        app,
        reqwest::Method::POST,
        "/subscriptions",
        Some(&body.to_string()),
    )
    .await
}

pub(crate) async fn patch(app: &TestApp, name: &str, body: &str) -> Reply {
    send(
        app,
        reqwest::Method::PATCH,
        &format!("/subscriptions/{name}"),
        Some(body),
    )
    .await
}

/// A 422 whose message starts with the field it names.
pub(crate) fn assert_names(reply: &Reply, field: &str) {
    reply.assert_error(422, "invalid_request");
    let message = reply.body["message"].as_str().unwrap();
    assert!(message.contains(field), "{field} not named: {message}");
}

async fn create_answers_201_once_with_the_generated_secret_and_409_for_a_taken_name(
    kind: StoreKind,
) {
    let app = spawn_app_on(kind).await;
    let made = create(
        &app,
        json!({"name": "hooks", "kind": "http", "url": "http://127.0.0.1:9/in",
               "sources": ["shop"], "timeout_ms": 2000}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["name"], "hooks");
    assert_eq!(made.body["origin"], "api");
    assert_eq!(made.body["route"]["sources"], json!(["shop"]));
    let secret = made.body["signing_secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{secret}");
    // The same view as GET, without the secret.
    let shown = app.get("/subscriptions/hooks").await;
    assert_eq!(shown.status, 200);
    assert!(shown.body.get("signing_secret").is_none(), "{}", shown.body);
    assert_eq!(shown.body["origin"], "api");
    let again = create(&app, json!({"name": "hooks", "kind": "pull"})).await;
    again.assert_error(409, "conflict");
    let pull = create(&app, json!({"name": "workers", "kind": "pull"})).await;
    assert_eq!(pull.status, 201, "{}", pull.body);
    assert!(pull.body["token"].as_str().is_some_and(|t| t.len() >= 16));
    assert!(pull.body.get("signing_secret").is_none());
    // Ordered, and shown so, though no config names it.
    let ordered = create(
        &app,
        json!({"name": "per-customer", "kind": "pull", "ordered_by": "/data/customer_id",
               "on_failure": "skip"}),
    )
    .await;
    assert_eq!(ordered.status, 201, "{}", ordered.body);
    assert_eq!(ordered.body["ordered_by"], "/data/customer_id");
    assert_eq!(ordered.body["on_failure"], "skip");
}

/// The view carries what an editor needs (the rules and the kind's settings, by the config's
/// names), and the URL only as its origin: its user info, path and query may be credentials.
async fn the_view_shows_the_settings_and_the_url_only_as_its_origin(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let url = "https://user:pw-sekrit@hooks.example:8443/services/T0/tok-sekrit?key=q-sekrit";
    let made = create(
        &app,
        json!({"name": "hooks", "kind": "http", "url": url, "timeout_ms": 2000,
               "concurrency": 3, "rate_per_second": 5, "backoff_base_ms": 20,
               "backoff_max_ms": 900}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(
        create(&app, json!({"name": "jobs", "kind": "pull"}))
            .await
            .status,
        201
    );
    for body in [made.body.clone(), app.get("/subscriptions").await.body] {
        assert!(!body.to_string().contains("sekrit"), "{body}");
    }
    let shown = app.get("/subscriptions/hooks").await.body;
    assert!(!shown.to_string().contains("sekrit"), "{shown}");
    assert_eq!(shown["url_origin"], "https://hooks.example:8443");
    for (field, value) in [
        ("timeout_ms", 2000),
        ("concurrency", 3),
        ("rate_per_second", 5),
        ("backoff_base_ms", 20),
        ("backoff_max_ms", 900),
    ] {
        assert_eq!(shown[field], value, "{field}: {shown}");
    }
    assert!(shown.get("ca_file").is_none(), "{shown}");
    // A pull subscription has no endpoint settings; its rules are shown all the same.
    let jobs = app.get("/subscriptions/jobs").await.body;
    assert!(
        jobs.get("url_origin").is_none() && jobs.get("timeout_ms").is_none(),
        "{jobs}"
    );
    assert!(jobs["backoff_max_ms"].is_u64(), "{jobs}");
    // A new URL shows as its own origin.
    let changed = patch(&app, "hooks", r#"{"url": "http://10.0.0.7/in?t=sekrit"}"#).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(changed.body["url_origin"], "http://10.0.0.7");
    assert!(!changed.body.to_string().contains("sekrit"));
}

/// What the config refuses, the API refuses, naming the same field; bad bodies are 4xx in the
/// error shape, never 500.
async fn bad_bodies_are_refused_naming_the_field_never_500(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let refused = [
        (json!({"name": "Bad Name", "kind": "audit"}), "name"),
        (
            json!({"name": "x", "kind": "pull", "url": "http://h/"}),
            "url",
        ),
        (json!({"name": "x", "kind": "http"}), "url"),
        (
            json!({"name": "x", "kind": "http", "url": "ftp://h/"}),
            "url",
        ),
        (
            json!({"name": "x", "kind": "http", "url": "http://h/", "timeout_ms": 0}),
            "timeout_ms",
        ),
        (
            json!({"name": "x", "kind": "http", "url": "http://h/", "concurrency": 0}),
            "concurrency",
        ),
        (
            json!({"name": "x", "kind": "audit", "max_attempts": 0}),
            "max_attempts",
        ),
        (json!({"name": "x", "kind": "audit", "types": []}), "types"),
        (
            json!({"name": "x", "kind": "audit", "sources": ["requests"]}),
            "sources",
        ),
        (
            json!({"name": "x", "kind": "audit", "mode": "at-most-once"}),
            "mode",
        ),
        (
            json!({"name": "x", "kind": "pull", "token": "short"}),
            "token",
        ),
        (
            json!({"name": "x", "kind": "audit", "on_failure": "skip"}),
            "on_failure",
        ),
        (
            json!({"name": "x", "kind": "audit", "ordered_by": "data"}),
            "ordered_by",
        ),
        (json!({"name": "x", "kind": "teapot"}), "kind"),
        (
            json!({"name": "x", "kind": "audit", "colour": "red"}),
            "colour",
        ),
        (
            json!({"name": "x", "kind": "audit", "max_attempts": "three"}),
            "max_attempts",
        ),
        (json!({"kind": "audit"}), "name"),
        (json!({"name": "x"}), "kind"),
    ];
    for (body, field) in refused {
        let reply = create(&app, body.clone()).await;
        assert!(reply.status != 201, "{body} was accepted");
        assert_names(&reply, field);
    }
    // The admin token itself is refused as a pull token (it is 16 characters long).
    assert_names(
        &create(
            &app,
            json!({"name": "x", "kind": "pull", "token": ADMIN_TOKEN}),
        )
        .await,
        "token",
    );
    let post = |body: &'static str| send(&app, reqwest::Method::POST, "/subscriptions", Some(body));
    post("{not json").await.assert_error(400, "invalid_json");
    post("[1, 2]").await.assert_error(422, "invalid_request");
    post("\"audit\"").await.assert_error(422, "invalid_request");
    // Nothing of it was kept.
    let list = app.get("/subscriptions").await;
    let names: Vec<&str> = list.body["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert!(!names.contains(&"x"), "{names:?}");
}

async fn patch_changes_the_given_fields_and_refuses_name_kind_and_what_the_config_refuses(
    kind: StoreKind,
) {
    let app = spawn_app_on(kind).await;
    let made = create(
        &app,
        json!({"name": "hooks", "kind": "http", "url": "http://127.0.0.1:9/in",
               "max_attempts": 4, "types": ["order.*"]}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let changed = patch(
        &app,
        "hooks",
        r#"{"max_attempts": 7, "mode": "at-most-once"}"#,
    )
    .await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(changed.body["max_attempts"], 7);
    assert_eq!(changed.body["mode"], "at-most-once");
    // The fields not given stay.
    assert_eq!(changed.body["route"]["types"], json!(["order.*"]));
    // `null`: back to the default (every type).
    let reset = patch(&app, "hooks", r#"{"types": null}"#).await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(reset.body["route"]["types"], Value::Null);
    assert_eq!(reset.body["max_attempts"], 7);
    assert_names(&patch(&app, "hooks", r#"{"kind": "pull"}"#).await, "kind");
    assert_names(&patch(&app, "hooks", r#"{"name": "other"}"#).await, "name");
    assert_names(
        &patch(&app, "hooks", r#"{"timeout_ms": 0}"#).await,
        "timeout_ms",
    );
    assert_names(
        &patch(&app, "hooks", r#"{"token": "0123456789abcdefgh"}"#).await,
        "token",
    );
    // A secret changes by rotation (the old one keeps its grace), never by a PATCH.
    assert_names(
        &patch(
            &app,
            "hooks",
            r#"{"signing_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}"#,
        )
        .await,
        "signing_secret",
    );
    assert_names(&patch(&app, "hooks", r#"{"colour": 1}"#).await, "colour");
    assert_names(
        &patch(&app, "hooks", r#"{"max_attempts": -1}"#).await,
        "max_attempts",
    );
    patch(&app, "hooks", "{oops")
        .await
        .assert_error(400, "invalid_json");
    patch(&app, "nobody", r#"{"max_attempts": 2}"#)
        .await
        .assert_error(404, "not_found");
    // Refused patches changed nothing.
    let shown = app.get("/subscriptions/hooks").await;
    assert_eq!(shown.body["max_attempts"], 7);
    assert_eq!(shown.body["mode"], "at-most-once");
}

async fn delete_finishes_the_unfinished_states_and_a_later_event_gets_none(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let made = create(
        &app,
        json!({"name": "workers", "kind": "pull", "sources": ["shop"]}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    for i in 0..3 {
        app.deliver("shop", &format!("e{i}"), r#"{"type":"thing.done"}"#)
            .await;
    }
    app.drain().await;
    let before = app.get("/subscriptions/workers").await;
    assert_eq!(before.body["lag"], 3, "{}", before.body);
    let removed = send(
        &app,
        reqwest::Method::DELETE,
        "/subscriptions/workers",
        None,
    )
    .await;
    assert_eq!(removed.status, 200, "{}", removed.body);
    assert_eq!(
        removed.body,
        json!({"name": "workers", "removed": true, "finished": 3})
    );
    let event = app.event("shop", "e0").await;
    let state = event["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "workers")
        .cloned()
        .unwrap_or_else(|| panic!("{event}"));
    assert_eq!(state["status"], "completed");
    assert_eq!(state["outcome"], "removed");
    app.deliver("shop", "later", r#"{"type":"thing.done"}"#)
        .await;
    app.drain().await;
    let later = app.event("shop", "later").await;
    assert!(
        !later["subscriptions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "workers"),
        "{later}"
    );
    send(
        &app,
        reqwest::Method::DELETE,
        "/subscriptions/workers",
        None,
    )
    .await
    .assert_error(404, "not_found");
    // The name can be taken again: a new subscription.
    let again = create(&app, json!({"name": "workers", "kind": "audit"})).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.body["kind"], "audit");
}

/// An api-made subscription is kept by a restart whose config does not name it; a config that
/// names an api-made one leaves it as the API wrote it (and shows it declared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_api_made_subscriptions_and_a_config_does_not_take_them_back() {
    let app = spawn_app().await;
    let made = create(
        &app,
        json!({"name": "hooks", "kind": "audit", "max_attempts": 9}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let dir = app.stop().await;
    let mut text = test_config(&dir);
    text.push_str("\n[[subscriptions]]\nname = \"hooks\"\nkind = \"audit\"\nmax_attempts = 2\n");
    let app = spawn_in(dir, &text, BuildOptions::default()).await;
    let shown = app.get("/subscriptions/hooks").await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert_eq!(shown.body["origin"], "api");
    assert_eq!(shown.body["max_attempts"], 9, "the config took it back");
    assert_eq!(
        shown.body["declared_by"].as_array().unwrap().len(),
        1,
        "{}",
        shown.body
    );
    // And without it in the config at all.
    let dir = app.stop().await;
    let text = test_config(&dir);
    let app = spawn_in(dir, &text, BuildOptions::default()).await;
    let shown = app.get("/subscriptions/hooks").await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert_eq!(shown.body["state"], "active");
    assert_eq!(shown.body["max_attempts"], 9);
}

/// `GET /events/stats` counts an event while a live subscription has a state of it: one taken
/// only by a subscription since removed is counted nowhere (its states stay, finished
/// `removed`), and the events of the live ones still count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_leave_out_the_events_of_a_removed_subscription() {
    let app = spawn_app_with(
        |c| {
            c.push_str(
                "\n[[subscriptions]]\nname = \"kept\"\nkind = \"audit\"\ntypes = [\"kept.*\"]\n",
            )
        },
        BuildOptions::default(),
    )
    .await;
    let made = create(
        &app,
        json!({"name": "workers", "kind": "pull", "sources": ["shop"], "types": ["pulled.*"]}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    app.deliver("shop", "k1", r#"{"type":"kept.one"}"#).await;
    app.deliver("shop", "k2", r#"{"type":"kept.two"}"#).await;
    app.deliver("shop", "p1", r#"{"type":"pulled.one"}"#).await;
    app.drain().await;
    let counts = |body: &Value| body["counts"].clone();
    let before = app.get("/events/stats").await;
    assert_eq!(
        counts(&before.body),
        json!({"pending": 1, "claimed": 0, "completed": 2, "failed": 0})
    );
    let removed = send(
        &app,
        reqwest::Method::DELETE,
        "/subscriptions/workers",
        None,
    )
    .await;
    assert_eq!(removed.status, 200, "{}", removed.body);
    let after = app.get("/events/stats").await;
    assert_eq!(
        counts(&after.body),
        json!({"pending": 0, "claimed": 0, "completed": 2, "failed": 0})
    );
}
