//! An at-most-once `http` subscription and a SIGKILL of the real binary while its calls hang:
//! the events whose calls were out are abandoned (they may have acted), and every other event
//! is delivered once after the restart. An event the forwarder had claimed but not called yet
//! must not be abandoned: nothing was sent, so nothing may have acted, and ops would have to
//! force a retry of an event that never left.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value;
use webhook_inbox::forward::call::webhook_id;

use crate::endpoint::{Endpoint, receiver_available};
use crate::helpers::*;
use crate::process::{ServerProcess, free_port, send_signed, write_config};

const EVENTS: usize = 40;
const CONCURRENCY: usize = 4;

fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The webhook-ids the receiver has been called with.
fn called(endpoint: &Endpoint) -> BTreeSet<String> {
    let stats = block_on(endpoint.stats());
    let calls = stats["by_webhook_id_calls"].as_object().unwrap();
    calls.keys().cloned().collect()
}

fn counts(client: &reqwest::blocking::Client, base: &str) -> Value {
    let view: Value = client
        .get(format!("{base}/subscriptions/billing"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap()
        .json()
        .unwrap();
    view["counts"].clone()
}

#[test]
fn sigkill_abandons_only_the_events_whose_calls_were_out() {
    if !receiver_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::start(dir.path(), SW_SECRET);
    block_on(endpoint.set_mode("hang", None, None));
    let port = free_port();
    let subscription = format!(
        "[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\nurl = \"{}\"\n\
         signing_secret = \"{SW_SECRET}\"\nmode = \"at-most-once\"\ntimeout_ms = 4000\n\
         concurrency = {CONCURRENCY}\n",
        endpoint.hook_url()
    );
    let (config, settings) = write_config(
        dir.path(),
        port,
        "[downstream]\ntimeout_ms = 2000",
        "lease_seconds = 10",
    );
    let text = std::fs::read_to_string(&config).unwrap() + &subscription;
    std::fs::write(&config, text).unwrap();

    let mut server = ServerProcess::start(dir.path(), &config, port, "first.log");
    let client = reqwest::blocking::Client::new();
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("evt-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let body = order_body(&format!("o-{i}"), "c-1", 1);
        assert_eq!(
            send_signed(&client, &server.base, &settings, id, &body),
            200
        );
    }
    // Every place holds a hanging call; give a claim ahead of them time to commit, then kill.
    let deadline = Instant::now() + Duration::from_secs(30);
    while called(&endpoint).len() < CONCURRENCY {
        assert!(Instant::now() < deadline, "no calls: {}", server.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let out = called(&endpoint);
    let claimed = counts(&client, &server.base)["claimed"].as_u64().unwrap();
    server.kill();
    assert_eq!(
        out.len(),
        CONCURRENCY,
        "a hanging call ended before the kill"
    );

    block_on(endpoint.set_mode("ok", None, None));
    let server = ServerProcess::start(dir.path(), &config, port, "second.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let c = loop {
        let c = counts(&client, &server.base);
        if c["pending"] == 0 && c["claimed"] == 0 {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: {c}\n{}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stats = block_on(endpoint.stats());
    for id in &ids {
        let wid = webhook_id("shop", id);
        let event: Value = client
            .get(format!("{}/events/shop/{id}", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let calls = stats["by_webhook_id_calls"][&wid].as_u64().unwrap_or(0);
        assert_eq!(calls, 1, "{id} reached the receiver {calls} times: {event}");
        let status = event["subscriptions"][0]["status"].clone();
        if out.contains(&wid) {
            assert_eq!(status, "failed", "{id}'s call was out at the kill: {event}");
        } else {
            assert_eq!(
                status, "completed",
                "{id} was never sent before the kill (claimed at the kill: {claimed}): {event}"
            );
        }
    }
    assert_eq!(c["failed"], CONCURRENCY as u64, "{c}");
    assert_eq!(c["completed"], (EVENTS - CONCURRENCY) as u64, "{c}");
}
