//! Crash safety with the real binary: SIGKILL under load, restart on the same database, the
//! provider's redelivery of everything, then every promise checked. Three subscriptions take
//! every event (a loyalty credit and two audits), so each promise holds per subscription.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_secs;
use webhook_inbox::signature::Scheme;
use webhook_inbox::signature::Secret;

use crate::helpers::*;
use crate::process::{ServerProcess, free_port};

const SENDERS: usize = 4;
const ORDERS: usize = 1800;
/// Extra deliveries that repeat an earlier order under a new event id (business duplicates).
const REPEATS: usize = 200;

struct Delivery {
    event_id: String,
    customer: String,
    order: String,
    points: i64,
    body: String,
}

fn deliveries() -> Vec<Delivery> {
    let total = ORDERS + REPEATS;
    // A fixed permutation (7919 is prime to the total) interleaves repeats with originals, so
    // that both race in the consumers.
    (0..total)
        .map(|k| (k * 7919) % total)
        .map(|i| {
            let order_index = if i < ORDERS { i } else { (i * 7) % ORDERS };
            let customer = format!("c-{}", order_index % 20);
            let order = format!("o-{order_index}");
            let points = (order_index % 9 + 1) as i64;
            let body = order_body(&order, &customer, points);
            Delivery {
                event_id: format!("evt-{i}"),
                customer,
                order,
                points,
                body,
            }
        })
        .collect()
}

fn config(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let path = dir.join("crash.toml");
    std::fs::write(
        &path,
        format!(
            r#"
listen = "127.0.0.1:{port}"
database_url = "sqlite://crash.db"
admin_token = "{ADMIN_TOKEN}"

[consumers]
workers = 4
batch_size = 16
lease_seconds = 2
backoff_base_ms = 10
backoff_max_ms = 100

[downstream]
timeout_ms = 500

[[sources]]
name = "shop"
scheme = "standard-webhooks"
secrets = ["{SW_SECRET}"]

[[subscriptions]]
name = "points"
kind = "loyalty-credit"
types = ["order.completed"]

[[subscriptions]]
name = "ledger"
kind = "audit"

[[subscriptions]]
name = "archive"
kind = "audit"
"#
        ),
    )
    .unwrap();
    path
}

