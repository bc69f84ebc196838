//! Subscriptions of kind `pull` (SPEC section 13) over real HTTP: claims with leases, acks
//! fenced by the claim, extensions, long polls woken by a commit, bodies byte for byte, and
//! the tokens each route takes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;

pub const PULL_TOKEN: &str = "pull-token-0123456789";

/// A config with one `pull` subscription `orders` over `shop` and `hmac`, plus `extra` lines.
pub fn pull_config(extra: &str) -> impl FnOnce(&mut String) {
    let extra = extra.to_string();
    move |c: &mut String| {
        c.push_str(&format!(
            r#"
[[subscriptions]]
name = "orders"
kind = "pull"
sources = ["shop", "hmac"]
token = "{PULL_TOKEN}"
{extra}
"#
        ))
    }
}

async fn pull_app(extra: &str) -> TestApp {
    spawn_app_with(pull_config(extra), BuildOptions::default()).await
}

impl TestApp {
    pub async fn pull(&self, route: &str, body: Value) -> Reply {
        self.post(
            &format!("/subscriptions/orders/{route}"),
            Some(PULL_TOKEN),
            Some(body),
        )
        .await
    }

    pub async fn claim(&self, body: Value) -> Vec<Value> {
        let r = self.pull("claim", body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["claims"].as_array().unwrap().clone()
    }

    /// Claim until `n` are held (a claim may take fewer than its `max`: beside recent ingest,
    /// SQLite claims in smaller batches), with `lease_ms`.
    pub async fn claim_n(&self, n: usize, lease_ms: i64) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut held = Vec::new();
        while held.len() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} claimed",
                held.len()
            );
            let max = n - held.len();
            held.extend(self.claim(json!({"max": max, "lease_ms": lease_ms})).await);
        }
        held
    }
}

