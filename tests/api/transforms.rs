//! Transformations at delivery (SPEC section 13) with real parts: a node forwarding to real
//! local endpoints, a program run in the node's worker processes, the delivered bytes signed
//! and checked here with the subscription's secret; no output completes `filtered`; an error
//! fails permanently until ops fix the program and retry; looping programs stop on their
//! budget and leave no process running.

use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::receiver::{Call, Receiver};

/// `billing` (transformed) and `archive` (as stored) forward `shop`'s events, each to its
/// own endpoint; workers on.
fn config(billing: &str, archive: &str, program: &str) -> impl FnOnce(&mut String) {
    let (billing, archive, program) = (
        billing.to_string(),
        archive.to_string(),
        program.to_string(),
    );
    move |c: &mut String| {
        *c = c.replace("workers = 0", "workers = 1");
        c.push_str(&format!(
            r#"
[[subscriptions]]
name = "billing"
kind = "http"
sources = ["shop"]
url = "{billing}"
signing_secret = "{SW_SECRET}"
timeout_ms = 3000
transform = '''{program}'''

[[subscriptions]]
name = "archive"
kind = "http"
sources = ["shop"]
url = "{archive}"
signing_secret = "{SW_SECRET}"
timeout_ms = 3000
"#
        ))
    }
}

fn options() -> BuildOptions {
    BuildOptions {
        idle_poll: Some(Duration::from_millis(50)),
        ..BuildOptions::default()
    }
}

