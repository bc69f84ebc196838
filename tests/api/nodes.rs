//! Several receiver nodes on one PostgreSQL database (SPEC section 8), with the real binary:
//! each `(source, event_id)` stored once whichever node gets it, each order credited once, and
//! a node SIGKILLed mid-drain whose claims the other nodes sweep and finish.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::helpers::*;
use crate::pgdb::{self, PgDatabase};
use crate::process::{ServerProcess, free_port};
use crate::receiver::Receiver;

/// A node's config: the shared database, its own port, consumers on (`workers`).
pub fn node_config(dir: &Path, name: &str, port: u16, url: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
listen = "127.0.0.1:{port}"
database_url = "{url}"
admin_token = "{ADMIN_TOKEN}"
submission_tokens = ["{SUBMIT_TOKEN}"]
{extra}

[[sources]]
name = "shop"
scheme = "standard-webhooks"
secrets = ["{SW_SECRET}"]
"#
        ),
    )
    .unwrap();
    path
}

/// Settings to sign with (only the source matters).
pub fn signing_settings() -> webhook_inbox::config::Settings {
    let text = format!(
        "admin_token = \"x-signing-only-token\"\n[[sources]]\nname = \"shop\"\nscheme = \"standard-webhooks\"\n\
         secrets = [\"{SW_SECRET}\"]\n"
    );
    webhook_inbox::config::Settings::from_toml(&text, "t", vec![]).unwrap()
}

/// Start `count` nodes on `db`, each with `extra` config lines.
fn start_nodes(dir: &Path, db: &PgDatabase, count: usize, extra: &str) -> Vec<ServerProcess> {
    (0..count)
        .map(|i| start_node(dir, db, &format!("node{i}"), extra))
        .collect()
}

fn start_node(dir: &Path, db: &PgDatabase, name: &str, extra: &str) -> ServerProcess {
    let port = free_port();
    let config = node_config(dir, name, port, &db.url, extra);
    ServerProcess::start(dir, &config, port, &format!("{name}.log"))
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// POST a signed delivery; the answer's status code and `status` field (0 when no answer).
fn send(
    client: &reqwest::blocking::Client,
    base: &str,
    id: &str,
    body: &str,
    settings: &webhook_inbox::config::Settings,
) -> (u16, String) {
    let mut req = client
        .post(format!("{base}/webhooks/shop"))
        .body(body.to_string());
    for (k, v) in sign_for(settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    match req.send() {
        Ok(r) => {
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().unwrap_or_default();
            (status, body["status"].as_str().unwrap_or("").to_string())
        }
        Err(_) => (0, String::new()),
    }
}

/// The URL's password never reaches a node's log.
fn assert_no_password_in_logs(db: &PgDatabase, nodes: &[ServerProcess]) {
    let password = db.password();
    for node in nodes {
        assert!(
            !node.logs().contains(&password),
            "a node logged the database password"
        );
    }
}

#[test]
fn sixteen_threads_sending_one_delivery_to_two_nodes_store_it_once() {
    if !pgdb::available() {
        return;
    }
    let db = PgDatabase::create();
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_nodes(dir.path(), &db, 2, "[consumers]\nworkers = 0");
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    let settings = Arc::new(signing_settings());
    for round in 0..10 {
        let id = format!("evt-{round}");
        let body = order_body(&format!("o-{round}"), "c-1", 1);
        let barrier = Arc::new(Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let (barrier, settings) = (Arc::clone(&barrier), Arc::clone(&settings));
                let (base, id, body) = (bases[t % 2].clone(), id.clone(), body.clone());
                std::thread::spawn(move || {
                    let client = client();
                    barrier.wait();
                    send(&client, &base, &id, &body, &settings)
                })
            })
            .collect();
        let answers: Vec<(u16, String)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
        let queued = answers.iter().filter(|(_, a)| a == "queued").count();
        let duplicate = answers.iter().filter(|(_, a)| a == "duplicate").count();
        assert_eq!((queued, duplicate), (1, 15), "round {round}: {answers:?}");
        let key = format!("source = 'shop' AND event_id = '{id}'");
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM events WHERE {key}")),
            1
        );
        assert_eq!(
            db.count(&format!("SELECT deliveries FROM events WHERE {key}")),
            16
        );
    }
    assert_no_password_in_logs(&db, &nodes);
}

const ORDERS: usize = 1000;
/// Deliveries that repeat an earlier order under a new event id (business duplicates).
const REPEATS: usize = 200;
const SUBMISSIONS: usize = 40;

struct Delivery {
    event_id: String,
    customer: String,
    order: String,
    points: i64,
    body: String,
}