/// POST a signed delivery with its own content type.
async fn deliver_as(app: &TestApp, source: &str, id: &str, ct: &str, body: &[u8]) {
    let mut req = app
        .client
        .post(app.url(&format!("/webhooks/{source}")))
        .header("Content-Type", ct)
        .body(body.to_vec());
    for (k, v) in sign_for(&app.settings, source, id, body) {
        req = req.header(k, v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
}

/// The raw text of one claim answer, to see bodies as they are on the wire.
async fn claim_text(app: &TestApp, body: Value) -> String {
    app.client
        .post(app.url("/subscriptions/orders/claim"))
        .bearer_auth(PULL_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn state(app: &TestApp, id: &str) -> Value {
    app.event("shop", id).await["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "orders")
        .cloned()
        .unwrap_or(Value::Null)
}

/// Each body form arrives byte for byte: a JSON body embedded as received (spacing and number
/// forms kept), a form body as its text, a JSON body with a newline after it as base64.
#[tokio::test]
async fn bodies_arrive_byte_for_byte_in_each_form() {
    let app = pull_app("").await;
    let json_body = br#"{"type":"order.created",  "n": 1.50, "id":"j-1" }"#;
    deliver_as(&app, "shop", "j-1", "application/json", json_body).await;
    let form = b"payload=%7B%22type%22%3A%22order.created%22%7D&note=caf%C3%A9+au+lait";
    deliver_as(
        &app,
        "shop",
        "f-1",
        "application/x-www-form-urlencoded",
        form,
    )
    .await;
    let padded = b"{\"type\":\"order.created\"}\n";
    deliver_as(&app, "shop", "p-1", "application/json", padded).await;

    // Beside recent ingest a claim may take fewer than asked: wait for a quiet moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = claim_text(&app, json!({"max": 10})).await;
    // The JSON body is in the answer exactly as it was received.
    assert!(
        text.contains(&format!(
            "\"body\":{}",
            std::str::from_utf8(json_body).unwrap()
        )),
        "{text}"
    );
    let answer: Value = serde_json::from_str(&text).unwrap();
    let claims = answer["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 3, "{text}");
    let by_id = |id: &str| claims.iter().find(|c| c["event_id"] == id).unwrap().clone();
    assert_eq!(by_id("f-1")["body"], std::str::from_utf8(form).unwrap());
    assert_eq!(
        by_id("f-1")["content_type"],
        "application/x-www-form-urlencoded"
    );
    use base64::Engine;
    let padded_back = base64::engine::general_purpose::STANDARD
        .decode(by_id("p-1")["body_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(padded_back, padded);
    assert!(by_id("p-1").get("body").is_none());
    let j = by_id("j-1");
    assert_eq!(j["source"], "shop");
    assert_eq!(j["type"], "order.created");
    assert_eq!(j["attempt"], 1);
    for field in ["token", "received_at", "lease_until"] {
        assert!(j[field].is_string(), "{field}: {j}");
    }
    app.stop().await;
}

/// done completes, retry comes back after the backoff and fails once the attempts are spent,
/// fail fails, release gives back; an ack of a claim no longer held is `lease_lost` and the
/// rest of its batch still applies.
#[tokio::test]
async fn acks_apply_each_outcome_fenced_by_the_claim() {
    let app = pull_app("max_attempts = 2\nbackoff_base_ms = 1\nbackoff_max_ms = 2").await;
    for id in ["a", "b", "c", "d"] {
        app.deliver("shop", id, &order_body(id, "c1", 5)).await;
    }
    let claims = app.claim_n(4, 30000).await;
    let token = |id: &str| {
        claims.iter().find(|c| c["event_id"] == id).unwrap()["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // Nothing more is due while they are held.
    assert!(app.claim(json!({})).await.is_empty());
    let r = app
        .pull(
            "ack",
            json!({"results": [
                {"token": token("a"), "outcome": "done"},
                {"token": token("b"), "outcome": "retry", "error": "busy"},
                {"token": token("c"), "outcome": "fail", "error": "cannot parse"},
                {"token": token("d"), "outcome": "release"},
                {"token": token("a"), "outcome": "done"},
            ]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let results = r.body["results"].as_array().unwrap();
    let got: Vec<(bool, Value)> = results
        .iter()
        .map(|r| (r["applied"].as_bool().unwrap(), r["status"].clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (true, json!("completed")),
            (true, json!("pending")),
            (true, json!("failed")),
            (true, json!("pending")),
            (false, Value::Null),
        ]
    );
    assert_eq!(results[4]["reason"], "lease_lost");
    assert_eq!(state(&app, "a").await["status"], "completed");
    assert_eq!(state(&app, "a").await["outcome"], "delivered");
    let c = state(&app, "c").await;
    assert_eq!(c["status"], "failed");
    assert!(
        c["last_error"].as_str().unwrap().contains("cannot parse"),
        "{c}"
    );
    // b (after its backoff) and d come again; b's second retry spends its budget.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = app.claim_n(2, 30000).await;
    let ids: std::collections::BTreeSet<_> = again
        .iter()
        .map(|c| c["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["b", "d"].into());
    let b = again.iter().find(|c| c["event_id"] == "b").unwrap();
    assert_eq!(b["attempt"], 2);
    let r = app
        .pull(
            "ack",
            json!({"results": [{"token": b["token"], "outcome": "retry", "retry_after_ms": 5}]}),
        )
        .await;
    assert_eq!(r.body["results"][0]["status"], "failed", "{}", r.body);
    let b = state(&app, "b").await;
    assert!(
        b["last_error"]
            .as_str()
            .unwrap()
            .contains("gave up after 2"),
        "{b}"
    );
    // History records whose attempts they were.
    let history = app.event("shop", "c").await["history"].clone();
    assert!(history.to_string().contains("orders"), "{history}");
    app.stop().await;
}

/// A lease runs out unless extended; an extended claim can still be acked after its first
/// lease would have ended, and an expired one cannot (it is claimed again).
#[tokio::test]
async fn extend_keeps_a_claim_and_an_expired_lease_is_lost() {
    let app = pull_app("").await;
    app.deliver("shop", "x", &order_body("x", "c1", 5)).await;
    app.deliver("shop", "y", &order_body("y", "c1", 5)).await;
    let claims = app.claim_n(2, 1000).await;
    let (x, y) = if claims[0]["event_id"] == "x" {
        (&claims[0], &claims[1])
    } else {
        (&claims[1], &claims[0])
    };
    let r = app
        .pull("extend", json!({"tokens": [x["token"]], "lease_ms": 20000}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["results"][0]["extended"], true, "{}", r.body);
    assert!(r.body["results"][0]["lease_until"].is_string());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let r = app
        .pull(
            "extend",
            json!({"tokens": [y["token"], x["token"]], "lease_ms": 20000}),
        )
        .await;
    assert_eq!(r.body["results"][0]["extended"], false, "{}", r.body);
    assert_eq!(r.body["results"][0]["reason"], "lease_lost");
    assert_eq!(r.body["results"][1]["extended"], true);
    let r = app
        .pull(
            "ack",
            json!({"results": [
                {"token": y["token"], "outcome": "done"},
                {"token": x["token"], "outcome": "done"},
            ]}),
        )
        .await;
    assert_eq!(r.body["results"][0]["applied"], false, "{}", r.body);
    assert_eq!(r.body["results"][1]["applied"], true, "{}", r.body);
    // y is claimed again (by the sweeper's hand-back, or at once if not swept yet: the
    // wait covers both).
    let again = app.claim(json!({"wait_ms": 10000})).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["event_id"], "y");
    assert_eq!(again[0]["attempt"], 2);
    app.stop().await;
}

/// An at-most-once pull subscription abandons a claim whose lease ran out: the client may
/// have acted.
#[tokio::test]
async fn at_most_once_abandons_an_expired_lease() {
    let app = pull_app("mode = \"at-most-once\"").await;
    app.deliver("shop", "m", &order_body("m", "c1", 5)).await;
    let claims = app.claim(json!({"lease_ms": 1000})).await;
    assert_eq!(claims.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = state(&app, "m").await;
        if s["status"] == "failed" {
            assert_eq!(s["abandoned"], true, "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "never abandoned: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(app.claim(json!({})).await.is_empty());
    app.stop().await;
}

/// A long poll answers as soon as an event commits, not at the end of its wait; with no
/// work, at the end of the wait with no claims.
#[tokio::test]
async fn a_long_poll_answers_when_work_commits() {
    let app = Arc::new(pull_app("").await);
    let started = Instant::now();
    assert!(app.claim(json!({"wait_ms": 600})).await.is_empty());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(550), "{waited:?}");

    let poller = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            let claims = app.claim(json!({"wait_ms": 15000})).await;
            (claims, Instant::now())
        })
    };
    // Just after the poll's own look (once a second from the start of its wait): the timer
    // alone would answer about 850 ms later.
    tokio::time::sleep(Duration::from_millis(1_150)).await;
    app.deliver("shop", "w", &order_body("w", "c1", 5)).await;
    let committed = Instant::now();
    let (claims, answered) = poller.await.unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["event_id"], "w");
    let latency = answered - committed;
    assert!(latency < Duration::from_millis(400), "{latency:?}");
    Arc::into_inner(app).unwrap().stop().await;
}

/// A client that disconnects mid-wait leaves no claim behind: the next client gets the
/// event at once. A shutdown answers a waiting poll at once, with no claims.
#[tokio::test]
async fn a_gone_poller_keeps_nothing_and_shutdown_ends_polls() {
    use tokio::io::AsyncWriteExt;
    let app = pull_app("").await;
    let body = json!({"wait_ms": 20000}).to_string();
    let mut socket = tokio::net::TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap();
    let request = format!(
        "POST /subscriptions/orders/claim HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \
         {PULL_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(socket);
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.deliver("shop", "g", &order_body("g", "c1", 5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let claims = app.claim(json!({})).await;
    assert_eq!(claims.len(), 1, "the gone poller kept the event");
    assert_eq!(claims[0]["event_id"], "g");

    let client = app.client.clone();
    let url = app.url("/subscriptions/orders/claim");
    let poll = tokio::spawn(async move {
        let started = Instant::now();
        let r = client
            .post(url)
            .bearer_auth(PULL_TOKEN)
            .json(&json!({"wait_ms": 30000}))
            .send()
            .await
            .unwrap();
        (r.json::<Value>().await.unwrap(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.stop().await;
    let (answer, took) = poll.await.unwrap();
    assert_eq!(answer["claims"], json!([]), "{answer}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// Eight clients claim at once, released through a barrier: no event is held by two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_clients_never_hold_one_event() {
    let app = Arc::new(pull_app("").await);
    for i in 0..120 {
        app.deliver(
            "shop",
            &format!("r{i}"),
            &order_body(&format!("r{i}"), "c1", 1),
        )
        .await;
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (app, barrier) = (Arc::clone(&app), Arc::clone(&barrier));
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for _ in 0..20 {
                    barrier.wait().await;
                    let claims = app.claim(json!({"max": 3, "wait_ms": 50})).await;
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
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "an event was claimed twice");
    // Whatever the racing left unclaimed is still there, once.
    let rest = app.claim_n(120 - all.len(), 30000).await;
    all.extend(
        rest.iter()
            .map(|c| c["event_id"].as_str().unwrap().to_string()),
    );
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!((unique.len(), all.len()), (120, 120));
    Arc::into_inner(app).unwrap().stop().await;
}

/// Each route takes the subscription's own token only; the pull token opens no ops route.
#[tokio::test]
async fn each_token_opens_its_own_routes() {
    let app = pull_app("").await;
    for token in [Some(ADMIN_TOKEN), Some(SUBMIT_TOKEN), Some("nope"), None] {
        for route in ["claim", "ack", "extend"] {
            let r = app
                .post(
                    &format!("/subscriptions/orders/{route}"),
                    token,
                    Some(json!({})),
                )
                .await;
            r.assert_error(401, "unauthorized");
        }
    }
    let r = app
        .client
        .get(app.url("/events"))
        .bearer_auth(PULL_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = app
        .post("/subscriptions/orders/pause", Some(PULL_TOKEN), None)
        .await;
    r.assert_error(401, "unauthorized");
    // A name nobody subscribed under answers as a wrong token does: which names exist is not
    // told to whoever has no token for them.
    for token in [Some(PULL_TOKEN), Some("nope"), None] {
        for route in ["claim", "ack", "extend"] {
            let r = app
                .post(
                    &format!("/subscriptions/nobody/{route}"),
                    token,
                    Some(json!({})),
                )
                .await;
            r.assert_error(401, "unauthorized");
        }
    }
    app.stop().await;
}

/// Bad input: a 4xx naming the field, and nothing changed (the event is still claimable
/// once, its claim still held).
#[tokio::test]
async fn bad_input_is_refused_naming_the_field() {
    let app = pull_app("").await;
    app.deliver("shop", "z", &order_body("z", "c1", 5)).await;
    for (body, field) in [
        (json!({"max": 0}), "max"),
        (json!({"max": 1001}), "max"),
        (json!({"max": -1}), "max"),
        (json!({"max": 1e30}), "max"),
        (json!({"lease_ms": -5}), "lease_ms"),
        (json!({"lease_ms": 99_999_999_999i64}), "lease_ms"),
        (json!({"wait_ms": 60001}), "wait_ms"),
        (json!({"wait_ms": -1}), "wait_ms"),
        (json!({"maximum": 3}), "maximum"),
        (json!([1]), "object"),
    ] {
        let r = app.pull("claim", body.clone()).await;
        r.assert_error(422, "invalid_request");
        let message = r.body["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    let r = app
        .client
        .post(app.url("/subscriptions/orders/claim"))
        .bearer_auth(PULL_TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let claims = app.claim(json!({})).await;
    assert_eq!(claims.len(), 1);
    let token = claims[0]["token"].as_str().unwrap().to_string();
    // A token that was never issued, one altered, one of another form: refused whole.
    let altered = {
        let mut t = token.clone();
        let last = t.pop().unwrap();
        t.push(if last == '0' { '1' } else { '0' });
        t
    };
    for (results, field) in [
        (
            json!([{"token": token, "outcome": "done"}, {"token": altered, "outcome": "done"}]),
            "results[1].token",
        ),
        (
            json!([{"token": "abc", "outcome": "done"}]),
            "results[0].token",
        ),
        (
            json!([{"token": token, "outcome": "maybe"}]),
            "results[0].outcome",
        ),
        (
            json!([{"token": token, "outcome": "retry", "retry_after_ms": -1}]),
            "results[0].retry_after_ms",
        ),
        (
            json!([{"token": token, "outcome": "done", "extra": 1}]),
            "results[0]",
        ),
        (json!([]), "results"),
    ] {
        let r = app.pull("ack", json!({ "results": results })).await;
        r.assert_error(422, "invalid_request");
        let message = r.body["message"].as_str().unwrap();
        assert!(message.contains(field), "{results}: {message}");
    }
    for (body, field) in [
        (json!({"tokens": [altered], "lease_ms": 5000}), "tokens[0]"),
        (json!({"tokens": [token], "lease_ms": 0}), "lease_ms"),
        (json!({"tokens": [token]}), "lease_ms"),
        (json!({"tokens": [], "lease_ms": 5000}), "tokens"),
    ] {
        let r = app.pull("extend", body.clone()).await;
        r.assert_error(422, "invalid_request");
        let message = r.body["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    // Nothing changed: the first (valid) entry of the refused batch was not applied.
    assert_eq!(state(&app, "z").await["status"], "claimed");
    let r = app
        .pull(
            "ack",
            json!({"results": [{"token": token, "outcome": "done"}]}),
        )
        .await;
    assert_eq!(r.body["results"][0]["applied"], true, "{}", r.body);
    app.stop().await;
}

/// One claim twice in an ack batch is applied once: the second entry answers `lease_lost`,
/// and the event is completed once (`pulls_total{action="done"}` counts one). PostgreSQL
/// applied both before (its one statement over the batch does not see its own first write):
/// run on both stores through the real binary's config.
async fn a_claim_acked_twice_in_one_batch_is_applied_once(kind: crate::stores::StoreKind) {
    let db_dir = tempfile::tempdir().unwrap();
    let db = crate::stores::TestDb::create(kind, db_dir.path());
    let url = db.url();
    let app = spawn_app_with(
        move |c| {
            *c = c
                .lines()
                .map(|l| {
                    if l.starts_with("database_url") {
                        format!("database_url = \"{url}\"")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            pull_config("")(c)
        },
        BuildOptions::default(),
    )
    .await;
    app.deliver("shop", "d", &order_body("d", "c1", 5)).await;
    let claims = app.claim_n(1, 30_000).await;
    let token = claims[0]["token"].as_str().unwrap();
    let r = app
        .pull(
            "ack",
            json!({"results": [{"token": token, "outcome": "done"},
                               {"token": token, "outcome": "done"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["results"][0]["applied"], true, "{}", r.body);
    assert_eq!(r.body["results"][1]["applied"], false, "{}", r.body);
    assert_eq!(r.body["results"][1]["reason"], "lease_lost", "{}", r.body);
    let metrics = app.metrics_text().await;
    let done: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("webhook_inbox_pulls_total") && l.contains("action=\"done\""))
        .collect();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].ends_with(" 1"), "counted once: {done:?}");
    app.stop().await;
    drop(db);
}

#[test]
fn sqlite_a_claim_acked_twice_in_one_batch_is_applied_once() {
    tokio::runtime::Runtime::new().unwrap().block_on(
        a_claim_acked_twice_in_one_batch_is_applied_once(crate::stores::StoreKind::Sqlite),
    );
}

#[test]
fn postgres_a_claim_acked_twice_in_one_batch_is_applied_once() {
    if crate::pgdb::available() {
        tokio::runtime::Runtime::new().unwrap().block_on(
            a_claim_acked_twice_in_one_batch_is_applied_once(crate::stores::StoreKind::Postgres),
        );
    }
}

/// A `lease_seconds` longer than a pull lease may be (12 h) is still a valid default: a claim
/// that sends no `lease_ms` gets the longest lease, not a 422 about a field it never sent.
/// Seen failing before the default was clamped.
#[tokio::test]
async fn a_claim_without_lease_ms_is_served_whatever_the_service_lease() {
    let app = spawn_app_with(
        |c| {
            *c = c.replace("lease_seconds = 30", "lease_seconds = 86400");
            pull_config("")(c)
        },
        BuildOptions::default(),
    )
    .await;
    assert_eq!(app.settings.consumers.lease_seconds, 86_400);
    app.deliver("shop", "l", &order_body("l", "c1", 5)).await;
    let r = app.pull("claim", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let claims = r.body["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    let until =
        webhook_inbox::domain::time::parse_rfc3339(claims[0]["lease_until"].as_str().unwrap())
            .unwrap();
    let hours = (until - webhook_inbox::domain::time::now_ms()) as f64 / 3_600_000.0;
    assert!((11.9..=12.0).contains(&hours), "lease of {hours} h");
    app.stop().await;
}

/// A long poll whose client goes while the poll's claim is under way (after its last
/// heartbeat) gives its claims back at once, rather than leaving them leased to nobody. The
/// claim is held up by a write lock taken from the test on the SQLite file, the client closes
/// its connection meanwhile, and then the lock goes. (The server notices the close on its read
/// side and drops the poll; a poll whose answer's own write fails gives its claims back too,
/// see `pull::wait_for_claims`, a window this test cannot open on purpose.)
#[tokio::test]
async fn a_long_poll_client_gone_during_its_claim_keeps_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = pull_app("").await;
    app.deliver("shop", "r", &order_body("r", "c1", 5)).await;
    // Claimed and acked `retry` in 1.5 s: due by time, so that a poll's own look claims it.
    let claims = app.claim(json!({})).await;
    let token = claims[0]["token"].as_str().unwrap();
    let r = app
        .pull(
            "ack",
            json!({"results": [{"token": token, "outcome": "retry", "retry_after_ms": 1500}]}),
        )
        .await;
    assert_eq!(r.body["results"][0]["status"], "pending", "{}", r.body);
    let body = json!({"wait_ms": 20000, "lease_ms": 60000}).to_string();
    let mut socket = tokio::net::TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap();
    let request = format!(
        "POST /subscriptions/orders/claim HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \
         {PULL_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    // Heartbeats come; the write lock is taken from outside; once they stop for a while, the
    // poll's claim is waiting for the lock.
    let conn = rusqlite::Connection::open(app.dir.path().join("inbox.db")).unwrap();
    let (release_lock, wait_release) = std::sync::mpsc::channel::<()>();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf))
        .await
        .expect("the poll answers with headers and heartbeats")
        .unwrap();
    assert!(n > 0);
    let holder = std::thread::spawn(move || {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        wait_release.recv().unwrap();
        conn.execute_batch("ROLLBACK").unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        assert!(Instant::now() < deadline, "the heartbeats never stopped");
        match tokio::time::timeout(Duration::from_millis(400), socket.read(&mut buf)).await {
            Ok(Ok(n)) => assert!(n > 0, "the poll ended early"),
            Ok(Err(e)) => panic!("{e}"),
            // No heartbeat for 400 ms: the poll is in its claim, waiting for the lock.
            Err(_) => break,
        }
    }
    // The client's process goes (its socket closed: a FIN, and a reset for what comes
    // after), then the claim gets the lock.
    drop(socket);
    tokio::time::sleep(Duration::from_millis(100)).await;
    release_lock.send(()).unwrap();
    holder.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let claims = loop {
        let claims = app.claim(json!({})).await;
        if !claims.is_empty() || Instant::now() > deadline {
            break claims;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        claims.len(),
        1,
        "the gone client's claim was not given back"
    );
    assert_eq!(claims[0]["event_id"], "r");
    app.stop().await;
}

/// Events not fanned out yet count as pending (and age the lag) for a `pull` subscription as
/// they do for an `http` one: with no worker to fan them out, a pull client that never came
/// still shows its backlog in `GET /subscriptions`, not zero.
#[tokio::test]
async fn a_backlog_not_fanned_out_yet_counts_as_pending_for_a_pull_subscription() {
    let app = pull_app("").await;
    for i in 0..3 {
        let r = app.deliver("shop", &format!("wait-{i}"), "{}").await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = app.get("/subscriptions").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let orders = r.body["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "orders")
        .cloned()
        .unwrap();
    assert_eq!(orders["counts"]["pending"], 3, "{orders}");
    assert_eq!(orders["lag"], 3, "{orders}");
    // Fanned out by its own claim, the count stays the same: claimed now, not pending twice.
    let held = app.claim_n(3, 30_000).await;
    assert_eq!(held.len(), 3);
    let r = app.get("/subscriptions").await;
    let orders = r.body["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "orders")
        .cloned()
        .unwrap();
    assert_eq!(orders["counts"]["pending"], 0, "{orders}");
    assert_eq!(orders["counts"]["claimed"], 3, "{orders}");
}
