//! The PostgreSQL server goes away under a serving node and comes back (SPEC sections 3 and 8):
//! meanwhile every delivery is answered 503 with `Retry-After` in bounded time and none is
//! acknowledged, `/readyz` says 503, the node neither hangs nor exits, and once the server is
//! back the node serves again by itself and the provider's retries are stored.
//!
//! Stopping the shared test server would break the PostgreSQL tests running beside this one,
//! so this test starts a cluster of its own through `scripts/with-postgres` and stops that.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::*;
use crate::nodes::{node_config, send_one};
use crate::pgdb;
use crate::process::{ServerProcess, exit_within, free_port};

/// A throwaway PostgreSQL cluster for one test: `scripts/with-postgres` around a command that
/// writes the cluster's URL and control script into a file and then waits. Dropping it sends
/// SIGTERM to the script, which stops its command and removes the cluster.
pub struct PrivateCluster {
    script: Option<Child>,
    pub url: String,
    ctl: PathBuf,
    log: PathBuf,
}

impl PrivateCluster {
    pub fn start(dir: &Path) -> PrivateCluster {
        let handoff = dir.join("cluster");
        let log = dir.join("with-postgres.log");
        let script = Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/with-postgres"
            ))
            .args(["sh", "-c"])
            // The wait is bounded too: the cluster goes away after ten minutes whatever happens.
            .arg(
                r#"printf '%s\n%s\n' "$TEST_POSTGRES_URL" "$TEST_POSTGRES_CTL" >"$1.tmp" \
                   && mv "$1.tmp" "$1" && exec sleep 600"#,
            )
            .arg("sh")
            .arg(&handoff)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("run scripts/with-postgres");
        let mut cluster = PrivateCluster {
            script: Some(script),
            url: String::new(),
            ctl: PathBuf::new(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&handoff) {
                break text;
            }
            if let Some(status) = cluster.script.as_mut().unwrap().try_wait().unwrap() {
                panic!("with-postgres exited ({status}): {}", cluster.logs());
            }
            assert!(Instant::now() < deadline, "no cluster: {}", cluster.logs());
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut lines = text.lines();
        cluster.url = lines.next().unwrap().to_string();
        cluster.ctl = PathBuf::from(lines.next().unwrap());
        cluster
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `stop` (fast shutdown), `kill` (immediate, like a crash) or `start`; pg_ctl bounds each.
    pub fn ctl(&self, action: &str) {
        let status = Command::new(&self.ctl).arg(action).status().unwrap();
        assert!(status.success(), "pg_ctl {action}: {}", self.logs());
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if let Some(mut script) = self.script.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(script.id().to_string())
                .status();
            exit_within(
                &mut script,
                Duration::from_secs(60),
                "with-postgres on SIGTERM",
            );
        }
    }
}

