//! SIGKILL of the real binary while it forwards under load to the example receiver, twice,
//! then a restart and the provider's redelivery of everything: nothing acknowledged is lost,
//! every event reaches the receiver, each event reached it at most once more per kill (the
//! calls in flight), and the receiver's dedup keeps its balances exact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_secs;
use webhook_inbox::forward::call::webhook_id;
use webhook_inbox::signature::{Scheme, Secret};

use crate::endpoint::{Endpoint, receiver_available};
use crate::helpers::*;
use crate::process::{ServerProcess, free_port};

const ORDERS: usize = 500;
/// Deliveries that repeat an earlier order under a new event id (business duplicates).
const REPEATS: usize = 50;
const KILLS: usize = 2;

/// `(event id, customer, points, body)`; the repeats come last.
fn deliveries() -> Vec<(String, String, i64, String)> {
    (0..ORDERS + REPEATS)
        .map(|i| {
            let order = if i < ORDERS { i } else { (i * 7) % ORDERS };
            let customer = format!("c-{}", order % 10);
            let points = (order % 9 + 1) as i64;
            let body = order_body(&format!("o-{order}"), &customer, points);
            (format!("evt-{i}"), customer, points, body)
        })
        .collect()
}

fn config(dir: &std::path::Path, port: u16, url: &str) -> std::path::PathBuf {
    let path = dir.join("forward.toml");
    std::fs::write(
        &path,
        format!(
            r#"
listen = "127.0.0.1:{port}"
database_url = "sqlite://forward.db"
admin_token = "{ADMIN_TOKEN}"

[consumers]
workers = 2
lease_seconds = 8
backoff_base_ms = 10
backoff_max_ms = 200

[downstream]
timeout_ms = 2000

[[sources]]
name = "shop"
scheme = "standard-webhooks"
secrets = ["{SW_SECRET}"]

[[subscriptions]]
name = "billing"
kind = "http"
url = "{url}"
signing_secret = "{SW_SECRET}"
timeout_ms = 3500
concurrency = 16
max_attempts = 100
"#
        ),
    )
    .unwrap();
    path
}

/// Send each delivery once from two threads; returns the ids answered 200 (0 for a failed
/// connection, which a killed server gives).
fn send_all(base: &str, all: &Arc<Vec<(String, String, i64, String)>>) -> Vec<(String, u16)> {
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let all = Arc::clone(all);
            let url = format!("{base}/webhooks/shop");
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let secret = Secret::new(SW_SECRET);
                let mut answers = Vec::new();
                for (id, _, _, body) in all.iter().skip(t).step_by(2) {
                    let headers = Scheme::StandardWebhooks
                        .sign(&secret, id, "", body.as_bytes(), now_secs())
                        .unwrap();
                    let mut req = client.post(&url).body(body.clone());
                    for (k, v) in headers {
                        req = req.header(k, v);
                    }
                    let status = req.send().map(|r| r.status().as_u16()).unwrap_or(0);
                    answers.push((id.clone(), status));
                }
                answers
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

/// The receiver's stats, from a blocking thread's view.
fn stats(endpoint: &Endpoint) -> serde_json::Value {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(endpoint.stats())
}

#[test]
fn sigkill_mid_forward_loses_nothing_and_repeats_only_calls_in_flight() {
    if !receiver_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::start(dir.path(), SW_SECRET);
    let port = free_port();
    let config = config(dir.path(), port, &endpoint.hook_url());
    let all = Arc::new(deliveries());
    let mut acked_before_kills = Vec::new();
    for kill in 0..KILLS {
        let mut server = ServerProcess::start(dir.path(), &config, port, &format!("{kill}.log"));
        let sender = {
            let (base, all) = (server.base.clone(), Arc::clone(&all));
            std::thread::spawn(move || send_all(&base, &all))
        };
        // Kill while calls are in flight: once the receiver applied a share of the orders.
        let goal = (kill + 1) * ORDERS / (KILLS + 2);
        let deadline = Instant::now() + Duration::from_secs(60);
        while stats(&endpoint)["applied"].as_u64().unwrap() < goal as u64 {
            assert!(Instant::now() < deadline, "no progress: {}", server.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        server.kill();
        let answers = sender.join().unwrap();
        acked_before_kills.extend(
            answers
                .into_iter()
                .filter(|(_, s)| *s == 200)
                .map(|(id, _)| id),
        );
    }
    // The last start: the provider redelivers everything; what was acknowledged is there.
    let server = ServerProcess::start(dir.path(), &config, port, "last.log");
    let client = reqwest::blocking::Client::new();
    let secret = Secret::new(SW_SECRET);
    let acked: std::collections::HashSet<&String> = acked_before_kills.iter().collect();
    for (id, _, _, body) in all.iter() {
        let mut req = client
            .post(format!("{}/webhooks/shop", server.base))
            .body(body.clone());
        let headers = Scheme::StandardWebhooks
            .sign(&secret, id, "", body.as_bytes(), now_secs())
            .unwrap();
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let answer: serde_json::Value = req.send().unwrap().json().unwrap();
        if acked.contains(id) {
            assert_eq!(
                answer["status"], "duplicate",
                "{id} was acknowledged, then lost"
            );
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let view: serde_json::Value = client
            .get(format!("{}/subscriptions/billing", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let c = &view["counts"];
        let settled = c["pending"] == 0 && c["claimed"] == 0;
        if settled && c["completed"].as_i64().unwrap() + c["failed"].as_i64().unwrap() > 0 {
            assert_eq!(c["failed"], 0, "every event ends delivered: {view}");
            assert_eq!(c["completed"], (ORDERS + REPEATS) as i64, "{view}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered: {view}\n{}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let stats = stats(&endpoint);
    let calls = &stats["by_webhook_id_calls"];
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut repeated = 0;
    for (i, (id, customer, points, _)) in all.iter().enumerate() {
        let n = calls[webhook_id("shop", id)].as_u64().unwrap_or(0);
        assert!(n >= 1, "{id} never reached the receiver");
        assert!(
            n <= 1 + KILLS as u64,
            "{id} reached the receiver {n} times with {KILLS} kills"
        );
        repeated += n - 1;
        if i < ORDERS {
            *expected.entry(customer.clone()).or_default() += points;
        }
    }
    eprintln!(
        "acknowledged before the kills: {}; calls repeated after a kill: {repeated}",
        acked_before_kills.len()
    );
    let balances: BTreeMap<String, i64> =
        serde_json::from_value(stats["balances"].clone()).unwrap();
    assert_eq!(balances, expected, "{stats}");
    assert_eq!(stats["credited_orders"], ORDERS as i64);
    assert_eq!(stats["rejected_signature"], 0);
}
