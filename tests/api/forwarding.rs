//! Subscriptions of kind `http` (SPEC section 13) against a real endpoint: the example receiver
//! of `examples/http_receiver.py`, which verifies every call with the `standardwebhooks`
//! package and credits loyalty points in its own SQLite, deduplicating on `webhook-id` and on
//! `order_id` in one transaction. Whatever the endpoint does (fail, hang, reset, throttle,
//! apply and lose its answer, ask to stop), every event ends delivered and the balances are
//! exact.

use std::time::{Duration, Instant};

use serde_json::Value;
use webhook_inbox::startup::BuildOptions;

use crate::endpoint::{Endpoint, receiver_available};
use crate::helpers::*;

/// A config with one `http` subscription `billing` (taking `shop`'s events) beside an
/// in-process `points`, workers on so that the forwarder runs.
pub(crate) fn config(url: &str, extra: &str) -> impl FnOnce(&mut String) {
    let url = url.to_string();
    let extra = extra.to_string();
    move |c: &mut String| {
        *c = c.replace("workers = 0", "workers = 1");
        c.push_str(&format!(
            r#"
[[subscriptions]]
name = "points"
kind = "loyalty-credit"
types = ["order.completed"]

[[subscriptions]]
name = "billing"
kind = "http"
sources = ["shop"]
url = "{url}"
signing_secret = "{SW_SECRET}"
timeout_ms = 1500
{extra}
"#
        ))
    }
}

pub(crate) fn options() -> BuildOptions {
    BuildOptions {
        idle_poll: Some(Duration::from_millis(50)),
        ..BuildOptions::default()
    }
}

