//! The call-out lane against a real HTTP downstream on 127.0.0.1 (SPEC section 4, "Leases
//! cover calls"): leases that cover every call, outcome-unknown calls abandoned, a slow
//! downstream that holds back no credit, and the sweeper with `workers = 0`.

use std::time::Duration;

use serde_json::json;

use crate::helpers::*;
use crate::process::{ServerProcess, free_port, write_config};
use crate::receiver::{Receiver, until};
use crate::requests::create;

/// The test config with the given consumer settings and a downstream section.
fn config_with(consumers: &[(&str, &str)], downstream: &str) -> impl FnOnce(&mut String) {
    let consumers: Vec<(String, String)> = consumers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let downstream = downstream.to_string();
    move |c: &mut String| {
        for (key, value) in consumers {
            let start = c.find(&format!("\n{key} = ")).expect("a [consumers] key") + 1;
            let end = start + c[start..].find('\n').unwrap();
            c.replace_range(start..end, &format!("{key} = {value}"));
        }
        c.push_str(&format!("\n[downstream]\n{downstream}\n"));
    }
}

/// One in-process worker (and the default call-out workers), calls bounded by 500 ms.
async fn one_worker_app(url: &str) -> TestApp {
    spawn_app_with(
        config_with(
            &[("workers", "1")],
            &format!("url = \"{url}\"\ntimeout_ms = 500"),
        ),
        Default::default(),
    )
    .await
}

async fn submit(app: &TestApp) -> String {
    let id = create(app).await;
    let r = app
        .post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    id
}

/// Wait until the submission events of `ids` are all terminal; returns them.
async fn terminal(app: &TestApp, ids: &[String], within: Duration) -> Vec<serde_json::Value> {
    until("submissions end", within, async || {
        let mut done = true;
        for id in ids {
            let status = app.event("requests", id).await["status"].clone();
            done &= status == "completed" || status == "failed";
        }
        done
    })
    .await;
    let mut events = Vec::new();
    for id in ids {
        events.push(app.event("requests", id).await);
    }
    events
}

/// Six submissions, one worker, a 1 s lease and calls of 300 ms: claimed together, the later
/// calls would start after the lease ran out (and the sweeper would abandon events that were
/// never called). Claimed one at a time, each call is covered by its own lease.
#[tokio::test]
async fn every_call_starts_inside_a_lease_that_covers_its_whole_timeout() {
    let receiver = Receiver::start(Duration::from_millis(300), 200);
    let app = spawn_app_with(
        config_with(
            &[("workers", "1"), ("lease_seconds", "1")],
            &format!("url = \"{}\"\ntimeout_ms = 450", receiver.url),
        ),
        Default::default(),
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(submit(&app).await);
    }
    let events = terminal(&app, &ids, Duration::from_secs(20)).await;
    for e in &events {
        assert_eq!(e["status"], "completed", "{e}");
        assert_eq!(e["outcome"], "delivered", "{e}");
        // On a loaded machine a claim can reach its handler late; the handler then gives the
        // event back uncalled, which is the rule this test holds. Any other earlier attempt
        // means a call was started and cut short.
        let history = e["history"].as_array().unwrap();
        for earlier in &history[..history.len() - 1] {
            let error = earlier["error"].as_str().unwrap_or_default();
            assert!(error.starts_with("not called: the lease had"), "{e}");
        }
    }
    let mut keys = receiver.keys();
    keys.sort();
    let mut expected: Vec<String> = ids.iter().map(|id| format!("requests:{id}")).collect();
    expected.sort();
    assert_eq!(keys, expected, "each request called exactly once");
}

