//! `webhook-inbox copy` carries the registry (issue 58): a SQLite database served by the
//! implicit subscriptions and by an `http` one (a generated signing secret, rotated, the old
//! one in its grace), a `pull` one, an ordered `pull` one with a held key, a removed one and a
//! `listen` session, with states in every status and their histories, sealed under a
//! `secrets_key`, moved by the real binary to PostgreSQL and back: every row compared, then a
//! node on the PostgreSQL copy serves what was copied. Seen failing before the copy carried
//! the registry: the copy refused the source, naming `billing`.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::copy::{assert_same_rows, copy};
use crate::endpoint::{Endpoint, receiver_available};
use crate::helpers::*;
use crate::nodes::{node_config, signing_settings};
use crate::pgdb::PgDatabase;
use crate::process::{ServerProcess, exit_within, free_port, send_signed};

const NODE: &str = "[consumers]\nworkers = 1\nmax_attempts = 2\nbackoff_base_ms = 10\n\
                    backoff_max_ms = 100\n";

fn key() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode([7u8; 32])
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A call with `token` (the admin's or a pull subscription's); status and JSON answer.
fn call(method: &str, url: String, token: &str, body: Option<Value>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = client().request(method, url).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().unwrap();
    (r.status().as_u16(), r.json().unwrap_or(Value::Null))
}

fn admin(node: &ServerProcess, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, answer) = call(method, format!("{}{path}", node.base), ADMIN_TOKEN, body);
    assert!((200..300).contains(&status), "{method} {path}: {answer}");
    answer
}

/// Claims of pull subscription `name` (no long poll).
fn claim(node: &ServerProcess, name: &str, token: &str, max: usize) -> Vec<Value> {
    let body = json!({"max": max, "lease_ms": 600_000, "wait_ms": 0});
    let url = format!("{}/subscriptions/{name}/claim", node.base);
    let (status, answer) = call("POST", url, token, Some(body));
    assert_eq!(status, 200, "{answer}");
    answer["claims"].as_array().unwrap().clone()
}

/// Claim until `n` are held (a claim beside recent ingest may take fewer than its `max`).
fn claim_n(node: &ServerProcess, name: &str, token: &str, n: usize) -> Vec<Value> {
    let mut held = Vec::new();
    node.wait_for(
        Duration::from_secs(30),
        &format!("{n} claims of {name}"),
        || {
            held.extend(claim(node, name, token, n - held.len()));
            held.len() >= n
        },
    );
    held
}

fn ack(node: &ServerProcess, name: &str, token: &str, claim: &str, outcome: &str) -> Value {
    let body = json!({"results": [{"token": claim, "outcome": outcome, "error": "said so"}]});
    let url = format!("{}/subscriptions/{name}/ack", node.base);
    let (status, answer) = call("POST", url, token, Some(body));
    assert_eq!(status, 200, "{answer}");
    answer["results"][0].clone()
}

fn id_of(claim: &Value) -> &str {
    claim["event_id"].as_str().unwrap()
}

