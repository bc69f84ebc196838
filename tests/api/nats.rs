//! Subscriptions of kind `nats` (SPEC section 13) against a real JetStream broker (the one
//! `scripts/with-nats` starts): every event reaches the stream once, with its headers, read
//! back by a consumer here; a missing stream fails attempts with their cause, opens the
//! breaker and delivers once it exists; a paused subscription publishes nothing; bad settings
//! are refused naming the key.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, message::StreamMessage};
use serde_json::json;
use webhook_inbox::forward::call::webhook_id;

use crate::brokers::{
    ORDERED_BY, TRACEPARENT, app_with_table, assert_in_key_order, send_keyed_orders, send_orders,
    send_traced, until_published,
};
use crate::helpers::*;
use crate::registry_routes::{assert_names, create};

/// The shared broker's URL (`TEST_NATS_URL`), or `None`: the test was skipped (or, under
/// `TEST_REQUIRE_ALL`, has failed).
pub fn broker() -> Option<String> {
    let url = std::env::var("TEST_NATS_URL").ok();
    let found = url
        .as_ref()
        .map(|_| ())
        .ok_or_else(|| "TEST_NATS_URL is not set (run scripts/with-nats cargo nextest run)".into());
    crate::requires::available("a NATS server with JetStream", found).then(|| url.unwrap())
}

/// A name no other test uses on the shared broker (stream names and subject prefixes).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

pub async fn jetstream_of(url: &str) -> jetstream::Context {
    jetstream::new(
        async_nats::connect(url)
            .await
            .expect("connect to the broker"),
    )
}

/// A stream taking every subject under `prefix`, with the default duplicate window (2 min).
pub async fn make_stream(js: &jetstream::Context, name: &str, prefix: &str) {
    js.create_stream(jetstream::stream::Config {
        name: name.into(),
        subjects: vec![format!("{prefix}.>")],
        ..Default::default()
    })
    .await
    .expect("create the stream");
}

/// Every message the stream holds, in order: the test's consumer.
pub async fn stored(js: &jetstream::Context, name: &str) -> Vec<StreamMessage> {
    let mut stream = js.get_stream(name).await.expect("the stream");
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for seq in 1..=last {
        if let Ok(m) = stream.get_raw_message(seq).await {
            all.push(m);
        }
    }
    all
}

pub fn header(m: &StreamMessage, name: &str) -> String {
    m.headers
        .get(name)
        .map(|v| v.as_str().to_string())
        .unwrap_or_default()
}

/// The message ids of `messages`, checked distinct: the stream holds no duplicate.
pub fn distinct_ids(messages: &[StreamMessage]) -> HashSet<String> {
    let ids: HashSet<String> = messages.iter().map(|m| header(m, "Nats-Msg-Id")).collect();
    assert_eq!(ids.len(), messages.len(), "a duplicate in the stream");
    ids
}

/// The `[[subscriptions]]` table of a `nats` subscription `bus` taking `shop`'s events.
pub fn bus_table(url: &str, prefix: &str, extra: &str) -> String {
    format!(
        r#"
[[subscriptions]]
name = "bus"
kind = "nats"
sources = ["shop"]
url = "{url}"
subject = "{prefix}.{{source}}.{{type}}"
timeout_ms = 1500
backoff_base_ms = 50
backoff_max_ms = 400
max_attempts = 200
{extra}
"#
    )
}