/// A downstream that acts and then answers too late, or answers 5xx: the outcome is unknown,
/// so the at-most-once event is abandoned. A plain retry is refused, a bulk retry skips it,
/// only a forced retry calls again. Neither the URL nor its port reaches `last_error`.
#[tokio::test]
async fn an_outcome_unknown_call_is_abandoned_and_only_a_forced_retry_repeats_it() {
    for (case, delay, status) in [("timeout", 1500, 200), ("5xx", 0, 503)] {
        let receiver = Receiver::start(Duration::from_millis(delay), status);
        let app = one_worker_app(&receiver.url).await;
        let id = submit(&app).await;
        let event = terminal(&app, std::slice::from_ref(&id), Duration::from_secs(10)).await;
        let event = &event[0];
        assert_eq!(event["status"], "failed", "{case}: {event}");
        assert_eq!(event["abandoned"], true, "{case}: {event}");
        let error = event["last_error"].as_str().unwrap();
        assert!(error.contains("abandoned"), "{case}: {error}");
        let port = receiver
            .url
            .split(':')
            .nth(2)
            .unwrap()
            .trim_end_matches("/in");
        assert!(
            !error.contains("127.0.0.1") && !error.contains(port),
            "{case}: the URL is redacted: {error}"
        );
        assert_eq!(receiver.keys().len(), 1, "{case}");

        let plain = app
            .admin_post(&format!("/events/requests/{id}/retry"), None)
            .await;
        plain.assert_error(409, "conflict");
        let bulk = app.admin_post("/events/retry", Some(json!({}))).await;
        assert_eq!(bulk.body, json!({"retried": 0}), "{case}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(receiver.keys().len(), 1, "{case}: not called again");

        let forced = app
            .admin_post(&format!("/events/requests/{id}/retry?force=true"), None)
            .await;
        assert_eq!(forced.status, 200, "{case}: {}", forced.body);
        until(
            "the forced retry calls",
            Duration::from_secs(10),
            async || receiver.keys().len() == 2,
        )
        .await;
        app.stop().await;
    }
}

/// Failures that prove nothing was sent are retried with backoff (a refused connection), and
/// a downstream's 4xx fails the event without abandoning it: a plain retry is allowed.
#[tokio::test]
async fn failures_that_prove_nothing_was_done_are_not_abandoned() {
    let closed = free_port();
    let app = one_worker_app(&format!("http://127.0.0.1:{closed}/in")).await;
    let id = submit(&app).await;
    let event = &terminal(&app, std::slice::from_ref(&id), Duration::from_secs(10)).await[0];
    assert_eq!(event["status"], "failed", "{event}");
    assert_eq!(event["abandoned"], false, "{event}");
    assert_eq!(event["attempts"], 3, "retried up to max_attempts: {event}");
    assert!(
        event["last_error"]
            .as_str()
            .unwrap()
            .contains("nothing was sent"),
        "{event}"
    );
    app.stop().await;

    let receiver = Receiver::start(Duration::ZERO, 422);
    let app = one_worker_app(&receiver.url).await;
    let id = submit(&app).await;
    let event = &terminal(&app, std::slice::from_ref(&id), Duration::from_secs(10)).await[0];
    assert_eq!(event["status"], "failed", "{event}");
    assert_eq!(event["abandoned"], false, "{event}");
    assert_eq!(event["attempts"], 1, "a refusal is not repeated: {event}");
    let plain = app
        .admin_post(&format!("/events/requests/{id}/retry"), None)
        .await;
    assert_eq!(plain.status, 200, "{}", plain.body);
}

/// One in-process worker, a downstream whose answers are held while the test looks: orders
/// delivered while its calls are in flight are credited before they return, and the lag gauge
/// sees the waiting submissions. (Held, not a fixed delay: on a busy machine the crediting
/// could outlast a delay, which said nothing about the call-out lane.)
#[tokio::test]
async fn a_slow_downstream_holds_back_no_credit() {
    let receiver = Receiver::start(Duration::from_millis(100), 200);
    receiver.hold();
    let app = spawn_app_with(
        config_with(
            &[("workers", "1")],
            &format!(
                "url = \"{}\"\ntimeout_ms = 14000\nconcurrency = 2",
                receiver.url
            ),
        ),
        Default::default(),
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(submit(&app).await);
    }
    until("a call is in flight", Duration::from_secs(10), async || {
        receiver.in_flight() > 0
    })
    .await;
    for i in 0..5 {
        let r = app
            .deliver(
                "shop",
                &format!("evt-{i}"),
                &order_body(&format!("o-{i}"), "c-1", 10),
            )
            .await;
        assert_eq!(r.status, 200);
    }
    until("orders credited", Duration::from_secs(20), async || {
        app.balance("c-1").await == 50
    })
    .await;
    assert_eq!(
        receiver.done(),
        0,
        "credited while the first calls were still in flight"
    );
    // Two submissions wait while two calls run: the lag gauge sees them.
    until(
        "the lag gauge at 1 s",
        Duration::from_secs(20),
        async || {
            let metrics = app.metrics_text().await;
            let lag: f64 = metrics
                .lines()
                .find_map(|l| l.strip_prefix("webhook_inbox_oldest_pending_seconds "))
                .expect("the lag gauge")
                .parse()
                .unwrap();
            lag >= 1.0
        },
    )
    .await;
    receiver.release();
    let events = terminal(&app, &ids, Duration::from_secs(15)).await;
    assert!(events.iter().all(|e| e["outcome"] == "delivered"));
    assert_eq!(
        receiver.most_in_flight(),
        2,
        "downstream.concurrency calls at once"
    );
}

/// `workers = 0`: a claim made by `POST /events/run` in a process that was killed mid-call is
/// swept by the restarted process after its lease: failed and abandoned, never left claimed.
#[test]
fn a_claim_left_by_a_killed_run_is_swept_with_workers_off() {
    let receiver = Receiver::start(Duration::from_secs(5), 200);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let downstream = format!(
        "[downstream]\nurl = \"{}\"\ntimeout_ms = 900\n",
        receiver.url
    );
    let (config, _) = write_config(
        dir.path(),
        port,
        &downstream,
        "workers = 0\nlease_seconds = 2\n",
    );
    let mut server = ServerProcess::start(dir.path(), &config, port, "first.log");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let post = |base: &str, path: &str| {
        client
            .post(format!("{base}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
    };
    let id = post(&server.base, "/requests")
        .json::<serde_json::Value>()
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        post(&server.base, &format!("/requests/{id}/submit"))
            .status()
            .is_success()
    );
    let run = {
        let url = format!("{}/events/run", server.base);
        std::thread::spawn(move || {
            let _ = reqwest::blocking::Client::new()
                .post(url)
                .bearer_auth(ADMIN_TOKEN)
                .send();
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while receiver.keys().is_empty() {
        assert!(std::time::Instant::now() < deadline, "{}", server.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
    server.kill();
    let _ = run.join();

    let server = ServerProcess::start(dir.path(), &config, port, "second.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let event = loop {
        let event: serde_json::Value = client
            .get(format!("{}/events/requests/{id}", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if event["status"] != "claimed" {
            break event;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still claimed: {event}\n{}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(event["status"], "failed", "{event}");
    assert_eq!(event["abandoned"], true, "{event}");
    assert_eq!(event["history"][0]["result"], "lease_expired", "{event}");
    assert_eq!(receiver.keys().len(), 1, "not called again");
}