/// Orders and their business duplicates, interleaved (as in crash.rs).
fn deliveries() -> Vec<Delivery> {
    let total = ORDERS + REPEATS;
    (0..total)
        .map(|k| (k * 7919) % total)
        .map(|i| {
            let index = if i < ORDERS { i } else { (i * 7) % ORDERS };
            let (customer, order) = (format!("c-{}", index % 20), format!("o-{index}"));
            let points = (index % 9 + 1) as i64;
            Delivery {
                body: order_body(&order, &customer, points),
                event_id: format!("evt-{i}"),
                customer,
                order,
                points,
            }
        })
        .collect()
}

/// Send each delivery to the next node in turn, as a provider retries: a node that does not
/// answer 200 (killed, or 503) gets the delivery again on another node, a bounded number of
/// times. Returns how many acknowledgements each event id got.
fn send_across(bases: &[String], all: &[Delivery], senders: usize) -> HashMap<String, usize> {
    let settings = signing_settings();
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..senders)
            .map(|t| {
                let settings = &settings;
                s.spawn(move || {
                    let client = client();
                    let mut acked = HashMap::new();
                    for (n, d) in all.iter().enumerate().skip(t).step_by(senders) {
                        for attempt in 0..40 {
                            let base = &bases[(n + attempt) % bases.len()];
                            let (status, _) = send(&client, base, &d.event_id, &d.body, settings);
                            if status == 200 {
                                *acked.entry(d.event_id.clone()).or_insert(0) += 1;
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    acked
                })
            })
            .collect();
        let mut acked = HashMap::new();
        for t in threads {
            acked.extend(t.join().unwrap());
        }
        acked
    })
}

/// Submit `SUBMISSIONS` requests through the nodes in turn (at-most-once downstream calls).
fn submit_requests(bases: &[String]) -> Vec<String> {
    let client = client();
    (0..SUBMISSIONS)
        .map(|i| {
            let base = &bases[i % bases.len()];
            let created: serde_json::Value = client
                .post(format!("{base}/requests"))
                .bearer_auth(SUBMIT_TOKEN)
                .send()
                .unwrap()
                .json()
                .unwrap();
            let id = created["id"].as_str().unwrap().to_string();
            let submitted = client
                .post(format!("{base}/requests/{id}/submit"))
                .bearer_auth(SUBMIT_TOKEN)
                .send()
                .unwrap();
            assert_eq!(submitted.status().as_u16(), 200);
            format!("requests:{id}")
        })
        .collect()
}