pub async fn app_with_bus(url: &str, prefix: &str, extra: &str) -> TestApp {
    app_with_table(bus_table(url, prefix, extra)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_every_event_reaches_the_stream_once_with_its_headers() {
    let Some(url) = broker() else { return };
    let (name, prefix) = (unique("S"), unique("p"));
    let js = jetstream_of(&url).await;
    make_stream(&js, &name, &prefix).await;
    let app = app_with_bus(&url, &prefix, &format!("stream = \"{name}\"")).await;
    let sent = send_orders(&app, "e", 20).await;
    // Another source's event is not `bus`'s.
    let other = order_body("x", "c1", 1);
    assert_eq!(
        app.deliver("strict", "s-1", &other).await.body["status"],
        "queued"
    );
    let view = until_published(&app, 20, Duration::from_secs(30)).await;
    assert_eq!(view["url_origin"], url.as_str(), "{view}");
    assert_eq!(
        view["subject"],
        format!("{prefix}.{{source}}.{{type}}"),
        "{view}"
    );
    let messages = stored(&js, &name).await;
    assert_eq!(messages.len(), 20);
    let ids = distinct_ids(&messages);
    for (id, body) in &sent {
        let m = messages
            .iter()
            .find(|m| header(m, "webhook-inbox-event-id") == *id)
            .unwrap_or_else(|| panic!("{id} is not in the stream"));
        assert!(ids.contains(&webhook_id("shop", id)));
        assert_eq!(header(m, "Nats-Msg-Id"), webhook_id("shop", id));
        assert_eq!(m.subject.as_str(), format!("{prefix}.shop.order_completed"));
        assert_eq!(header(m, "webhook-inbox-source"), "shop");
        assert_eq!(header(m, "webhook-inbox-event-type"), "order.completed");
        assert_eq!(header(m, "webhook-inbox-attempt"), "1");
        assert_eq!(header(m, "Content-Type"), "application/json");
        assert_eq!(m.payload.as_ref(), body.as_bytes());
    }
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains(r#"webhook_inbox_forwards_total{subscription="bus",result="acked"} 20"#),
        "{metrics}"
    );
    app.stop().await;
}

/// No stream yet: each attempt fails naming the missing stream, is retried, and the run of
/// failures opens the breaker; once the stream exists the probe closes it and every event
/// reaches the stream once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_missing_stream_fails_attempts_opens_the_breaker_then_delivers() {
    let Some(url) = broker() else { return };
    let (name, prefix) = (unique("S"), unique("p"));
    let app = app_with_bus(&url, &prefix, &format!("stream = \"{name}\"")).await;
    send_orders(&app, "m", 8).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let state = loop {
        let event = app.event("shop", "m-0").await;
        let bus = event["subscriptions"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == "bus").cloned());
        let view = app.get("/subscriptions/bus").await.body;
        if let Some(bus) = bus.filter(|b| b["attempts"].as_i64().unwrap_or(0) >= 2)
            && view["state"] == "probing"
        {
            break bus;
        }
        assert!(
            Instant::now() < deadline,
            "no failed attempts, no open breaker: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(state["status"], "completed", "{state}");
    let error = state["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("the stream `{name}` is not there")),
        "{state}"
    );
    let js = jetstream_of(&url).await;
    make_stream(&js, &name, &prefix).await;
    let view = until_published(&app, 8, Duration::from_secs(30)).await;
    assert_eq!(view["state"], "active", "{view}");
    assert_eq!(distinct_ids(&stored(&js, &name).await).len(), 8);
    app.stop().await;
}

/// Without `stream`, a subject no stream takes is refused by the broker: a failed attempt with
/// that cause, retried until a stream takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_subject_no_stream_takes_is_a_failed_attempt_with_its_cause() {
    let Some(url) = broker() else { return };
    let (name, prefix) = (unique("S"), unique("p"));
    let app = app_with_bus(&url, &prefix, "").await;
    send_orders(&app, "r", 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let event = app.event("shop", "r-0").await;
        let text = event.to_string();
        if text.contains("did not ack the publish") {
            assert!(
                text.contains(&format!("{prefix}.shop.order_completed")),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no refused attempt: {event}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let js = jetstream_of(&url).await;
    make_stream(&js, &name, &prefix).await;
    until_published(&app, 1, Duration::from_secs(30)).await;
    assert_eq!(stored(&js, &name).await.len(), 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_paused_subscription_publishes_nothing_until_resumed() {
    let Some(url) = broker() else { return };
    let (name, prefix) = (unique("S"), unique("p"));
    let js = jetstream_of(&url).await;
    make_stream(&js, &name, &prefix).await;
    let app = app_with_bus(&url, &prefix, "").await;
    assert_eq!(
        app.admin_post("/subscriptions/bus/pause", None)
            .await
            .status,
        200
    );
    send_orders(&app, "p", 5).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(stored(&js, &name).await.len(), 0, "published while paused");
    assert_eq!(
        app.admin_post("/subscriptions/bus/resume", None)
            .await
            .status,
        200
    );
    until_published(&app, 5, Duration::from_secs(30)).await;
    assert_eq!(distinct_ids(&stored(&js, &name).await).len(), 5);
    app.stop().await;
}

/// The API refuses what the config refuses, naming the key; a good one is shown with its
/// broker's origin, subject and stream (no broker needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_bad_settings_are_refused_in_the_api_naming_the_key() {
    let app = spawn_app().await;
    let good = json!({"name": "bus", "kind": "nats", "url": "nats://u:pw@127.0.0.1:4222",
                      "subject": "hooks.{source}.{type}", "stream": "HOOKS"});
    for (field, value) in [
        ("url", json!("http://127.0.0.1:4222")),
        ("subject", json!("hooks.*")),
        ("subject", json!("hooks..{type}")),
        ("subject", json!("hooks.{id}")),
        ("stream", json!("a.b")),
        ("signing_secret", json!(SW_SECRET)),
        ("token", json!("t".repeat(40))),
    ] {
        let mut body = good.clone();
        body[field] = value;
        assert_names(&create(&app, body).await, field);
    }
    let mut no_subject = good.clone();
    no_subject.as_object_mut().unwrap().remove("subject");
    assert_names(&create(&app, no_subject).await, "subject");
    let on_http = json!({"name": "h", "kind": "http", "url": "http://127.0.0.1:9/in",
                         "subject": "a"});
    assert_names(&create(&app, on_http).await, "subject");
    let made = create(&app, good).await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["url_origin"], "nats://127.0.0.1:4222");
    assert_eq!(made.body["subject"], "hooks.{source}.{type}");
    assert_eq!(made.body["stream"], "HOOKS");
    assert!(made.body.get("signing_secret").is_none(), "{}", made.body);
    let patched = crate::registry_routes::patch(&app, "bus", r#"{"subject": "a b"}"#).await;
    assert_names(&patched, "subject");
    app.stop().await;
}

/// The CLI's `--subject`, `--stream` and `--creds-file` become the fields (no broker needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_the_cli_creates_a_nats_subscription() {
    let app = spawn_app().await;
    let made = crate::cli::cli(
        &app,
        &[
            "subscriptions",
            "create",
            "bus",
            "--kind",
            "nats",
            "--endpoint-url",
            "nats://127.0.0.1:4222",
            "--subject",
            "hooks.{type}",
            "--stream",
            "HOOKS",
        ],
    )
    .await;
    assert!(made.status.success(), "{made:?}");
    let shown = app.get("/subscriptions/bus").await.body;
    assert_eq!(shown["kind"], "nats");
    assert_eq!(shown["subject"], "hooks.{type}");
    assert_eq!(shown["stream"], "HOOKS");
    let refused = crate::cli::cli(
        &app,
        &["subscriptions", "update", "bus", "--subject", "a.*"],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        crate::cli::stderr(&refused).contains("subject"),
        "{refused:?}"
    );
    let no_creds = [
        "subscriptions",
        "update",
        "bus",
        "--creds-file",
        "/no/such.creds",
    ];
    let refused = crate::cli::cli(&app, &no_creds).await;
    assert!(!refused.status.success());
    assert!(
        crate::cli::stderr(&refused).contains("creds_file"),
        "{refused:?}"
    );
    app.stop().await;
}

/// `ordered_by`: the events of one key reach the stream in the order they were stored, also
/// when the first attempts failed (no stream yet) and the backlog then flows at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_ordered_by_keeps_each_keys_order_in_the_stream() {
    let Some(url) = broker() else { return };
    let (name, prefix) = (unique("S"), unique("p"));
    let app = app_with_bus(&url, &prefix, ORDERED_BY).await;
    send_keyed_orders(&app).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let js = jetstream_of(&url).await;
    make_stream(&js, &name, &prefix).await;
    until_published(&app, 30, Duration::from_secs(30)).await;
    let messages = stored(&js, &name).await;
    assert_eq!(distinct_ids(&messages).len(), 30);
    let keyed: Vec<_> = messages
        .iter()
        .map(|m| {
            let body = String::from_utf8_lossy(&m.payload).into_owned();
            (body, header(m, "webhook-inbox-event-id"))
        })
        .collect();
    assert_in_key_order(&keyed);
    app.stop().await;
}

/// A provider's W3C `traceparent`, stored with the event, rides on the published message (SPEC
/// section 15: carried on broker messages' headers), passed on unchanged with tracing off.
/// Seen failing (no `traceparent` header) with the publish's header line taken out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_providers_traceparent_rides_on_the_message() {
    let Some(url) = broker() else { return };
    let (name, prefix) = (unique("S"), unique("p"));
    let js = jetstream_of(&url).await;
    make_stream(&js, &name, &prefix).await;
    let app = app_with_bus(&url, &prefix, "").await;
    send_traced(&app).await;
    let messages = stored(&js, &name).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(header(&messages[0], "traceparent"), TRACEPARENT);
    app.stop().await;
}
