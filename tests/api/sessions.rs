//! `listen` sessions (SPEC section 13, "Sessions"), on the real binary over a SQLite file or
//! PostgreSQL: two `listen --source` processes each get every event stored after they start,
//! signed; a session's pending events count in neither `/events/stats` nor its lag; Ctrl-C
//! deletes the session and finishes what it held (`removed`); a session that stops claiming is
//! removed by the heartbeat after `session_idle_seconds`, one that claims is not.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::nodes::{node_config, signing_settings};
use crate::process::{ServerProcess, exit_within, free_port, send_signed};
use crate::receiver::{Call, Receiver};
use crate::stores::{StoreKind, TestDb};

crate::stores::store_tests!(
    two_listen_sessions_each_get_every_event_and_end_removed,
    a_session_is_left_out_of_the_stats_and_removed_when_it_idles,
);

const NODE: &str = "[consumers]\nworkers = 1\nbackoff_base_ms = 10\nbackoff_max_ms = 100\n";

fn start(dir: &std::path::Path, db: &TestDb, name: &str, extra: &str) -> ServerProcess {
    let port = free_port();
    let config = node_config(dir, name, port, &db.url(), extra);
    ServerProcess::start(dir, &config, port, &format!("{name}.log"))
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn admin(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut req = client().request(method, url).bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().unwrap();
    (r.status().as_u16(), r.json().unwrap_or(Value::Null))
}

fn get(node: &ServerProcess, path: &str) -> Value {
    admin(reqwest::Method::GET, format!("{}{path}", node.base), None).1
}

/// The live sessions, by name.
fn sessions(node: &ServerProcess) -> Vec<String> {
    get(node, "/subscriptions")["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["origin"] == "session" && s["state"] != "removed")
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

/// Event `id`'s state in subscription `sub`.
fn state_of(node: &ServerProcess, id: &str, sub: &str) -> Value {
    get(node, &format!("/events/shop/{id}"))["subscriptions"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["name"] == sub).cloned())
        .unwrap_or(Value::Null)
}

/// `listen --source shop` to `forward_to`, signing with the test's secret; output in files.
fn listen(dir: &std::path::Path, node: &ServerProcess, forward_to: &str, log: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .args(["listen", "--source", "shop", "--types", "order.*"])
        .args(["--forward-to", forward_to, "--url", &node.base])
        .args(["--admin-token", ADMIN_TOKEN, "--signing-secret", SW_SECRET])
        .current_dir(dir)
        .env_remove("WEBHOOK_INBOX_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{log}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{log}.err"))).unwrap())
        .spawn()
        .unwrap()
}

fn interrupt(child: &mut Child) -> std::process::ExitStatus {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    exit_within(
        child,
        Duration::from_secs(15),
        "listen should stop on SIGINT",
    )
}

/// Whether `call` carries a Standard Webhooks signature with the test's secret over its bytes.
fn signed(call: &Call) -> bool {
    let secret = webhook_inbox::signature::Secret::new(SW_SECRET);
    let resigned = webhook_inbox::signature::Scheme::StandardWebhooks
        .sign(
            &secret,
            call.header("webhook-id").unwrap(),
            "",
            &call.body,
            call.header("webhook-timestamp").unwrap().parse().unwrap(),
        )
        .unwrap();
    let (_, expected) = resigned
        .iter()
        .find(|(h, _)| h == "webhook-signature")
        .unwrap();
    call.header("webhook-signature")
        .is_some_and(|s| s.contains(expected.as_str()))
}

