//! Pull clients of two nodes (the real binary) on one PostgreSQL database: a long poll on one
//! node is woken by a commit on the other (LISTEN/NOTIFY), and clients racing on both nodes
//! never hold one event at once.

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::nodes::{node_config, signing_settings};
use crate::pgdb::{self, PgDatabase};
use crate::process::{ServerProcess, free_port, send_signed};
use crate::pull::PULL_TOKEN;

fn claim(client: &reqwest::blocking::Client, base: &str, body: Value) -> Vec<Value> {
    let answer: Value = client
        .post(format!("{base}/subscriptions/orders/claim"))
        .bearer_auth(PULL_TOKEN)
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    answer["claims"].as_array().unwrap().clone()
}

#[test]
fn pull_clients_of_two_nodes_share_one_queue() {
    if !pgdb::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = PgDatabase::create();
    let extra = format!(
        "[[subscriptions]]\nname = \"orders\"\nkind = \"pull\"\ntoken = \"{PULL_TOKEN}\"\n"
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

    // Long polls on node 0, each event committed through node 1: woken by the commit, not by
    // the poll's own timer (a look every second from the start of the wait: the commit comes
    // just after one, so the timer alone answers about 850 ms later; seen failing so with
    // `on_queued` a no-op).
    for i in 0..3 {
        let poll = {
            let (client, base) = (client.clone(), nodes[0].base.clone());
            std::thread::spawn(move || {
                let claims = claim(&client, &base, json!({"wait_ms": 20000}));
                (claims, Instant::now())
            })
        };
        std::thread::sleep(Duration::from_millis(1_150));
        let body = order_body(&format!("o-w{i}"), "c1", 1);
        let id = format!("w{i}");
        assert_eq!(
            send_signed(&client, &nodes[1].base, &settings, &id, &body),
            200
        );
        let committed = Instant::now();
        let (claims, answered) = poll.join().unwrap();
        assert_eq!(claims.len(), 1, "{claims:?}");
        assert_eq!(claims[0]["event_id"], id.as_str());
        let latency = answered.saturating_duration_since(committed);
        assert!(
            latency < Duration::from_millis(400),
            "woken after {latency:?}"
        );
    }

    // Clients on both nodes racing through a barrier: no event is held twice.
    let events = 200;
    for i in 0..events {
        let body = order_body(&format!("o{i}"), "c1", 1);
        let status = send_signed(
            &client,
            &nodes[i % 2].base,
            &settings,
            &format!("r{i}"),
            &body,
        );
        assert_eq!(status, 200);
    }
    let barrier = Arc::new(Barrier::new(6));
    let handles: Vec<_> = (0..6)
        .map(|t| {
            let (client, barrier) = (client.clone(), Arc::clone(&barrier));
            let base = nodes[t % 2].base.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for _ in 0..40 {
                    barrier.wait();
                    let claims = claim(&client, &base, json!({"max": 4}));
                    mine.extend(
                        claims
                            .iter()
                            .map(|c| c["event_id"].as_str().unwrap().to_string()),
                    );
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "an event was claimed twice");
    assert_eq!(all.len(), events, "the clients claimed every event");
}
