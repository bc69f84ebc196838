//! Alerts end to end on SQLite, with real local endpoints on 127.0.0.1 (`Receiver`): a
//! subscription's endpoint and the alert channel. An endpoint down longer than the condition's
//! duration gives one "started" and, once it answers again, one "cleared", also across a
//! restart; a flood of refused deliveries gives one notice; a channel down then up gets the
//! notice once, counted as retried; every notice's signature verifies (checked here with
//! `hmac` directly, not with the product's verifier); `GET /alerts` lists the open ones;
//! `alerts test` says what each channel did.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::Mac as _;
use serde_json::Value;
use webhook_inbox::startup::BuildOptions;

use crate::cli_config::bare_cli;
use crate::helpers::*;
use crate::receiver::{Call, Receiver};

/// The evaluation interval in these tests (the default is 15 s).
pub const EVERY_MS: u64 = 100;

/// What a server process of these tests needs in its environment to evaluate that often
/// (`alert_every_ms` is at least a second).
pub const FAST_ENV: &[(&str, &str)] = &[("WEBHOOK_INBOX_UNSAFE_ALERT_EVERY_MS", "100")];

/// Top-level keys first (before any table), the channel `ops` last.
fn with_alerts(channel_url: &str, conditions: &str) -> impl FnOnce(&mut String) {
    let (url, conditions) = (channel_url.to_string(), conditions.to_string());
    move |c: &mut String| {
        *c = format!(
            "public_url = \"https://inbox.example.com/\"\n{c}\n\
             [[alerts]]\nname = \"ops\"\nkind = \"webhook\"\nurl = \"{url}\"\n\
             secret = \"{SW_SECRET}\"\ntimeout_ms = 1000\n{conditions}\n"
        );
    }
}

fn options() -> BuildOptions {
    BuildOptions {
        idle_poll: Some(Duration::from_millis(50)),
        alert_every: Some(Duration::from_millis(EVERY_MS)),
        ..BuildOptions::default()
    }
}

/// The notices a channel received, as JSON, each after its signature was checked.
pub fn notices(channel: &Receiver) -> Vec<Value> {
    channel
        .calls()
        .iter()
        .map(|call| {
            assert_signed(call);
            serde_json::from_slice(&call.body).unwrap()
        })
        .collect()
}