/// Send every delivery from `SENDERS` threads; returns each event id's answer (status code, or
/// 0 when the connection failed).
fn send_all(
    base: &str,
    all: &Arc<Vec<Delivery>>,
    acked: &Arc<AtomicUsize>,
) -> HashMap<String, (u16, String)> {
    let results = Arc::new(Mutex::new(HashMap::new()));
    let threads: Vec<_> = (0..SENDERS)
        .map(|t| {
            let all = Arc::clone(all);
            let results = Arc::clone(&results);
            let acked = Arc::clone(acked);
            let url = format!("{base}/webhooks/shop");
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let secret = Secret::new(SW_SECRET);
                for d in all.iter().skip(t).step_by(SENDERS) {
                    let headers = Scheme::StandardWebhooks
                        .sign(&secret, &d.event_id, "", d.body.as_bytes(), now_secs())
                        .unwrap();
                    let mut req = client.post(&url).body(d.body.clone());
                    for (k, v) in headers {
                        req = req.header(k, v);
                    }
                    let answer = match req.send() {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let body: serde_json::Value = r.json().unwrap_or_default();
                            if status == 200 {
                                acked.fetch_add(1, Ordering::SeqCst);
                            }
                            (status, body["status"].as_str().unwrap_or("").to_string())
                        }
                        Err(_) => (0, String::new()),
                    };
                    results.lock().unwrap().insert(d.event_id.clone(), answer);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    Arc::try_unwrap(results).unwrap().into_inner().unwrap()
}

fn get_json(client: &reqwest::blocking::Client, url: &str) -> serde_json::Value {
    client
        .get(url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap()
        .json()
        .unwrap()
}

#[test]
fn sigkill_under_load_loses_no_acknowledged_delivery_and_credits_each_order_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = config(dir.path(), port);
    let all = Arc::new(deliveries());
    let acked = Arc::new(AtomicUsize::new(0));

    let mut server = ServerProcess::start(dir.path(), &config, port, "first.log");
    let base = server.base.clone();
    let first = {
        let (all, acked) = (Arc::clone(&all), Arc::clone(&acked));
        std::thread::spawn(move || send_all(&base, &all, &acked))
    };
    // Kill once a good part is acknowledged, while senders and consumers are busy.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::SeqCst) < (ORDERS + REPEATS) / 3 {
        assert!(
            Instant::now() < deadline,
            "load did not build up: {}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    server.kill();
    let first = first.join().unwrap();
    let acked_first: Vec<&String> = first
        .iter()
        .filter(|(_, (s, _))| *s == 200)
        .map(|(id, _)| id)
        .collect();
    assert!(
        acked_first.len() < ORDERS + REPEATS,
        "the kill came too late to test anything"
    );
    eprintln!("acknowledged before SIGKILL: {}", acked_first.len());

    // Restart on the same file; the provider redelivers everything.
    let server = ServerProcess::start(dir.path(), &config, port, "second.log");
    let second = send_all(&server.base, &all, &Arc::new(AtomicUsize::new(0)));
    for (id, (status, answer)) in &second {
        assert_eq!(*status, 200, "{id}: {answer}");
    }
    for id in &acked_first {
        assert_eq!(
            second[*id].1, "duplicate",
            "{id} was acknowledged before the kill but is not stored"
        );
    }

    // Wait (bounded) until nothing is pending or claimed: expired leases come back. Both
    // counts come from one read: two lists read one after the other could miss an event swept
    // from claimed back to pending between them.
    let client = reqwest::blocking::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let stats = get_json(&client, &format!("{}/events/stats", server.base));
        let counts = &stats["counts"];
        if counts["pending"] == 0 && counts["claimed"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "events stuck: {counts}\n{}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let conn = rusqlite::Connection::open(dir.path().join("crash.db")).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        integrity, "ok",
        "the file survives the kill and the restart"
    );
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM events"),
        (ORDERS + REPEATS) as i64
    );
    let unfinished: Vec<String> = conn
        .prepare(
            "SELECT event_id || ' ' || status || ' after ' || attempts || ': '
                    || ifnull(last_error, '')
               FROM events WHERE status <> 'completed' LIMIT 10",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        unfinished.is_empty(),
        "every event ends completed: {unfinished:?}\n{}",
        server.logs()
    );
    // Each event once in each subscription, every one of them completed.
    let states: Vec<(String, String, String, i64)> = conn
        .prepare(
            "SELECT u.name, s.status, ifnull(s.outcome, ''), count(*)
               FROM event_state s JOIN subscriptions u ON u.id = s.sub
              GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let state = |name: &str, outcome: &str, n: usize| {
        (
            name.to_string(),
            "completed".to_string(),
            outcome.to_string(),
            n as i64,
        )
    };
    assert_eq!(
        states,
        [
            state("archive", "logged", ORDERS + REPEATS),
            state("ledger", "logged", ORDERS + REPEATS),
            state("points", "credited", ORDERS),
            state("points", "duplicate_order", REPEATS),
        ]
    );
    assert_eq!(count("SELECT count(*) FROM loyalty_credits"), ORDERS as i64);
    // Balances equal the sum over distinct orders.
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    for d in all.iter() {
        if seen.insert(d.order.clone()) {
            *expected.entry(d.customer.clone()).or_default() += d.points;
        }
    }
    for (customer, sum) in &expected {
        let account = get_json(&client, &format!("{}/loyalty/{customer}", server.base));
        assert_eq!(account["balance"].as_i64().unwrap(), *sum, "{customer}");
    }
    drop(server);
}