/// Wait (bounded) until `billing` has nothing pending, claimed or failed, and `want` events
/// completed; returns its view.
async fn until_delivered(app: &TestApp, want: i64, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let view = app.get("/subscriptions/billing").await.body;
        let c = &view["counts"];
        if c["completed"] == want && c["pending"] == 0 && c["claimed"] == 0 {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered within {within:?}: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The example receiver and a node forwarding to it with `extra` lines on `billing`; `None`
/// (the test returns) where the receiver's environment is missing.
async fn endpoint_and_app(extra: &str) -> Option<(tempfile::TempDir, Endpoint, TestApp)> {
    if !receiver_available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::start(dir.path(), SW_SECRET);
    let app = spawn_app_with(config(&endpoint.hook_url(), extra), options()).await;
    Some((dir, endpoint, app))
}

/// One subscription's state of an event, as the API shows it (`None` before the fan-out).
async fn find_state(app: &TestApp, source: &str, event_id: &str, name: &str) -> Option<Value> {
    let event = app.event(source, event_id).await;
    event["subscriptions"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
        .cloned()
}

async fn state_of(app: &TestApp, event_id: &str, name: &str) -> Value {
    find_state(app, "shop", event_id, name)
        .await
        .unwrap_or_else(|| panic!("{event_id} has no {name} state"))
}

/// Wait (bounded) until the state of `name` for `shop`'s `event_id` has `status`.
async fn until_status(app: &TestApp, event_id: &str, name: &str, status: &str) -> Value {
    until_status_in(app, "shop", event_id, name, status).await
}

async fn until_status_in(
    app: &TestApp,
    source: &str,
    event_id: &str,
    name: &str,
    status: &str,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = find_state(app, source, event_id, name).await;
        if let Some(state) = state.as_ref().filter(|s| s["status"] == status) {
            return state.clone();
        }
        assert!(Instant::now() < deadline, "never {status}: {state:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` orders of 10 points for 4 customers, each delivered twice (a redelivery), and for
/// every fifth one the same order again under another event id (a business duplicate).
pub(crate) async fn deliver_orders(app: &TestApp, prefix: &str, n: usize) -> (usize, i64) {
    let mut events = 0;
    for i in 0..n {
        let body = order_body(&format!("{prefix}-o{i}"), &format!("c{}", i % 4), 10);
        let id = format!("{prefix}-e{i}");
        assert_eq!(
            app.deliver("shop", &id, &body).await.body["status"],
            "queued"
        );
        assert_eq!(
            app.deliver("shop", &id, &body).await.body["status"],
            "duplicate"
        );
        events += 1;
        if i % 5 == 0 {
            let again = format!("{prefix}-again{i}");
            assert_eq!(
                app.deliver("shop", &again, &body).await.body["status"],
                "queued"
            );
            events += 1;
        }
    }
    (events, n as i64 * 10)
}

/// Balances the receiver holds, summed.
fn total(stats: &Value) -> i64 {
    stats["balances"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum()
}

/// Every matching event reaches the endpoint, verifies there, and credits once; the body and
/// the `webhook-inbox-*` headers arrive as stored.
#[tokio::test]
async fn every_event_reaches_the_endpoint_and_verifies() {
    let Some((_dir, endpoint, app)) = endpoint_and_app("concurrency = 8").await else {
        return;
    };
    let (events, points) = deliver_orders(&app, "a", 20).await;
    // An event of another source is not billing's.
    let body = order_body("other", "c0", 1000);
    assert_eq!(
        app.deliver("strict", "s-1", &body).await.body["status"],
        "queued"
    );
    let view = until_delivered(&app, events as i64, Duration::from_secs(30)).await;
    assert_eq!(view["state"], "active");
    let stats = endpoint.stats().await;
    assert_eq!(stats["rejected_signature"], 0, "{stats}");
    assert_eq!(stats["verified"], events as i64, "{stats}");
    assert_eq!(stats["applied"], events as i64, "{stats}");
    assert_eq!(stats["business_duplicates"], 4, "{stats}");
    assert_eq!(total(&stats), points, "{stats}");
    // The in-process subscription credited the same orders, and the other source's, once it
    // is done (it runs beside the forwarder: its own pace).
    until_status_in(&app, "strict", "s-1", "points", "completed").await;
    for i in 0..20 {
        until_status(&app, &format!("a-e{i}"), "points", "completed").await;
    }
    assert_eq!(
        app.balance("c0").await,
        stats["balances"]["c0"].as_i64().unwrap() + 1000
    );
    let billing = state_of(&app, "a-e3", "billing").await;
    assert_eq!(billing["status"], "completed", "{billing}");
    assert_eq!(billing["outcome"], "delivered", "{billing}");
    app.stop().await;
}

/// Under each way an endpoint fails, every event still ends delivered, and the receiver's
/// dedup keeps its balances exact although it saw the same event more than once.
#[tokio::test]
async fn a_misbehaving_endpoint_still_gets_every_event_once_in_effect() {
    let Some((_dir, endpoint, app)) = endpoint_and_app("max_attempts = 30\nconcurrency = 8").await
    else {
        return;
    };
    let mut events = 0;
    let mut points = 0;
    for mode in ["500", "hang", "reset", "429", "late"] {
        endpoint.set_mode(mode, Some(3), Some("0")).await;
        let (e, p) = deliver_orders(&app, mode, 6).await;
        events += e;
        points += p;
        until_delivered(&app, events as i64, Duration::from_secs(60)).await;
        let stats = endpoint.stats().await;
        assert_eq!(total(&stats), points, "after {mode}: {stats}");
    }
    let stats = endpoint.stats().await;
    // Three calls of each mode ("late" counts too: it answered nothing).
    assert_eq!(stats["misbehaved"], 15, "{stats}");
    // "late" applied three events and lost their answers: each came again, a duplicate.
    assert_eq!(stats["duplicates"], 3, "{stats}");
    assert_eq!(stats["rejected_signature"], 0, "{stats}");
    app.stop().await;
}

/// A 429 with `Retry-After: 2` holds the event's next attempt back for two seconds, whatever
/// the (much shorter) backoff says.
#[tokio::test]
async fn retry_after_holds_the_next_attempt_back() {
    let Some((_dir, endpoint, app)) = endpoint_and_app("concurrency = 8").await else {
        return;
    };
    endpoint.set_mode("429", Some(1), Some("2")).await;
    let body = order_body("r-1", "c1", 5);
    assert_eq!(
        app.deliver("shop", "r-1", &body).await.body["status"],
        "queued"
    );
    until_delivered(&app, 1, Duration::from_secs(30)).await;
    let event = app.event("shop", "r-1").await;
    let history: Vec<&Value> = event["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["subscription"] == "billing")
        .collect();
    assert_eq!(history.len(), 2, "{event}");
    let ms = |v: &Value| {
        time::OffsetDateTime::parse(
            v.as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
        .unix_timestamp_nanos()
            / 1_000_000
    };
    let waited = ms(&history[1]["started_at"]) - ms(&history[0]["finished_at"]);
    assert!(waited >= 1_900, "retried after {waited} ms: {event}");
    assert_eq!(endpoint.count("verified").await, 1);
    app.stop().await;
}

/// 410 Gone pauses the subscription: its events wait, nothing is lost, and a resume delivers
/// them.
#[tokio::test]
async fn gone_pauses_the_subscription_until_resumed() {
    let Some((_dir, endpoint, app)) = endpoint_and_app("concurrency = 1").await else {
        return;
    };
    endpoint.set_mode("410", None, None).await;
    let (events, points) = deliver_orders(&app, "g", 5).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = app.get("/subscriptions/billing").await.body;
        if view["state"] == "paused" {
            break;
        }
        assert!(Instant::now() < deadline, "not paused: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Paused at the first 410: one call, and nothing more while paused.
    assert_eq!(endpoint.count("calls").await, 1);
    endpoint.set_mode("ok", None, None).await;
    let r = app.admin_post("/subscriptions/billing/resume", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    until_delivered(&app, events as i64, Duration::from_secs(30)).await;
    assert_eq!(total(&endpoint.stats().await), points);
    app.stop().await;
}

/// A dead endpoint with a backlog gets a few failed calls, then one probe per interval, not a
/// call per waiting event; once it is back, a probe closes the breaker and the whole backlog
/// is delivered.
#[tokio::test]
async fn a_dead_endpoint_gets_probes_not_the_backlog() {
    let Some((_dir, endpoint, app)) = endpoint_and_app(
        "max_attempts = 100\nbackoff_base_ms = 200\nbackoff_max_ms = 800\nconcurrency = 8",
    )
    .await
    else {
        return;
    };
    endpoint.set_mode("500", None, None).await;
    let (events, points) = deliver_orders(&app, "d", 150).await;
    // The outage: 6 seconds with 180 events waiting.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = app.get("/subscriptions/billing").await.body;
        if view["state"] == "probing" {
            break;
        }
        assert!(Instant::now() < deadline, "breaker not open: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("webhook_inbox_subscription_probing{subscription=\"billing\"} 1"),
        "{metrics}"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let calls = endpoint.count("calls").await;
    eprintln!("{calls} calls during the outage for {events} waiting events");
    // At most a concurrency's worth of calls before the breaker opened, then one probe per
    // interval (200, 400, 800, 800, … ms: under 12 in 6 s).
    assert!(
        calls <= 8 + 5 + 12,
        "{calls} calls during the outage for {events} events"
    );
    endpoint.set_mode("ok", None, None).await;
    let view = until_delivered(&app, events as i64, Duration::from_secs(60)).await;
    assert_eq!(view["state"], "active", "{view}");
    let stats = endpoint.stats().await;
    assert_eq!(total(&stats), points, "{stats}");
    app.stop().await;
}

/// An `https://` endpoint with a certificate of an internal CA: verified with `ca_file`, and
/// refused without it (the error names the certificate, never the URL's password). The
/// endpoint is a second webhook-inbox, whose `shop` source verifies the forwarded calls as
/// any Standard Webhooks receiver does and deduplicates them on `webhook-id`.
#[tokio::test]
async fn an_https_endpoint_is_verified_against_its_ca_file() {
    let pki = crate::https::Pki::new();
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, _) = pki.issue(certs.path(), "endpoint");
    let ca_file = certs.path().join("ca.pem");
    std::fs::write(&ca_file, pki.ca_pem()).unwrap();
    let tls = crate::https::tls_lines(&cert, &key);
    let endpoint = spawn_app_with(|c| c.insert_str(0, &tls), options()).await;
    let port = endpoint.address.rsplit(':').next().unwrap().to_string();
    let url = format!("https://user:hunter2@localhost:{port}/webhooks/shop");
    let subs = format!(
        "ca_file = \"{}\"\n\n[[subscriptions]]\nname = \"untrusted\"\nkind = \"http\"\n\
         sources = [\"shop\"]\nurl = \"{url}\"\nsigning_secret = \"{SW_SECRET}\"\n\
         max_attempts = 1\n",
        ca_file.display()
    );
    let app = spawn_app_with(config(&url, &subs), options()).await;
    let (events, _) = deliver_orders(&app, "t", 5).await;
    until_delivered(&app, events as i64, Duration::from_secs(30)).await;
    // The endpoint stored each forwarded event once, under its `webhook-id`.
    assert_eq!(
        endpoint.count("SELECT count(*) FROM event_log WHERE source = 'shop'"),
        events as i64
    );
    let untrusted = until_status(&app, "t-e1", "untrusted", "failed").await;
    let error = untrusted["last_error"].as_str().unwrap();
    assert!(error.contains("certificate"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
    app.stop().await;
    endpoint.stop().await;
}

/// With no `signing_secret`, one is generated into the data directory at the first start and
/// kept: the receiver configured with that file's secret verifies calls before and after a
/// restart.
#[tokio::test]
async fn a_generated_signing_secret_is_kept_across_restarts() {
    if !receiver_available() {
        return;
    }
    let receiver_dir = tempfile::tempdir().unwrap();
    let port = crate::process::free_port();
    let url = format!("http://127.0.0.1:{port}/hooks");
    let app = spawn_app_with(
        move |c| {
            config(&url, "")(c);
            *c = c.replace(&format!("signing_secret = \"{SW_SECRET}\"\n"), "");
        },
        options(),
    )
    .await;
    let file = app.dir.path().join("subscription-billing-secret");
    let secret = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert!(
        secret.starts_with("whsec_") && secret.len() > 40,
        "{secret}"
    );
    let endpoint = Endpoint::start_on(receiver_dir.path(), &secret, port);
    let (first, _) = deliver_orders(&app, "k1", 3).await;
    until_delivered(&app, first as i64, Duration::from_secs(30)).await;
    let config = {
        let mut c = test_config(&app.dir);
        config(&endpoint.hook_url(), "")(&mut c);
        c.replace(&format!("signing_secret = \"{SW_SECRET}\"\n"), "")
    };
    let dir = app.stop().await;
    let app = spawn_in(dir, &config, options()).await;
    assert_eq!(
        std::fs::read_to_string(&file).unwrap().trim(),
        secret,
        "the secret changed at restart"
    );
    let (second, _) = deliver_orders(&app, "k2", 3).await;
    until_delivered(&app, (first + second) as i64, Duration::from_secs(30)).await;
    let stats = endpoint.stats().await;
    assert_eq!(stats["verified"], (first + second) as i64, "{stats}");
    assert_eq!(stats["rejected_signature"], 0, "{stats}");
    app.stop().await;
}

/// At most once: a call whose outcome is unknown (no answer within the timeout) is abandoned
/// for ops rather than repeated; one the endpoint refused (a 429) is sent again.
#[tokio::test]
async fn at_most_once_abandons_an_unknown_outcome() {
    let Some((_dir, endpoint, app)) =
        endpoint_and_app("mode = \"at-most-once\"\nconcurrency = 1").await
    else {
        return;
    };
    endpoint.set_mode("429", Some(1), Some("0")).await;
    let body = order_body("m-1", "c1", 5);
    app.deliver("shop", "m-1", &body).await;
    until_delivered(&app, 1, Duration::from_secs(30)).await;
    endpoint.set_mode("hang", Some(1), None).await;
    let body = order_body("m-2", "c1", 5);
    app.deliver("shop", "m-2", &body).await;
    let billing = until_status(&app, "m-2", "billing", "failed").await;
    assert_eq!(billing["abandoned"], true, "{billing}");
    assert_eq!(billing["attempts"], 1, "{billing}");
    // m-1: a 429 then a delivery; m-2: the one call that hung.
    assert_eq!(endpoint.count("calls").await, 3);
    app.stop().await;
}