/// Standard Webhooks, computed here: `v1,` base64 HMAC-SHA256 of `id.timestamp.body` under the
/// secret's key.
pub fn assert_signed(call: &Call) {
    let id = call.header("webhook-id").expect("webhook-id");
    let ts = call.header("webhook-timestamp").expect("webhook-timestamp");
    let signature = call.header("webhook-signature").expect("webhook-signature");
    let key = STANDARD
        .decode(SW_SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&call.body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    assert!(
        signature.split(' ').any(|s| s == expected),
        "signature {signature} does not verify"
    );
}

/// Wait (bounded, polling every 20 ms) until `f` holds.
pub async fn wait_for(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `webhook_inbox_alerts_total{result}` (0 when absent).
async fn alerts_total(app: &TestApp, result: &str) -> u64 {
    let text = app.metrics_text().await;
    let prefix = format!("webhook_inbox_alerts_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// `webhook_inbox_alert_evaluations_total` of a metrics text (0 when absent).
pub fn evaluations_in(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("webhook_inbox_alert_evaluations_total "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Wait (bounded) until the node has finished `rounds` more evaluations: what "nothing more
/// happens" is checked after, rather than a fixed sleep.
async fn after_rounds(app: &TestApp, rounds: u64) {
    let start = evaluations_in(&app.metrics_text().await);
    let deadline = Instant::now() + Duration::from_secs(20);
    while evaluations_in(&app.metrics_text().await) < start + rounds {
        assert!(Instant::now() < deadline, "fewer than {rounds} evaluations");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn port_of(url: &str) -> u16 {
    let rest = url.trim_start_matches("http://127.0.0.1:");
    rest[..rest.find('/').unwrap()].parse().unwrap()
}

/// Refused deliveries: a signature that does not match.
async fn flood(app: &TestApp, n: usize) {
    let now = webhook_inbox::domain::time::now_secs().to_string();
    for i in 0..n {
        let headers = vec![
            ("webhook-id".to_string(), format!("bad-{i}")),
            ("webhook-timestamp".to_string(), now.clone()),
            ("webhook-signature".to_string(), "v1,AAAA".to_string()),
        ];
        let r = app.post_webhook("shop", &headers, b"{}").await;
        assert_eq!(r.status, 401);
    }
}

const REJECTED: &str = "[[alerts.conditions]]\nkind = \"source_rejected\"\nthreshold = 5\n\
                        duration_seconds = 60\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_down_longer_than_the_duration_gives_one_started_and_after_recovery_one_cleared()
 {
    let channel = Receiver::start(Duration::ZERO, 200);
    let endpoint = Receiver::start(Duration::ZERO, 500);
    let port = port_of(&endpoint.url);
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(&dir)
        .replace("workers = 0", "workers = 1")
        .replace(
            "backoff_base_ms = 1\nbackoff_max_ms = 5",
            "backoff_base_ms = 50\nbackoff_max_ms = 200",
        );
    config.push_str(&format!(
        "\n[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\nsources = [\"shop\"]\n\
         url = \"{}\"\nsigning_secret = \"{SW_SECRET}\"\ntimeout_ms = 1000\n",
        endpoint.url
    ));
    with_alerts(
        &channel.url,
        "[[alerts.conditions]]\nkind = \"breaker_open\"\nduration_seconds = 1\n",
    )(&mut config);
    let app = spawn_in(dir, &config, options()).await;
    for i in 0..4 {
        let r = app.deliver("shop", &format!("down-{i}"), "{}").await;
        assert_eq!(r.status, 200);
    }
    wait_for(Duration::from_secs(20), "the started notice", || {
        !channel.calls().is_empty()
    })
    .await;
    let started = notices(&channel);
    assert_eq!(started.len(), 1, "{started:?}");
    let n = &started[0];
    assert_eq!(n["type"], "alert.started");
    assert_eq!(
        (n["condition"].as_str(), n["subject"].as_str()),
        (Some("breaker_open"), Some("billing"))
    );
    assert_eq!(n["link"], "https://inbox.example.com/ui/#subscriptions");
    let since = webhook_inbox::domain::time::parse_rfc3339(n["since"].as_str().unwrap()).unwrap();
    assert!(
        channel.calls()[0].read_at - since >= 1_000,
        "sent only once the breaker had been open for the condition's duration"
    );

    // A restart while the breaker stays open repeats nothing.
    let dir = app.stop().await;
    let app = spawn_in(dir, &config, options()).await;
    after_rounds(&app, 5).await;
    assert_eq!(channel.calls().len(), 1, "a restart repeated the notice");

    // The endpoint answers again: the next probe closes the breaker.
    drop(endpoint);
    let _endpoint = Receiver::start_on(port, Duration::ZERO, 200);
    let r = app.deliver("shop", "up-1", "{}").await;
    assert_eq!(r.status, 200);
    wait_for(Duration::from_secs(20), "the cleared notice", || {
        channel.calls().len() >= 2
    })
    .await;
    after_rounds(&app, 3).await;
    let all = notices(&channel);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[1]["type"], "alert.cleared");
    assert_eq!(all[1]["episode"], all[0]["episode"]);
    assert_eq!(all[1]["since"], all[0]["since"]);
    assert_ne!(
        channel.calls()[0].header("webhook-id"),
        channel.calls()[1].header("webhook-id")
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refused_deliveries_gives_one_notice() {
    let channel = Receiver::start(Duration::ZERO, 200);
    let app = spawn_app_with(with_alerts(&channel.url, REJECTED), options()).await;
    flood(&app, 30).await;
    wait_for(Duration::from_secs(10), "the notice", || {
        !channel.calls().is_empty()
    })
    .await;
    after_rounds(&app, 5).await;
    let all = notices(&channel);
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["condition"], "source_rejected");
    assert_eq!(all[0]["subject"], "shop");
    assert!(all[0]["figure"].as_str().unwrap().contains("refused"));
    assert_eq!(alerts_total(&app, "sent").await, 1);
    assert_eq!(alerts_total(&app, "failed").await, 0);
    // Ops see it open.
    let open = app.get("/alerts").await;
    assert_eq!(open.status, 200);
    let listed = open.body["alerts"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["alert"], "ops/source_rejected/shop");
    assert_eq!(listed[0]["episode"], all[0]["episode"]);
    assert_eq!(listed[0]["since"], all[0]["since"]);
    let anonymous = app.client.get(app.url("/alerts")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_down_then_up_gets_the_notice_once_counted_as_retried() {
    let port = crate::process::free_port();
    let url = format!("http://127.0.0.1:{port}/in");
    let app = spawn_app_with(with_alerts(&url, REJECTED), options()).await;
    flood(&app, 10).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while alerts_total(&app, "failed").await < 2 {
        assert!(Instant::now() < deadline, "no failed attempt counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let channel = Receiver::start_on(port, Duration::ZERO, 200);
    wait_for(Duration::from_secs(10), "the notice", || {
        !channel.calls().is_empty()
    })
    .await;
    after_rounds(&app, 5).await;
    assert_eq!(notices(&channel).len(), 1);
    assert_eq!(alerts_total(&app, "sent").await, 1);
    assert_eq!(alerts_total(&app, "retried").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM alert_notices WHERE sent_at IS NOT NULL AND attempts > 1"),
        1
    );
    app.stop().await;
}

#[tokio::test]
async fn alerts_test_sends_each_channel_a_notice_and_says_which_failed() {
    let channel = Receiver::start(Duration::ZERO, 200);
    let dir = tempfile::tempdir().unwrap();
    let ops = format!(
        "[[alerts]]\nname = \"ops\"\nkind = \"webhook\"\nurl = \"{}\"\nsecret = \"{SW_SECRET}\"\n",
        channel.url
    );
    std::fs::write(dir.path().join("ok.toml"), &ops).unwrap();
    let closed = crate::process::free_port();
    let both = format!(
        "{ops}[[alerts]]\nname = \"chat\"\nkind = \"slack\"\nurl = \"http://127.0.0.1:{closed}/x\"\n"
    );
    std::fs::write(dir.path().join("both.toml"), both).unwrap();

    let o = bare_cli(dir.path(), &["alerts", "test", "--config", "ok.toml"], &[]).await;
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "ops: sent (HTTP 200)"
    );
    let sent = notices(&channel);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["title"], "webhook-inbox test notice");

    let o = bare_cli(
        dir.path(),
        &["alerts", "test", "--config", "both.toml"],
        &[],
    )
    .await;
    assert_eq!(o.status.code(), Some(3));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("ops: sent (HTTP 200)"), "{out}");
    assert!(out.contains("chat: failed:"), "{out}");
    assert_eq!(notices(&channel).len(), 2);
}

/// A notice written but not sent when the node stops (its channel down) is not lost: once the
/// channel is up and the node back, it is sent, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_unsent_at_a_stop_is_sent_once_after_the_restart() {
    let port = crate::process::free_port();
    let url = format!("http://127.0.0.1:{port}/in");
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(&dir);
    with_alerts(&url, REJECTED)(&mut config);
    let app = spawn_in(dir, &config, options()).await;
    flood(&app, 10).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while alerts_total(&app, "failed").await < 1 {
        assert!(Instant::now() < deadline, "no failed attempt counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM alert_notices WHERE sent_at IS NULL"),
        1
    );
    let dir = app.stop().await;

    let channel = Receiver::start_on(port, Duration::ZERO, 200);
    let app = spawn_in(dir, &config, options()).await;
    wait_for(Duration::from_secs(20), "the notice", || {
        !channel.calls().is_empty()
    })
    .await;
    after_rounds(&app, 5).await;
    let sent = notices(&channel);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["condition"], "source_rejected");
    assert_eq!(
        app.count("SELECT count(*) FROM alert_notices WHERE sent_at IS NOT NULL"),
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM alert_notices"), 1);
    app.stop().await;
}

/// A stop does not wait for a channel that takes its time: the call in flight is dropped (its
/// notice is sent again once its claim's lease runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_does_not_wait_for_a_slow_channel() {
    let channel = Receiver::start(Duration::from_secs(30), 200);
    let slow = |c: &mut String| {
        with_alerts(&channel.url, REJECTED)(c);
        *c = c.replace("timeout_ms = 1000", "timeout_ms = 20000");
    };
    let app = spawn_app_with(slow, options()).await;
    flood(&app, 10).await;
    wait_for(Duration::from_secs(10), "a call in flight", || {
        channel.in_flight() >= 1
    })
    .await;
    let stopping = Instant::now();
    app.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "the stop waited {:?} for the channel",
        stopping.elapsed()
    );
}