#[test]
fn three_nodes_with_one_killed_mid_drain_credit_each_order_once_and_finish_every_event() {
    if !pgdb::available() {
        return;
    }
    let db = PgDatabase::create();
    let dir = tempfile::tempdir().unwrap();
    let downstream = Receiver::start(Duration::from_millis(20), 200);
    // Three subscriptions take every webhook (a credit and two audits), and one takes the
    // submissions: each promise holds per subscription, across nodes.
    let extra = format!(
        "[consumers]\nworkers = 2\nbatch_size = 16\nlease_seconds = 2\n\
         backoff_base_ms = 10\nbackoff_max_ms = 100\n\n\
         [downstream]\nurl = \"{}\"\ntimeout_ms = 500\n\n\
         [[subscriptions]]\nname = \"points\"\nkind = \"loyalty-credit\"\n\
         types = [\"order.completed\"]\n\n\
         [[subscriptions]]\nname = \"ledger\"\nkind = \"audit\"\n\n\
         [[subscriptions]]\nname = \"archive\"\nkind = \"audit\"\n\n\
         [[subscriptions]]\nname = \"payments\"\nkind = \"downstream\"\n",
        downstream.url
    );
    // A backlog first, through a node without consumers (its sweeper still runs): consumers
    // that keep up with the senders would hold no claim at the moment of the kill.
    let intake = start_node(
        dir.path(),
        &db,
        "intake",
        &extra.replace("workers = 2", "workers = 0"),
    );
    let all = deliveries();
    let (first, rest) = all.split_at(all.len() / 2);
    let submitted = submit_requests(std::slice::from_ref(&intake.base));
    let mut acked = send_across(std::slice::from_ref(&intake.base), first, 4);
    let mut nodes = start_nodes(dir.path(), &db, 3, &extra);
    let mut bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    bases.push(intake.base.clone());

    let node0 = format!("'%-{}-%'", nodes[0].pid());
    let held_by_node0 =
        format!("SELECT count(*) FROM events WHERE status = 'claimed' AND claimed_by LIKE {node0}");
    let killed = AtomicI64::new(0);
    let acked_rest = std::thread::scope(|s| {
        let sender = s.spawn(|| send_across(&bases, rest, 4));
        // Kill node 0 while deliveries still arrive, the consumers drain the backlog, and node
        // 0 holds claims. While deliveries arrive its workers take turns, each claiming,
        // handling and completing a batch in its turn, so it holds claims only for part of
        // the time: node 0 is frozen (SIGSTOP) before its claims are counted, and killed only
        // if it holds some, else let go again. A count followed by a kill raced its completion.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            while db.count("SELECT count(*) FROM events WHERE status = 'completed'") < 200
                || db.count(&held_by_node0) == 0
            {
                assert!(Instant::now() < deadline, "no drain: {}", nodes[0].logs());
                std::thread::sleep(Duration::from_millis(20));
            }
            nodes[0].signal("STOP");
            if db.count(&held_by_node0) > 0 {
                break;
            }
            nodes[0].signal("CONT");
        }
        nodes[0].kill();
        killed.store(db.count(&held_by_node0), Ordering::SeqCst);
        sender.join().unwrap()
    });
    acked.extend(acked_rest);
    // Nothing changes a dead node's claims until their lease runs out.
    let held = killed.load(Ordering::SeqCst);
    assert!(
        held > 0,
        "the kill came between two batches: nothing to sweep"
    );
    eprintln!("node 0 held {held} claims when it was killed");
    let total = (ORDERS + REPEATS) as i64;
    assert_eq!(acked.len(), ORDERS + REPEATS, "every delivery acknowledged");

    // Node 0's claims come back after their lease (2 s) through the others' sweepers.
    let deadline = Instant::now() + Duration::from_secs(120);
    while db.count("SELECT count(*) FROM events WHERE status IN ('pending', 'claimed')") > 0 {
        assert!(
            Instant::now() < deadline,
            "events stuck:\n{}\n{}",
            nodes[1].logs(),
            nodes[2].logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    assert!(
        db.count(&format!(
            "SELECT count(*) FROM event_attempts WHERE result = 'lease_expired' AND worker LIKE {node0}"
        )) >= held,
        "node 0's claims were swept by the others"
    );
    let shop = "source = 'shop'";
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM events WHERE {shop}")),
        total,
        "every acknowledged delivery is stored, once"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM events WHERE {shop} AND status = 'completed'"
        )),
        total,
        "every event completed"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM loyalty_credits"),
        ORDERS as i64
    );
    // Each webhook once in each of its three subscriptions, each state completed, and one
    // attempt that ended `ok` per state (a swept claim adds a `lease_expired` one).
    for name in ["points", "ledger", "archive"] {
        let states = format!(
            "SELECT count(*) FROM event_state s JOIN subscriptions u ON u.id = s.sub
              JOIN event_log l ON l.seq = s.seq
             WHERE u.name = '{name}' AND l.{shop} AND s.status = 'completed'"
        );
        assert_eq!(db.count(&states), total, "{name}");
    }
    assert_eq!(
        db.count(
            "SELECT count(*) FROM (SELECT event_seq, sub FROM event_attempts
              WHERE result IN ('ok', 'already_processed') GROUP BY 1, 2 HAVING count(*) > 1) d"
        ),
        0,
        "no state completed twice"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM events WHERE outcome = 'credited'"),
        ORDERS as i64
    );
    assert_eq!(
        db.count("SELECT count(*) FROM events WHERE outcome = 'duplicate_order'"),
        REPEATS as i64
    );
    let mut expected: BTreeMap<&str, i64> = BTreeMap::new();
    let mut seen = HashSet::new();
    for d in &all {
        if seen.insert(&d.order) {
            *expected.entry(&d.customer).or_default() += d.points;
        }
    }
    for (customer, sum) in expected {
        let balance = db.count(&format!(
            "SELECT balance FROM loyalty_balances WHERE customer_id = '{customer}'"
        ));
        assert_eq!(balance, sum, "{customer}: the sum over distinct orders");
    }

    // At-most-once: no submission reached the downstream twice, whatever node died when.
    let keys = downstream.keys();
    let mut calls: HashMap<&str, usize> = HashMap::new();
    for key in &keys {
        *calls.entry(key.as_str()).or_default() += 1;
    }
    assert!(calls.values().all(|n| *n == 1), "called twice: {calls:?}");
    assert!(calls.keys().all(|k| submitted.iter().any(|s| s == k)));
    assert_eq!(
        db.count("SELECT count(*) FROM events WHERE source = 'requests' AND status IN ('completed', 'failed')"),
        SUBMISSIONS as i64,
        "every submission ends terminal"
    );
    assert_no_password_in_logs(&db, &nodes[1..]);
    assert_no_password_in_logs(&db, std::slice::from_ref(&intake));
}

/// For the restart test: a blocking send of one signed delivery.
pub fn send_one(base: &str, id: &str, body: &str) -> (u16, String) {
    send(&client(), base, id, body, &signing_settings())
}