/// Event `id`'s states, by subscription.
fn states(node: &ServerProcess, id: &str) -> Vec<Value> {
    admin(node, "GET", &format!("/events/shop/{id}"), None)["subscriptions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn state(node: &ServerProcess, id: &str, sub: &str) -> Value {
    states(node, id)
        .into_iter()
        .find(|s| s["name"] == sub)
        .unwrap_or(Value::Null)
}

/// Every event and its states as a node shows them, but the session's (a node on the copy
/// may have removed it already: see the end of the test).
fn shown(node: &ServerProcess, ids: &[&str]) -> Vec<(String, Vec<Value>)> {
    ids.iter()
        .map(|id| {
            let mut states = states(node, id);
            states.retain(|s| s["name"] != "dev-session");
            (id.to_string(), states)
        })
        .collect()
}

/// What the source holds, from its node: secrets and tokens to use on the copy.
struct Made {
    billing_secrets: Vec<String>,
    old_secret: String,
    worker_token: String,
    ledger_token: String,
    worker_claimed: String,
    ids: Vec<&'static str>,
}

/// Fill the source through its node: subscriptions of every kind, states in every status.
fn fill(node: &ServerProcess, endpoint_port: u16, endpoint_dir: &std::path::Path) -> Made {
    let hook = format!("http://127.0.0.1:{endpoint_port}/hooks");
    let made = admin(
        node,
        "POST",
        "/subscriptions",
        Some(json!({"name": "billing", "kind": "http", "url": hook, "types": ["order.*"]})),
    );
    let old_secret = made["signing_secret"].as_str().unwrap().to_string();
    let rotated = admin(
        node,
        "POST",
        "/subscriptions/billing/rotate-secret",
        Some(json!({"grace_seconds": 86_400})),
    );
    assert!(rotated["signing_secret"].as_str().unwrap() != old_secret);
    let pull = |name: &str, extra: Value| {
        let mut body = json!({"name": name, "kind": "pull", "types": ["order.*"]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        admin(node, "POST", "/subscriptions", Some(body))["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let worker_token = pull("worker", json!({}));
    let ledger_token = pull("ledger", json!({"ordered_by": "/data/customer_id"}));
    pull("gone", json!({}));
    admin(
        node,
        "POST",
        "/subscriptions?session=true",
        Some(json!({"name": "dev-session", "kind": "pull", "sources": ["shop"]})),
    );
    // The endpoint verifies with the secret before the rotation: kept signing in its grace.
    let _endpoint = Endpoint::start_on(endpoint_dir, &old_secret, endpoint_port);
    let ids = vec!["a1", "a2", "b1", "b2", "c1", "bad", "cust"];
    let settings = signing_settings();
    for id in &ids {
        let body = match *id {
            "bad" => json!({"type": "order.completed"}).to_string(),
            "cust" => json!({"type": "customer.created"}).to_string(),
            _ => order_body(id, &id[..1].to_uppercase(), 5),
        };
        assert_eq!(
            send_signed(&client(), &node.base, &settings, id, &body),
            200
        );
    }
    node.wait_for(
        Duration::from_secs(30),
        "the in-process and http states finished",
        || {
            ids.iter().all(|id| {
                states(node, id)
                    .iter()
                    .filter(|s| {
                        ["loyalty", "audit", "billing"].contains(&s["name"].as_str().unwrap())
                    })
                    .all(|s| s["status"] == "completed" || s["status"] == "failed")
            })
        },
    );
    assert_eq!(state(node, "bad", "loyalty")["status"], "failed");
    assert_eq!(state(node, "a1", "billing")["status"], "completed");

    // `worker`: one done, one failed, one claimed (its lease outlives the copy), the rest
    // pending.
    let claims = claim_n(node, "worker", &worker_token, 3);
    let token = |c: &Value| c["token"].as_str().unwrap().to_string();
    ack(node, "worker", &worker_token, &token(&claims[0]), "done");
    ack(node, "worker", &worker_token, &token(&claims[1]), "fail");
    let worker_claimed = token(&claims[2]);

    // `ledger`, ordered by customer: a1 fails and holds A (a2 waits); b1 fails and is skipped
    // (b2 may go); c1 done; `bad` (no key) released.
    let heads = claim_n(node, "ledger", &ledger_token, 4);
    let mut heads: Vec<(String, String)> = heads
        .iter()
        .map(|c| (id_of(c).to_string(), token(c)))
        .collect();
    heads.sort();
    let outcome = |id: &str| match id {
        "a1" | "b1" => "fail",
        "c1" => "done",
        _ => "release",
    };
    for (id, claim) in &heads {
        let applied = ack(node, "ledger", &ledger_token, claim, outcome(id));
        assert_eq!(applied["applied"], true, "{id}: {applied}");
    }
    admin(
        node,
        "POST",
        "/events/shop/b1/skip?subscription=ledger",
        None,
    );
    admin(node, "DELETE", "/subscriptions/gone", None);
    assert_eq!(state(node, "a1", "gone")["outcome"], "removed");
    assert_eq!(state(node, "b1", "ledger")["outcome"], "skipped");
    assert_eq!(state(node, "a1", "dev-session")["status"], "pending");
    let billing_secrets =
        admin(node, "GET", "/subscriptions/billing/secret", None)["signing_secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect();
    Made {
        billing_secrets,
        old_secret,
        worker_token,
        ledger_token,
        worker_claimed,
        ids,
    }
}

/// Every status and outcome the source's states hold (so that the copy is shown carrying each).
fn statuses(path: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.prepare(
        "SELECT DISTINCT status || '/' || ifnull(outcome, '-') FROM event_state ORDER BY 1",
    )
    .unwrap()
    .query_map([], |r| r.get(0))
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

#[test]
fn a_database_with_its_registry_moves_to_postgres_and_back_whole() {
    if !crate::pgdb::available() || !receiver_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let endpoint_dir = tempfile::tempdir().unwrap();
    let endpoint_port = free_port();
    let source = dir.path().join("inbox.db");
    let sealed = format!("secrets_key = \"{}\"\n", key());
    let port = free_port();
    let config = node_config(
        dir.path(),
        "source",
        port,
        &format!("sqlite://{}", source.display()),
        &format!("{sealed}{NODE}"),
    );
    let mut node = ServerProcess::start(dir.path(), &config, port, "source.log");
    let made = fill(&node, endpoint_port, endpoint_dir.path());
    let before = shown(&node, &made.ids);
    let held = admin(&node, "GET", "/subscriptions/ledger", None)["held_keys"].clone();
    assert_eq!(held[0]["key"], "A", "{held}");
    node.terminate(Duration::from_secs(15));
    let every = statuses(&source);
    for wanted in [
        "claimed/",
        "completed/delivered",
        "completed/credited",
        "completed/removed",
        "completed/skipped",
        "failed/",
        "pending/",
    ] {
        assert!(
            every.iter().any(|s| s.starts_with(wanted)),
            "{wanted} in {every:?}"
        );
    }

    // To PostgreSQL: every row of every table the copy names, as the source holds it.
    let pg = PgDatabase::create();
    let o = copy(
        dir.path(),
        &["--from", "sqlite://inbox.db", "--to", &pg.url],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("the secrets of billing, dev-session, ledger, worker are sealed")
            && out.contains("secrets_key"),
        "{out}"
    );
    {
        use webhook_inbox::store::Store as _;
        use webhook_inbox::store::copy::TABLES;
        let from = webhook_inbox::store::sqlite::SqliteStore::open(
            &source,
            webhook_inbox::store::sqlite::SqliteOptions::default(),
        )
        .unwrap();
        let to = webhook_inbox::store::postgres::PostgresStore::open(
            &pg.url,
            webhook_inbox::store::postgres::PostgresOptions::default(),
        )
        .unwrap();
        for table in TABLES {
            let rows = from.copy_out(table, &[], 100_000).unwrap();
            assert_eq!(
                to.copy_out(table, &[], 100_000).unwrap(),
                rows,
                "{}",
                table.name
            );
        }
        assert_eq!(to.fan_out_cursor().unwrap(), from.fan_out_cursor().unwrap());
    }
    // The registry's version moved on, so that a node reads the copied registry.
    assert_eq!(
        pg.count("SELECT version FROM subscription_registry"),
        2,
        "the migration's 1, moved once"
    );
    // And back to SQLite: every row of every table as the source holds it.
    let back = format!("sqlite://{}", dir.path().join("back.db").display());
    let o = copy(dir.path(), &["--from", &pg.url, "--to", &back]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_rows(&source, &dir.path().join("back.db"));

    // A node on the copy without the source's secrets_key refuses to start, naming why.
    let port = free_port();
    let target = |name: &str, extra: &str| {
        node_config(
            dir.path(),
            name,
            port,
            &pg.url,
            &format!("session_idle_seconds = 1\n{extra}{NODE}"),
        )
    };
    let keyless = target("keyless", "");
    let mut child = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .args(["serve", "--config"])
        .arg(&keyless)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("keyless.log")).unwrap())
        .spawn()
        .unwrap();
    let status = exit_within(
        &mut child,
        Duration::from_secs(30),
        "a node without the key",
    );
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.path().join("keyless.log")).unwrap();
    assert!(
        log.contains("no secrets key") && log.contains("billing"),
        "{log}"
    );

    // With it, the node serves what was copied.
    let config = target("target", &sealed);
    let node = ServerProcess::start(dir.path(), &config, port, "target.log");
    assert_eq!(shown(&node, &made.ids), before);
    let held = admin(&node, "GET", "/subscriptions/ledger", None)["held_keys"].clone();
    assert_eq!(held.as_array().unwrap().len(), 1, "{held}");
    assert_eq!(
        (&held[0]["key"], &held[0]["event_id"]),
        (&json!("A"), &json!("a1"))
    );
    assert_eq!(held[0]["waiting"], 1, "{held}");
    // The held key is still held: b2 (after the skip) and the released `bad` are claimed,
    // a2 is not.
    let mut next: Vec<String> = claim_n(&node, "ledger", &made.ledger_token, 2)
        .iter()
        .map(|c| id_of(c).to_string())
        .collect();
    next.sort();
    assert_eq!(next, ["b2", "bad"]);
    // A claim made on the source acks on the copy (its claims key and lease were copied), and
    // the pull token claims the events still pending.
    let acked = ack(
        &node,
        "worker",
        &made.worker_token,
        &made.worker_claimed,
        "done",
    );
    assert_eq!(acked["applied"], true, "{acked}");
    assert_eq!(claim_n(&node, "worker", &made.worker_token, 3).len(), 3);
    // The signing secrets are the source's, and a new event is signed with them: the endpoint
    // verifies with the one before the rotation.
    let secrets = admin(&node, "GET", "/subscriptions/billing/secret", None);
    assert_eq!(secrets["signing_secrets"], json!(made.billing_secrets));
    assert!(made.billing_secrets.contains(&made.old_secret));
    let _endpoint = Endpoint::start_on(endpoint_dir.path(), &made.old_secret, endpoint_port);
    let body = order_body("d1", "D", 5);
    assert_eq!(
        send_signed(&client(), &node.base, &signing_settings(), "d1", &body),
        200
    );
    node.wait_for(Duration::from_secs(30), "d1 forwarded", || {
        state(&node, "d1", "billing")["status"] == "completed"
    });
    // The session, idle since the source stopped, is removed by the copy's first node: what
    // it held finished as `removed`, with its history.
    node.wait_for(
        Duration::from_secs(30),
        "the copied session removed",
        || state(&node, "a1", "dev-session")["outcome"] == "removed",
    );
    assert_eq!(state(&node, "a1", "dev-session")["status"], "completed");
}
