//! The registry's `http` and `pull` subscriptions served by every node (SPEC section 13, "One
//! registry"), with two nodes of the real binary on one database (a SQLite file, or
//! PostgreSQL) whose config files differ: what the API made through one node is forwarded and
//! claimed through the other, whose config never named it, without a restart; a changed URL
//! takes the next delivery; a removal finishes its work; a restart keeps what the API made.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;
use crate::nodes::{node_config, signing_settings};
use crate::process::{ServerProcess, free_port, send_signed};
use crate::receiver::Receiver;
use crate::stores::{StoreKind, TestDb};

crate::stores::store_tests!(
    subscriptions_made_through_one_node_are_served_by_another,
    patches_through_two_nodes_at_once_apply_one_after_the_other,
    two_creates_of_one_token_through_two_nodes_at_once_take_it_once,
);

fn start(dir: &std::path::Path, db: &TestDb, name: &str, own: &str) -> ServerProcess {
    // Each node's config names a subscription of its own, and neither names the API's.
    let extra = format!(
        "[consumers]\nworkers = 1\nbackoff_base_ms = 10\nbackoff_max_ms = 100\n\n\
         [[subscriptions]]\nname = \"{own}\"\nkind = \"audit\"\n"
    );
    let port = free_port();
    let config = node_config(dir, name, port, &db.url(), &extra);
    ServerProcess::start(dir, &config, port, &format!("{name}.log"))
}

fn admin(
    client: &reqwest::blocking::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client.request(method, url).bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

fn state_of(client: &reqwest::blocking::Client, base: &str, id: &str, sub: &str) -> Value {
    let (_, event) = admin(
        client,
        reqwest::Method::GET,
        format!("{base}/events/shop/{id}"),
        None,
    );
    event["subscriptions"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["name"] == sub).cloned())
        .unwrap_or(Value::Null)
}

