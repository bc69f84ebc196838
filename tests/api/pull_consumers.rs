//! `examples/pull_consumer.py`, run as a user would run it: eight copies at once against one
//! `pull` subscription, each SIGKILLed at random moments and started again, while a provider
//! sends 10,000 events with redeliveries and business duplicates. Every event ends acknowledged
//! `done`, no order is credited twice, and the consumers' balances are exact.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::pull::{PULL_TOKEN, pull_config};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pull_consumer.py")
}

/// One copy of the example consumer, its output in `dir/consumer-N.log`.
fn start_consumer(app: &TestApp, db: &Path, n: usize) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(db.with_file_name(format!("consumer-{n}.log")))
        .unwrap();
    Command::new("python3")
        .arg(example())
        .args(["--url", &app.address, "--subscription", "orders"])
        .args(["--token", PULL_TOKEN, "--batch", "50"])
        .args(["--lease-ms", "2000", "--wait-ms", "1000"])
        .arg("--db")
        .arg(db)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting examples/pull_consumer.py with python3")
}

/// A small deterministic generator (the seed is printed, so a failure can be replayed).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_killed_consumers_apply_every_event_once() {
    killed_consumers(false).await;
}

/// The same on a subscription ordered by customer: besides, each customer's events were
/// applied in the order they were stored, although eight copies claimed them and were killed
/// mid-key (a killed copy's claim holds its key until its lease runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_killed_consumers_apply_each_customers_events_in_order() {
    killed_consumers(true).await;
}

async fn killed_consumers(ordered: bool) {
    if !crate::requires::available("python3", crate::requires::command("python3")) {
        return;
    }
    let ordering = if ordered {
        "ordered_by = \"/data/customer_id\"\n"
    } else {
        ""
    };
    // Short leases and a sweep every second: a killed copy's claims come back quickly. Enough
    // attempts that the kills never spend an event's budget.
    let app = Arc::new(
        spawn_app_with(
            |c| {
                *c = c.replace("lease_seconds = 30", "lease_seconds = 4");
                c.push_str("\n[downstream]\ntimeout_ms = 1000\n");
                pull_config(&format!(
                    "{ordering}max_attempts = 100\nbackoff_base_ms = 10\nbackoff_max_ms = 100"
                ))(c);
            },
            BuildOptions::default(),
        )
        .await,
    );
    let db = app.dir.path().join("consumer.db");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {seed}");
    let mut rng = Lcg(seed);

    // 10,000 events: 9,000 orders, and 1,000 more events repeating one of them under a new
    // event id (business duplicates); each event delivered twice (a redelivery).
    const EVENTS: usize = 10_000;
    const ORDERS: usize = 9_000;
    let mut expected: HashMap<String, i64> = HashMap::new();
    let events: Vec<(String, String)> = (0..EVENTS)
        .map(|i| {
            let order = if i < ORDERS { i } else { (i * 7919) % ORDERS };
            let (customer, points) = (format!("c{}", order % 50), (order % 7) as i64 + 1);
            if i < ORDERS {
                *expected.entry(customer.clone()).or_default() += points;
            }
            let body = order_body(&format!("o{order}"), &customer, points);
            (format!("e{i}"), body)
        })
        .collect();
    let ingest = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            futures_util::stream::iter(events.into_iter().chain(std::iter::empty()))
                .map(|(id, body)| {
                    let app = Arc::clone(&app);
                    async move {
                        for want in ["queued", "duplicate"] {
                            let r = app.deliver("shop", &id, &body).await;
                            assert_eq!(r.body["status"], want, "{id}: {}", r.body);
                        }
                    }
                })
                .buffer_unordered(16)
                .collect::<Vec<()>>()
                .await;
        })
    };

    let mut consumers: Vec<Child> = (0..8).map(|n| start_consumer(&app, &db, n)).collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut kills = 0;
    let mut ingest = Some(ingest);
    loop {
        tokio::time::sleep(Duration::from_millis(200 + rng.below(600))).await;
        let n = rng.below(8) as usize;
        consumers[n].kill().unwrap();
        consumers[n].wait().unwrap();
        kills += 1;
        consumers[n] = start_consumer(&app, &db, n);
        if let Some(task) = ingest.take_if(|t| t.is_finished()) {
            task.await.unwrap();
        }
        let view = app.get("/subscriptions/orders").await.body;
        let c = &view["counts"];
        if ingest.is_none()
            && c["completed"] == EVENTS as i64
            && c["pending"] == 0
            && c["claimed"] == 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all done within the deadline: {view}"
        );
    }
    for mut child in consumers {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(kills >= 5, "only {kills} kills");

    let view = app.get("/subscriptions/orders").await.body;
    assert_eq!(view["counts"]["failed"], 0, "{view}");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM processed_events"),
        EVENTS as i64
    );
    assert_eq!(count("SELECT count(*) FROM loyalty_credits"), ORDERS as i64);
    assert_eq!(
        count("SELECT count(*) FROM processed_events WHERE outcome = 'business_duplicate'"),
        (EVENTS - ORDERS) as i64
    );
    let mut balances: HashMap<String, i64> = HashMap::new();
    let mut stmt = conn
        .prepare("SELECT customer_id, balance FROM loyalty_balances")
        .unwrap();
    for row in stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
    {
        let (customer, balance) = row.unwrap();
        balances.insert(customer, balance);
    }
    assert_eq!(balances, expected);
    if ordered {
        // The order each customer's events were applied in (the consumers' dedup rows, in
        // insertion order) is the order they were stored in (the server's `seq`).
        let server = rusqlite::Connection::open(app.dir.path().join("inbox.db")).unwrap();
        let seq_of: HashMap<String, i64> = server
            .prepare("SELECT event_id, seq FROM event_log")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let customer_of: HashMap<String, String> = conn
            .prepare("SELECT event_id, customer_id FROM loyalty_credits")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut last: HashMap<String, i64> = HashMap::new();
        let mut applied = conn
            .prepare("SELECT event_id FROM processed_events ORDER BY rowid")
            .unwrap();
        let ids: Vec<String> = applied
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut checked = 0;
        for id in ids {
            // Business duplicates credit nothing: their customer is their order's.
            let Some(customer) = customer_of.get(&id) else {
                continue;
            };
            let seq = seq_of[&id];
            let before = last.insert(customer.clone(), seq).unwrap_or(0);
            assert!(
                seq > before,
                "{customer}: {id} (seq {seq}) applied after seq {before}"
            );
            checked += 1;
        }
        assert_eq!(checked, ORDERS);
    }
    // Every event's state is completed, acknowledged by a client (`delivered`).
    let completed = app.count(
        "SELECT count(*) FROM event_state s JOIN subscriptions u ON u.id = s.sub
          WHERE u.name = 'orders' AND s.status = 'completed' AND s.outcome = 'delivered'",
    );
    assert_eq!(completed, EVENTS as i64);
    eprintln!("{kills} kills; attempts in all: {}", app.count(
        "SELECT count(*) FROM event_attempts a JOIN subscriptions u ON u.id = a.sub WHERE u.name = 'orders'"
    ));
    Arc::into_inner(app).unwrap().stop().await;
}
