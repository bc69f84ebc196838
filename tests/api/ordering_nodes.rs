//! One ordered `pull` subscription served by two nodes (the real binary) on one PostgreSQL
//! database, with clients of both claiming at once and retrying a third of what they claim:
//! each key's events are still claimed one at a time, in the order they were stored.

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::nodes::{node_config, signing_settings};
use crate::ordering::KeyOrder;
use crate::pgdb::{self, PgDatabase};
use crate::process::{ServerProcess, free_port, send_signed};
use crate::pull::PULL_TOKEN;

fn call(client: &reqwest::blocking::Client, base: &str, route: &str, body: Value) -> Value {
    client
        .post(format!("{base}/subscriptions/orders/{route}"))
        .bearer_auth(PULL_TOKEN)
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap()
}

#[test]
fn two_nodes_keep_each_keys_order() {
    if !pgdb::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = PgDatabase::create();
    let extra = format!(
        "[[subscriptions]]\nname = \"orders\"\nkind = \"pull\"\ntoken = \"{PULL_TOKEN}\"\n\
         ordered_by = \"/data/customer_id\"\nmax_attempts = 1000\nbackoff_base_ms = 1\n\
         backoff_max_ms = 2\n"
    );
    let nodes: Vec<ServerProcess> = (0..2)
        .map(|i| {
            let port = free_port();
            let config = node_config(dir.path(), &format!("node{i}"), port, &db.url, &extra);
            ServerProcess::start(dir.path(), &config, port, &format!("node{i}.log"))
        })
        .collect();
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let settings = signing_settings();
    // Sent one at a time, alternating nodes: each event's `seq` follows the sending order.
    let order = Arc::new(Mutex::new(KeyOrder::default()));
    let mut index: HashMap<String, (String, i64)> = HashMap::new();
    for i in 0..180i64 {
        let key = format!("k{}", i % 6);
        let id = format!("e{i}");
        let body = order_body(&format!("o{i}"), &key, 1);
        let status = send_signed(&client, &nodes[i as usize % 2].base, &settings, &id, &body);
        assert_eq!(status, 200);
        order.lock().unwrap().expect(&key, i);
        index.insert(id, (key, i));
    }
    let index = Arc::new(index);
    let barrier = Arc::new(Barrier::new(4));
    let deadline = Instant::now() + Duration::from_secs(90);
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (client, order, index) = (client.clone(), Arc::clone(&order), Arc::clone(&index));
            let barrier = Arc::clone(&barrier);
            let base = nodes[t % 2].base.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let mut n = 0usize;
                while Instant::now() < deadline && !order.lock().unwrap().all_done() {
                    let claims = call(&client, &base, "claim", json!({"max": 5, "wait_ms": 100}));
                    let claims = claims["claims"].as_array().unwrap().clone();
                    let mut results = Vec::new();
                    {
                        let mut o = order.lock().unwrap();
                        for c in &claims {
                            let (key, i) = &index[c["event_id"].as_str().unwrap()];
                            o.claimed(key, *i);
                            n += 1;
                            let done = !(n + t).is_multiple_of(3);
                            o.finishing(key, *i, done);
                            let outcome = if done { "done" } else { "retry" };
                            results.push(json!({"token": c["token"], "outcome": outcome}));
                        }
                    }
                    if !results.is_empty() {
                        let acked = call(&client, &base, "ack", json!({ "results": results }));
                        for r in acked["results"].as_array().unwrap() {
                            assert_eq!(r["applied"], true, "{acked}");
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let o = order.lock().unwrap();
    assert!(o.violations.is_empty(), "{:#?}", o.violations);
    assert!(o.all_done(), "not every event completed");
    assert!(o.claims > 180, "{} claims", o.claims);
}