fn subscriptions_made_through_one_node_are_served_by_another(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let (first, second) = (
        Receiver::start(Duration::ZERO, 200),
        Receiver::start(Duration::ZERO, 200),
    );
    let mut a = start(dir.path(), &db, "a", "ledger");
    let mut b = start(dir.path(), &db, "b", "books");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let settings = signing_settings();

    // Made through node A.
    let (status, hooks) = admin(
        &client,
        reqwest::Method::POST,
        format!("{}/subscriptions", a.base),
        Some(json!({"name": "hooks", "kind": "http", "url": first.url,
                    "types": ["order.*"], "timeout_ms": 2000})),
    );
    assert_eq!(status, 201, "{hooks}");
    let (status, jobs) = admin(
        &client,
        reqwest::Method::POST,
        format!("{}/subscriptions", a.base),
        Some(json!({"name": "jobs", "kind": "pull", "types": ["customer.*"]})),
    );
    assert_eq!(status, 201, "{jobs}");
    let token = jobs["token"].as_str().unwrap().to_string();
    // A stops: from now on only B, whose config names neither, can serve them.
    a.terminate(Duration::from_secs(20));

    let body = order_body("o1", "c1", 1);
    assert_eq!(send_signed(&client, &b.base, &settings, "o1", &body), 200);
    b.wait_for(Duration::from_secs(20), "B forwards o1", || {
        first.calls().len() == 1
    });
    let call = &first.calls()[0];
    assert_eq!(call.header("webhook-inbox-event-id"), Some("o1"));
    // Signed with the secret the API answered once.
    let secret = webhook_inbox::signature::Secret::new(hooks["signing_secret"].as_str().unwrap());
    let signed = call.header("webhook-signature").unwrap();
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
    assert!(
        signed.contains(expected.as_str()),
        "{signed} lacks {expected}"
    );

    // Claimed through B with the token the API answered.
    let customer = r#"{"type":"customer.created","data":{"customer_id":"c1"}}"#;
    assert_eq!(
        send_signed(&client, &b.base, &settings, "c1", customer),
        200
    );
    let claimed: Value = client
        .post(format!("{}/subscriptions/jobs/claim", b.base))
        .bearer_auth(&token)
        .json(&json!({"wait_ms": 10000}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let claims = claimed["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 1, "{claimed}");
    assert_eq!(claims[0]["event_id"], "c1");

    // A new URL takes the next delivery.
    let (status, changed) = admin(
        &client,
        reqwest::Method::PATCH,
        format!("{}/subscriptions/hooks", b.base),
        Some(json!({"url": second.url})),
    );
    assert_eq!(status, 200, "{changed}");
    let body = order_body("o2", "c1", 1);
    assert_eq!(send_signed(&client, &b.base, &settings, "o2", &body), 200);
    b.wait_for(Duration::from_secs(20), "o2 at the new URL", || {
        second.calls().len() == 1
    });
    assert_eq!(
        second.calls()[0].header("webhook-inbox-event-id"),
        Some("o2")
    );
    assert_eq!(first.calls().len(), 1, "the old URL was called again");

    // Removed through B: its waiting event is finished, a later one gets no state.
    assert_eq!(
        send_signed(&client, &b.base, &settings, "c2", customer),
        200
    );
    // Fanned out (an event not fanned out yet is pending for every subscription in the views,
    // but has no state to finish): B's own in-process subscription has handled it, and the
    // fan-out that gave it its state gave `jobs` one in the same statement.
    b.wait_for(Duration::from_secs(20), "c2 fanned out to jobs", || {
        state_of(&client, &b.base, "c2", "books")["status"] == "completed"
    });
    let (status, removed) = admin(
        &client,
        reqwest::Method::DELETE,
        format!("{}/subscriptions/jobs", b.base),
        None,
    );
    assert_eq!(status, 200, "{removed}");
    // c2 pending and c1 claimed (never acked): both finished.
    assert_eq!(
        removed,
        json!({"name": "jobs", "removed": true, "finished": 2})
    );
    assert_eq!(
        state_of(&client, &b.base, "c2", "jobs")["outcome"],
        "removed"
    );
    assert_eq!(
        send_signed(&client, &b.base, &settings, "c3", customer),
        200
    );
    b.wait_for(Duration::from_secs(20), "c3 handled by books", || {
        state_of(&client, &b.base, "c3", "books")["status"] == "completed"
    });
    assert_eq!(state_of(&client, &b.base, "c3", "jobs"), Value::Null);
    b.wait_for(
        Duration::from_secs(20),
        "the pull routes of jobs gone",
        || {
            client
                .post(format!("{}/subscriptions/jobs/claim", b.base))
                .bearer_auth(&token)
                .json(&json!({}))
                .send()
                .unwrap()
                .status()
                == 401
        },
    );

    // B restarted with its config (which never named `hooks`): still there, still served.
    b.terminate(Duration::from_secs(20));
    let b = start(dir.path(), &db, "b2", "books");
    let (status, shown) = admin(
        &client,
        reqwest::Method::GET,
        format!("{}/subscriptions/hooks", b.base),
        None,
    );
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["origin"], "api");
    assert_eq!(shown["state"], "active");
    let body = order_body("o3", "c1", 1);
    assert_eq!(send_signed(&client, &b.base, &settings, "o3", &body), 200);
    b.wait_for(
        Duration::from_secs(20),
        "o3 forwarded after the restart",
        || second.calls().len() == 2,
    );
}

/// Two `PATCH`es of one subscription released at once through two nodes: both apply, one
/// after the other (each one's own field kept; the shared one from the second), never one
/// lost or mixed. Seen failing (SQLite, 3 runs of 3, in round 0 or 1) with the read of the
/// subscription moved out of the writing transaction, as the store test `registry_changes`.
fn patches_through_two_nodes_at_once_apply_one_after_the_other(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let nodes = [
        start(dir.path(), &db, "a", "ledger"),
        start(dir.path(), &db, "b", "books"),
    ];
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (status, made) = admin(
        &client,
        reqwest::Method::POST,
        format!("{}/subscriptions", nodes[0].base),
        Some(json!({"name": "jobs", "kind": "pull", "max_attempts": 1, "backoff_base_ms": 1})),
    );
    assert_eq!(status, 201, "{made}");
    for round in 0..20 {
        let reset = json!({"max_attempts": 1, "backoff_base_ms": 1, "types": null});
        let (status, _) = admin(
            &client,
            reqwest::Method::PATCH,
            format!("{}/subscriptions/jobs", nodes[0].base),
            Some(reset),
        );
        assert_eq!(status, 200);
        let barrier = Arc::new(Barrier::new(2));
        let changes = [
            json!({"max_attempts": 2, "types": ["a.*"]}),
            json!({"max_attempts": 3, "backoff_base_ms": 7}),
        ];
        let threads: Vec<_> = changes
            .into_iter()
            .zip(&nodes)
            .map(|(body, node)| {
                let (client, barrier) = (client.clone(), Arc::clone(&barrier));
                let url = format!("{}/subscriptions/jobs", node.base);
                std::thread::spawn(move || {
                    barrier.wait();
                    admin(&client, reqwest::Method::PATCH, url, Some(body)).0
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 200);
        }
        let (_, shown) = admin(
            &client,
            reqwest::Method::GET,
            format!("{}/subscriptions/jobs", nodes[1].base),
            None,
        );
        assert_eq!(
            shown["route"]["types"],
            json!(["a.*"]),
            "round {round}: {shown}"
        );
        assert!(
            [2, 3].contains(&shown["max_attempts"].as_i64().unwrap()),
            "round {round}: {shown}"
        );
        // `backoff_base_ms` is not shown; the registry holds it.
        let backoff = db.count(
            "SELECT backoff_base_ms FROM subscriptions WHERE name = 'jobs' AND removed_at IS NULL",
        );
        assert_eq!(backoff, 7, "round {round}: a change was lost");
    }
}

/// Two `POST`s of pull subscriptions with one token, released at once through two nodes: one
/// is made, the other refused with 422 naming `token`; never two subscriptions opened by one
/// token. Seen failing (both made, SQLite and PostgreSQL, within the 10 rounds) with the
/// store's check taken out and the route's read-before-write check of before put back.
fn two_creates_of_one_token_through_two_nodes_at_once_take_it_once(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let nodes = [
        start(dir.path(), &db, "a", "ledger"),
        start(dir.path(), &db, "b", "books"),
    ];
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for round in 0..10 {
        let barrier = Arc::new(Barrier::new(2));
        let token = format!("shared-token-of-round-{round}");
        let threads: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let (client, barrier) = (client.clone(), Arc::clone(&barrier));
                let url = format!("{}/subscriptions", node.base);
                let body = json!({"name": format!("w{round}-{i}"), "kind": "pull", "token": token});
                std::thread::spawn(move || {
                    barrier.wait();
                    admin(&client, reqwest::Method::POST, url, Some(body))
                })
            })
            .collect();
        let mut answers: Vec<(u16, Value)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        answers.sort_by_key(|(status, _)| *status);
        assert_eq!(answers[0].0, 201, "round {round}: {answers:?}");
        assert_eq!(answers[1].0, 422, "round {round}: {answers:?}");
        let message = answers[1].1["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("token"), "round {round}: {message}");
        let live = db.count(&format!(
            "SELECT count(*) FROM subscriptions WHERE name LIKE 'w{round}-%' AND removed_at IS NULL"
        ));
        assert_eq!(live, 1, "round {round}: a refused create left a row");
    }
}