fn ids(calls: &[Call]) -> Vec<String> {
    let mut ids: Vec<String> = calls
        .iter()
        .map(|c| c.header("webhook-inbox-event-id").unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

fn two_listen_sessions_each_get_every_event_and_end_removed(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let node = start(dir.path(), &db, "n", NODE);
    let settings = signing_settings();
    let body = |i: usize| order_body(&format!("o{i}"), "c1", 1);
    // Stored before the sessions: neither gets it (a session starts at now).
    assert_eq!(
        send_signed(&client(), &node.base, &settings, "before", &body(0)),
        200
    );
    let (first, second) = (
        Receiver::start(Duration::ZERO, 204),
        Receiver::start(Duration::ZERO, 204),
    );
    let mut a = listen(dir.path(), &node, &first.url, "a");
    let mut b = listen(dir.path(), &node, &second.url, "b");
    node.wait_for(Duration::from_secs(20), "two sessions", || {
        sessions(&node).len() == 2
    });
    let names = sessions(&node);
    for name in &names {
        assert!(name.starts_with("listen-"), "{name}");
    }

    let sent: Vec<String> = (1..=4).map(|i| format!("e{i}")).collect();
    for (i, id) in sent.iter().enumerate() {
        assert_eq!(
            send_signed(&client(), &node.base, &settings, id, &body(i + 1)),
            200
        );
    }
    // Not a type the sessions asked for.
    let customer = r#"{"type":"customer.created","data":{"customer_id":"c1"}}"#;
    assert_eq!(
        send_signed(&client(), &node.base, &settings, "c", customer),
        200
    );
    node.wait_for(
        Duration::from_secs(20),
        "each session gets every event",
        || first.calls().len() >= 4 && second.calls().len() >= 4,
    );
    std::thread::sleep(Duration::from_millis(300));
    for receiver in [&first, &second] {
        let calls = receiver.calls();
        assert_eq!(ids(&calls), sent, "each session all of them, once each");
        assert!(calls.iter().all(signed), "signed with the session's secret");
    }

    // Ctrl-C on one: its subscription is deleted, nothing left unfinished.
    assert!(interrupt(&mut a).success());
    node.wait_for(Duration::from_secs(20), "one session left", || {
        sessions(&node).len() == 1
    });
    let left = sessions(&node).remove(0);
    // The other's endpoint goes away: an event it claims is given back, pending for it, until
    // Ctrl-C deletes it and finishes that state as `removed`.
    drop(second);
    assert_eq!(
        send_signed(&client(), &node.base, &settings, "late", &body(9)),
        200
    );
    let err = dir.path().join("b.err");
    node.wait_for(Duration::from_secs(20), "the late event given back", || {
        std::fs::read_to_string(&err)
            .unwrap_or_default()
            .contains("refused the connection")
    });
    assert!(interrupt(&mut b).success());
    node.wait_for(Duration::from_secs(20), "no session left", || {
        sessions(&node).is_empty()
    });
    let state = state_of(&node, "late", &left);
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["outcome"], "removed", "{state}");
    let said = std::fs::read_to_string(&err).unwrap();
    assert!(
        said.contains(&format!("Session `{left}` deleted (1 of its")),
        "{said}"
    );
    assert!(
        first
            .calls()
            .iter()
            .all(|c| c.header("webhook-inbox-event-id") != Some("late"))
    );
}

fn a_session_is_left_out_of_the_stats_and_removed_when_it_idles(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let mut node = start(dir.path(), &db, "n1", NODE);
    let create = |node: &ServerProcess, query: &str, body: Value| {
        admin(
            reqwest::Method::POST,
            format!("{}/subscriptions{query}", node.base),
            Some(body),
        )
    };
    // Only a pull subscription can be a session; a bad query value is refused as such.
    let (status, refused) = create(
        &node,
        "?session=true",
        json!({"name": "hooks", "kind": "http", "url": "http://127.0.0.1:9/in"}),
    );
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"], "invalid_request");
    assert!(
        refused["message"].as_str().unwrap().starts_with("kind:"),
        "{refused}"
    );
    let (status, refused) = create(
        &node,
        "?session=maybe",
        json!({"name": "x", "kind": "pull"}),
    );
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"], "invalid_request");
    assert!(sessions(&node).is_empty());

    let idle = "listen-idle-0a1b2c";
    let (status, made) = create(
        &node,
        "?session=true",
        json!({"name": idle, "kind": "pull", "sources": ["shop"]}),
    );
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["origin"], "session");
    assert!(made["token"].is_string());
    let settings = signing_settings();
    for i in 0..3 {
        let body = order_body(&format!("o{i}"), "c1", 1);
        assert_eq!(
            send_signed(&client(), &node.base, &settings, &format!("e{i}"), &body),
            200
        );
    }
    // The node's own subscriptions finish them: pending for the session alone, which neither
    // the overview's counts nor its lag show.
    node.wait_for(Duration::from_secs(20), "the others done", || {
        let stats = get(&node, "/events/stats");
        stats["counts"]["pending"] == 0 && stats["counts"]["completed"] == 3
    });
    let stats = get(&node, "/events/stats");
    assert_eq!(stats["oldest_pending_seconds"], Value::Null, "{stats}");
    let view = get(&node, &format!("/subscriptions/{idle}"));
    assert_eq!(view["counts"]["pending"], 3, "{view}");
    assert_eq!(view["origin"], "session");

    // A node with a one-second idle timeout: the heartbeat removes the session (every 5 s).
    node.terminate(Duration::from_secs(20));
    let mut node = start(
        dir.path(),
        &db,
        "n2",
        &format!("session_idle_seconds = 1\n{NODE}"),
    );
    node.wait_for(Duration::from_secs(20), "the idle session removed", || {
        sessions(&node).is_empty()
    });
    let state = state_of(&node, "e0", idle);
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["outcome"], "removed", "{state}");
    assert_eq!(get(&node, "/events/stats")["counts"]["pending"], 0);

    // With 12 s: a session that keeps claiming stays, one made with it that never claims goes.
    node.terminate(Duration::from_secs(20));
    let node = start(
        dir.path(),
        &db,
        "n3",
        &format!("session_idle_seconds = 12\n{NODE}"),
    );
    let (busy, quiet) = ("listen-busy-0a1b2c", "listen-quiet-0a1b2c");
    let (_, made) = create(
        &node,
        "?session=true",
        json!({"name": busy, "kind": "pull"}),
    );
    let token = made["token"].as_str().unwrap().to_string();
    let (status, _) = create(
        &node,
        "?session=true",
        json!({"name": quiet, "kind": "pull"}),
    );
    assert_eq!(status, 201);
    let deadline = Instant::now() + Duration::from_secs(40);
    // Each node serves a new subscription's routes within a second of its creation.
    let mut served = false;
    while sessions(&node).iter().any(|s| s == quiet) {
        assert!(
            Instant::now() < deadline,
            "the quiet session stays\n{}",
            node.logs()
        );
        let claimed = client()
            .post(format!("{}/subscriptions/{busy}/claim", node.base))
            .bearer_auth(&token)
            .json(&json!({"max": 1}))
            .send()
            .unwrap();
        let status = claimed.status().as_u16();
        served |= status == 200;
        assert!(status == 200 || (status == 401 && !served), "{status}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(sessions(&node), vec![busy.to_string()], "{}", node.logs());
}