/// `name`'s state of `shop`'s `event_id` once it is `status` (bounded wait).
pub(crate) async fn until_state(app: &TestApp, event_id: &str, name: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let event = app.event("shop", event_id).await;
        let state = event["subscriptions"]
            .as_array()
            .and_then(|l| l.iter().find(|s| s["name"] == name).cloned());
        if let Some(state) = state.filter(|s| s["status"] == status) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "{event_id} never {status} for {name}: {event}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Standard Webhooks check of one call, made here from the secret: HMAC-SHA256 over
/// `{id}.{timestamp}.{body}` with the secret's base64 key.
fn signed_over_its_bytes(call: &Call) -> bool {
    let (Some(id), Some(ts), Some(signatures)) = (
        call.header("webhook-id"),
        call.header("webhook-timestamp"),
        call.header("webhook-signature"),
    ) else {
        return false;
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let key = engine
        .decode(SW_SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&call.body);
    let expected = format!("v1,{}", engine.encode(mac.finalize().into_bytes()));
    signatures.split(' ').any(|s| s == expected)
}

fn body_of(call: &Call) -> Value {
    serde_json::from_slice(&call.body).unwrap()
}

fn calls_for(receiver: &Receiver, event_id: &str) -> Vec<Call> {
    receiver
        .calls()
        .into_iter()
        .filter(|c| c.header("webhook-inbox-event-id") == Some(event_id))
        .collect()
}

const SHAPE: &str = r#"if .skip then empty else {id, amount: (.data.amount / 100), currency: (.data.currency // "usd"), customer: .data.customer.id, label: "\(.id): \(.data.amount)"} end"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_is_delivered_signed_none_is_filtered_an_error_fails_until_fixed() {
    let (billing, archive) = (
        Receiver::start(Duration::ZERO, 200),
        Receiver::start(Duration::ZERO, 200),
    );
    let app = spawn_app_with(config(&billing.url, &archive.url, SHAPE), options()).await;
    let shaped = r#"{"id":"e1","data":{"amount":1250,"customer":{"id":"c9"}}}"#;
    let skipped = r#"{"id":"e2","skip":true,"data":{}}"#;
    let failing = r#"{"id":"e3","data":{"amount":"12.50"}}"#;
    for (id, body) in [("e1", shaped), ("e2", skipped), ("e3", failing)] {
        assert_eq!(app.deliver("shop", id, body).await.status, 200);
    }

    // One output: delivered as JSON, signed over the bytes sent, `webhook-id` the event's.
    until_state(&app, "e1", "billing", "completed").await;
    let [call] = calls_for(&billing, "e1").try_into().unwrap();
    assert_eq!(
        body_of(&call),
        json!({"id":"e1","amount":12.5,"currency":"usd","customer":"c9","label":"e1: 1250"})
    );
    assert!(signed_over_its_bytes(&call), "{call:?}");
    assert_eq!(call.header("content-type"), Some("application/json"));
    let [plain] = calls_for(&archive, "e1").try_into().unwrap();
    assert_eq!(call.header("webhook-id"), plain.header("webhook-id"));
    assert_eq!(
        plain.body,
        shaped.as_bytes(),
        "the other subscription gets the body as stored"
    );
    let e1 = app.event("shop", "e1").await;
    assert_eq!(
        e1["payload"],
        serde_json::from_str::<Value>(shaped).unwrap()
    );

    // No output: completed `filtered`, nothing sent.
    let e2 = until_state(&app, "e2", "billing", "completed").await;
    assert_eq!(e2["outcome"], "filtered", "{e2}");
    assert!(calls_for(&billing, "e2").is_empty());

    // An error: failed at once (the budget of 3 left unused), the program's message kept, the
    // endpoint never called, the other subscription unaffected.
    let e3 = until_state(&app, "e3", "billing", "failed").await;
    assert_eq!(e3["attempts"], 1, "{e3}");
    let error = e3["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("transform: the program failed: "),
        "{error}"
    );
    assert!(
        error.contains("12.50"),
        "jaq's message names the value: {error}"
    );
    assert!(calls_for(&billing, "e3").is_empty());
    for id in ["e1", "e2", "e3"] {
        until_state(&app, id, "archive", "completed").await;
    }
    let history = app.event("shop", "e3").await["history"].to_string();
    assert!(
        history.contains("transform: the program failed"),
        "{history}"
    );
    let metrics = app.metrics_text().await;
    for line in [
        "webhook_inbox_transform_failures_total{subscription=\"billing\"} 1",
        "webhook_inbox_transform_filtered_total{subscription=\"billing\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }

    // Ops fix the program and retry: delivered.
    let fixed = r#"{id, amount: (.data.amount | tonumber)}"#;
    let patched =
        crate::registry_routes::patch(&app, "billing", &json!({"transform": fixed}).to_string())
            .await;
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(patched.body["transform"], fixed);
    let retried = app
        .admin_post("/events/shop/e3/retry?subscription=billing", None)
        .await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    until_state(&app, "e3", "billing", "completed").await;
    let [call] = calls_for(&billing, "e3").try_into().unwrap();
    assert_eq!(body_of(&call), json!({"id": "e3", "amount": 12.5}));
    assert!(signed_over_its_bytes(&call));
    app.stop().await;
}

/// The worker processes of this test's node: children of this process (nextest runs each
/// test in a process of its own) started as `transform-worker`, with their CPU time in ticks.
fn workers() -> Vec<(u32, u64)> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // State is the first field after the name, ppid the second; utime and stime the 12th
        // and 13th (proc(5)).
        let worker = String::from_utf8_lossy(&cmdline).contains("transform-worker");
        if worker && fields[1] == me.to_string() && fields[0] != "Z" {
            let cpu = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
            found.push((pid, cpu));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looping_programs_fail_on_their_budget_and_nothing_is_left_running() {
    let (billing, archive) = (
        Receiver::start(Duration::ZERO, 200),
        Receiver::start(Duration::ZERO, 200),
    );
    let program = r#"if .loop == "recurse" then (def f: f; f)
        elif .loop == "range" then last(range(1e18))
        elif .loop == "until" then until(false; .)
        elif .loop == "repeat" then [repeat(.)]
        elif .loop == "deep" then (def f: [f]; f)
        else {id} end"#;
    let app = spawn_app_with(config(&billing.url, &archive.url, program), options()).await;
    let loops = ["recurse", "range", "until", "repeat", "deep"];
    for (i, kind) in loops.iter().enumerate() {
        let body = json!({"id": format!("loop-{i}"), "loop": kind}).to_string();
        assert_eq!(
            app.deliver("shop", &format!("loop-{i}"), &body)
                .await
                .status,
            200
        );
        let fine = json!({"id": format!("ok-{i}")}).to_string();
        assert_eq!(
            app.deliver("shop", &format!("ok-{i}"), &fine).await.status,
            200
        );
    }
    for (i, kind) in loops.iter().enumerate() {
        let failed = until_state(&app, &format!("loop-{i}"), "billing", "failed").await;
        let error = failed["last_error"].as_str().unwrap();
        assert!(
            error.contains("ran past its time budget"),
            "{kind}: {error}"
        );
        assert_eq!(failed["attempts"], 1);
        until_state(&app, &format!("ok-{i}"), "billing", "completed").await;
        until_state(&app, &format!("loop-{i}"), "archive", "completed").await;
    }
    assert_eq!(
        billing.calls().len(),
        loops.len(),
        "only the events that did not loop"
    );
    // The node still transforms; every worker that overran was killed and reaped: what is
    // left idles (its CPU time does not move).
    assert_eq!(
        app.deliver("shop", "last", r#"{"id":"last"}"#).await.status,
        200
    );
    until_state(&app, "last", "billing", "completed").await;
    let before = workers();
    assert!(
        !before.is_empty() && before.len() <= 4,
        "the pool's warm workers: {before:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = workers();
    for (pid, cpu) in &after {
        let earlier = before.iter().find(|(p, _)| p == pid).map_or(0, |(_, c)| *c);
        assert!(
            cpu - earlier <= 1,
            "worker {pid} is spinning: {before:?} then {after:?}"
        );
    }
    app.stop().await;
    // The node's end lets its workers go.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !workers().is_empty() {
        assert!(
            Instant::now() < deadline,
            "workers left after the node stopped: {:?}",
            workers()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A worker takes the runs waiting for it as one batch; when a program loops inside a batch,
/// the batch's worker is killed and its unanswered runs are run again one at a time: the
/// looping events fail alone and the batch's others are delivered, once each. The events are
/// released together (the subscription paused while they are stored, then resumed), so that
/// their runs wait for the workers side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_program_in_a_batch_fails_alone_and_the_others_are_delivered() {
    let (billing, archive) = (
        Receiver::start(Duration::ZERO, 200),
        Receiver::start(Duration::ZERO, 200),
    );
    let program = r#"if .loop then last(range(1e18)) else {id} end"#;
    let app = spawn_app_with(
        |c: &mut String| {
            config(&billing.url, &archive.url, program)(c);
            *c = c.replace("transform = '''", "concurrency = 64\ntransform = '''");
        },
        options(),
    )
    .await;
    let paused = app.admin_post("/subscriptions/billing/pause", None).await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    let looping = [7, 23];
    for i in 0..40 {
        let body = json!({"id": format!("b-{i}"), "loop": looping.contains(&i)}).to_string();
        assert_eq!(
            app.deliver("shop", &format!("b-{i}"), &body).await.status,
            200
        );
    }
    let resumed = app.admin_post("/subscriptions/billing/resume", None).await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    for i in 0..40 {
        let id = format!("b-{i}");
        if looping.contains(&i) {
            let failed = until_state(&app, &id, "billing", "failed").await;
            let error = failed["last_error"].as_str().unwrap();
            assert!(error.contains("ran past its time budget"), "{id}: {error}");
            assert_eq!(failed["attempts"], 1);
        } else {
            let done = until_state(&app, &id, "billing", "completed").await;
            assert_eq!(done["outcome"], "delivered", "{id}: {done}");
            let [call] = calls_for(&billing, &id).try_into().unwrap();
            assert_eq!(body_of(&call), json!({"id": id}));
        }
    }
    assert_eq!(
        billing.calls().len(),
        38,
        "only the events that did not loop, once each"
    );
    app.stop().await;
}

/// A worker that takes longer to start than a run's whole budget (a busy machine loading the
/// binary): its first run is not charged for it, and is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_slow_to_start_does_not_fail_its_first_run() {
    let (billing, archive) = (
        Receiver::start(Duration::ZERO, 200),
        Receiver::start(Duration::ZERO, 200),
    );
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow-worker");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\nsleep {}\nexec '{}' \"$@\"\n",
            webhook_inbox::transform::WALL_LIMIT.as_secs_f64() * 1.5,
            env!("CARGO_BIN_EXE_webhook-inbox")
        ),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&slow).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&slow, permissions).unwrap();
    let options = BuildOptions {
        transform_worker: Some(slow),
        ..options()
    };
    let app = spawn_app_with(config(&billing.url, &archive.url, "{id}"), options).await;
    assert_eq!(
        app.deliver("shop", "first", r#"{"id":"first"}"#)
            .await
            .status,
        200
    );
    let state = until_state(&app, "first", "billing", "completed").await;
    assert_eq!(state["attempts"], 1, "{state}");
    let [call] = calls_for(&billing, "first").try_into().unwrap();
    assert_eq!(body_of(&call), json!({"id": "first"}));
}