/// One signed delivery: status, whether `Retry-After` came, the error code, how long it took.
fn deliver(base: &str, id: &str) -> (u16, bool, String, Duration) {
    let settings = crate::nodes::signing_settings();
    let body = order_body(&format!("o-{id}"), "c-1", 1);
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let mut req = client
        .post(format!("{base}/webhooks/shop"))
        .body(body.clone());
    for (k, v) in sign_for(&settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    let started = Instant::now();
    let r = req
        .send()
        .expect("an answer, not a hang or a closed connection");
    let status = r.status().as_u16();
    let retry_after = r.headers().contains_key("retry-after");
    let json: serde_json::Value = r.json().unwrap_or_default();
    let code = json["error"].as_str().unwrap_or("").to_string();
    (status, retry_after, code, started.elapsed())
}

fn get_status(base: &str, path: &str) -> u16 {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .map_or(0, |r| r.status().as_u16())
}

/// Poll `check` every 100 ms until it holds; fail naming `what` past `within`.
fn until(what: &str, within: Duration, node: &ServerProcess, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}\n{}",
            node.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_database_restart_while_a_node_serves_answers_503_then_recovers_by_itself() {
    if !pgdb::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = PrivateCluster::start(dir.path());
    let port = free_port();
    let extra = "[consumers]\nworkers = 1\nlease_seconds = 5\nbackoff_base_ms = 10\n\
                 backoff_max_ms = 200\n\n[downstream]\ntimeout_ms = 500\n";
    let config = node_config(dir.path(), "node", port, &cluster.url, extra);
    let node = ServerProcess::start(dir.path(), &config, port, "node.log");
    assert_eq!(send_one(&node.base, "before", "{}").1, "queued");

    cluster.ctl("stop");
    // During the outage: bounded answers, 503 + Retry-After, nothing acknowledged.
    let mut refused = Vec::new();
    for i in 0..5 {
        let id = format!("during-{i}");
        let (status, retry_after, code, took) = deliver(&node.base, &id);
        assert_eq!(
            status, 503,
            "{id} answered {status} {code} while the database is down"
        );
        assert!(retry_after && code == "unavailable", "{id}: {code}");
        assert!(took < Duration::from_secs(10), "{id} waited {took:?}");
        refused.push(id);
    }
    until("/readyz 503", Duration::from_secs(30), &node, || {
        get_status(&node.base, "/readyz") == 503
    });
    assert_eq!(
        get_status(&node.base, "/healthz"),
        200,
        "the node still runs"
    );

    cluster.ctl("start");
    // No restart of the node: it reconnects by itself.
    until("ready again", Duration::from_secs(60), &node, || {
        get_status(&node.base, "/readyz") == 200
    });
    until(
        "deliveries accepted again",
        Duration::from_secs(30),
        &node,
        || deliver(&node.base, "after").0 == 200,
    );
    // The provider retries what was refused: stored now, never lost.
    for id in &refused {
        let (status, _, code, _) = deliver(&node.base, id);
        assert_eq!(status, 200, "{id}: {code}");
    }
    // And the consumer finishes all of it.
    let mut ids = refused.clone();
    ids.extend(["before".to_string(), "after".to_string()]);
    let client = reqwest::blocking::Client::new();
    until(
        "every event completed",
        Duration::from_secs(60),
        &node,
        || {
            ids.iter().all(|id| {
                client
                    .get(format!("{}/events/shop/{id}", node.base))
                    .bearer_auth(ADMIN_TOKEN)
                    .send()
                    .ok()
                    .and_then(|r| r.json::<serde_json::Value>().ok())
                    .is_some_and(|e| e["status"] == "completed")
            })
        },
    );
    drop(node);
    // SIGTERM to the script stops the cluster and removes its folder.
    let folder = cluster.ctl.parent().unwrap().to_path_buf();
    drop(cluster);
    assert!(!folder.exists(), "{} left behind", folder.display());
}

/// The database server crashes (an immediate stop: what its WAL buffers held is lost) while a
/// node takes deliveries and its consumers drain them: every delivery answered 200 is there
/// after the restart, every event ends completed, and each order is credited once, with the
/// balances summing the credits. The in-process lane's claims and completions commit without
/// waiting for the flush (`consume::commit_unflushed`): the crash may take the last of them
/// away, and they are done again. Seen failing with the group commit's flush taken out as well
/// (deliveries answered 200 missing after the restart).
#[test]
fn a_database_crash_while_a_node_ingests_and_drains_loses_no_acknowledged_delivery_and_credits_once()
 {
    if !pgdb::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = PrivateCluster::start(dir.path());
    let port = free_port();
    let extra = "[consumers]\nworkers = 4\nlease_seconds = 2\nbackoff_base_ms = 10\n\
                 backoff_max_ms = 200\n\n[downstream]\ntimeout_ms = 500\n";
    let config = node_config(dir.path(), "node", port, &cluster.url, extra);
    let node = ServerProcess::start(dir.path(), &config, port, "node.log");
    const SENDERS: usize = 4;
    const ORDERS: usize = 300;
    let body = |n: usize| order_body(&format!("o-{}", n % ORDERS), &format!("c-{}", n % 9), 1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Each sender's deliveries and whether each was answered 200.
    let sent: Vec<Vec<(String, usize, bool)>> = std::thread::scope(|s| {
        let senders: Vec<_> = (0..SENDERS)
            .map(|t| {
                let (stop, base) = (&stop, &node.base);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for k in 0..20_000 {
                        if stop.load(std::sync::atomic::Ordering::SeqCst) {
                            break;
                        }
                        let n = k * SENDERS + t;
                        let id = format!("d-{n}");
                        let (status, _) = send_one(base, &id, &body(n));
                        mine.push((id, n, status == 200));
                    }
                    mine
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        cluster.ctl("kill");
        std::thread::sleep(Duration::from_millis(500));
        cluster.ctl("start");
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        senders.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let sent: Vec<_> = sent.concat();
    let acked: Vec<&(String, usize, bool)> = sent.iter().filter(|d| d.2).collect();
    assert!(
        acked.len() >= 100,
        "deliveries before and around the crash: {} of {} answered 200",
        acked.len(),
        sent.len()
    );
    let mut db = postgres::Client::connect(&cluster.url, postgres::NoTls).unwrap();
    let stored = |db: &mut postgres::Client, id: &str| -> bool {
        db.query_one(
            "SELECT count(*) FROM event_log WHERE source = 'shop' AND event_id = $1",
            &[&id],
        )
        .unwrap()
        .get::<_, i64>(0)
            == 1
    };
    let lost: Vec<&str> = acked
        .iter()
        .filter(|d| !stored(&mut db, &d.0))
        .map(|d| d.0.as_str())
        .collect();
    assert!(
        lost.is_empty(),
        "{} deliveries answered 200 are missing after the crash: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    // The provider retries what was not answered 200 (stored or not: a duplicate then).
    for (id, n, _) in sent.iter().filter(|d| !d.2) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while send_one(&node.base, id, &body(*n)).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "{id} never taken after the restart"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let count =
        |db: &mut postgres::Client, sql: &str| -> i64 { db.query_one(sql, &[]).unwrap().get(0) };
    until(
        "every event completed",
        Duration::from_secs(120),
        &node,
        || {
            count(
                &mut db,
                "SELECT count(*) FROM event_state WHERE status <> 'completed'",
            ) == 0
                && count(
                    &mut db,
                    "SELECT count(*) FROM event_log WHERE source = 'shop'",
                ) == sent.len() as i64
                && count(&mut db, "SELECT count(*) FROM event_state") >= sent.len() as i64
        },
    );
    let orders: std::collections::HashSet<usize> = sent.iter().map(|d| d.1 % ORDERS).collect();
    let credits = count(&mut db, "SELECT count(*) FROM loyalty_credits");
    if credits != orders.len() as i64 {
        // What became of the events of each order without its credit: their states, outcomes
        // and history, and the dedup rows, so that a failure says where the credit went.
        let rows = db
            .query(
                "SELECT l.event_id, convert_from(b.payload, 'UTF8'), s.sub, s.status, s.outcome, s.attempts,
                        (SELECT string_agg(a.attempt || ':' || coalesce(a.result, '-') || ':'
                                           || coalesce(a.error, ''), ' | ' ORDER BY a.attempt)
                           FROM event_attempts a WHERE a.event_seq = s.seq AND a.sub = s.sub),
                        (SELECT string_agg(p.consumer || '=' || p.outcome, ',')
                           FROM processed_events p
                          WHERE p.source = l.source AND p.event_id = l.event_id)
                   FROM event_log l JOIN event_state s ON s.seq = l.seq
                   JOIN event_payloads b ON b.seq = l.seq
                  WHERE NOT EXISTS (SELECT 1 FROM loyalty_credits c
                                     WHERE convert_from(b.payload, 'UTF8') LIKE '%\"' || c.order_id || '\"%')
                  ORDER BY l.seq LIMIT 40",
                &[],
            )
            .map(|rows| {
                rows.iter()
                    .map(|r| {
                        format!(
                            "{:?}",
                            (
                                r.get::<_, String>(0),
                                r.get::<_, Option<String>>(1),
                                r.get::<_, i64>(2),
                                r.get::<_, String>(3),
                                r.get::<_, Option<String>>(4),
                                r.get::<_, i32>(5),
                                r.get::<_, Option<String>>(6),
                                r.get::<_, Option<String>>(7),
                            )
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        panic!(
            "one credit per order: {credits} credits for {} orders; the events of the orders \
             without one:\n{rows:?}\nnode log:\n{}",
            orders.len(),
            node.logs()
        );
    }
    assert_eq!(
        count(
            &mut db,
            "SELECT coalesce(sum(balance), 0)::bigint FROM loyalty_balances"
        ),
        orders.len() as i64,
        "the balances sum the credits"
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM event_state s
              WHERE NOT EXISTS (SELECT 1 FROM event_attempts a
                                 WHERE a.event_seq = s.seq AND a.sub = s.sub)"
        ),
        0,
        "every completed event has its history"
    );
    assert_eq!(crate::pgdb::orphans(&cluster.url).unwrap(), 0);
    drop(db);
    drop(node);
}

/// `.ci/run` relies on it: the command's exit status comes back, and the cluster is gone after.
#[test]
fn with_postgres_passes_the_exit_status_through_and_removes_its_cluster() {
    if !pgdb::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let handoff = dir.path().join("ctl");
    let mut script = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/with-postgres"
        ))
        .args([
            "sh",
            "-c",
            r#"echo "$TEST_POSTGRES_CTL" >"$1"; exit 3"#,
            "sh",
        ])
        .arg(&handoff)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = exit_within(&mut script, Duration::from_secs(120), "with-postgres");
    assert_eq!(status.code(), Some(3));
    let ctl = std::fs::read_to_string(&handoff).unwrap();
    let folder = Path::new(ctl.trim()).parent().unwrap();
    assert!(folder.is_absolute(), "{ctl}");
    assert!(!folder.exists(), "{} left behind", folder.display());
}
