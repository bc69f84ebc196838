//! Ordering per key within a subscription (SPEC section 13, "Ordering"): the events of one key
//! are handled one at a time in the order they were stored, across retries and claimers;
//! keys run in parallel; a failed event holds its key until ops skip it (or lets it go on,
//! with `on_failure = "skip"`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use webhook_inbox::domain::DeliveryMode;
use webhook_inbox::domain::time::now_ms;
use webhook_inbox::startup::BuildOptions;
use webhook_inbox::store::{Claimed, Finish, Next, Outcome};
use webhook_inbox::subscriptions::{Kind, OnFailure, Ordering, Route, Subscription};

use crate::helpers::*;
use crate::stores::StoreKind;

/// What the claimers saw, checked as they go: a key is held by one claimer at a time, and its
/// next claim is always its earliest unfinished event.
#[derive(Default)]
pub struct KeyOrder {
    /// Each key's events by seq, and the ones completed.
    keys: BTreeMap<String, BTreeSet<i64>>,
    done: BTreeSet<i64>,
    held: HashMap<String, i64>,
    pub violations: Vec<String>,
    pub claims: usize,
}

impl KeyOrder {
    pub fn expect(&mut self, key: &str, seq: i64) {
        self.keys.entry(key.to_string()).or_default().insert(seq);
    }

    /// A claim of `seq` of `key`.
    pub fn claimed(&mut self, key: &str, seq: i64) {
        self.claims += 1;
        if let Some(other) = self.held.insert(key.to_string(), seq) {
            self.violations
                .push(format!("{key}: {seq} claimed while {other} was held"));
        }
        let first = self.keys[key].iter().find(|s| !self.done.contains(s));
        if first != Some(&seq) {
            self.violations
                .push(format!("{key}: {seq} claimed before {first:?}"));
        }
    }

    /// Called before the finish commits (after it, another claimer may take the next event).
    pub fn finishing(&mut self, key: &str, seq: i64, completed: bool) {
        self.held.remove(key);
        if completed {
            self.done.insert(seq);
        }
    }

    pub fn all_done(&self) -> bool {
        self.keys.values().flatten().all(|s| self.done.contains(s))
    }
}

pub fn ordered_pull(on_failure: OnFailure) -> Subscription {
    Subscription {
        name: "orders".into(),
        kind: Kind::Pull,
        route: Route::default(),
        mode: DeliveryMode::AtLeastOnce,
        max_attempts: 1000,
        backoff_base_ms: 1,
        backoff_max_ms: 2,
        http: None,
        token: None,
        ordering: Some(Ordering {
            pointer: "/data/customer_id".into(),
            path: vec!["data".into(), "customer_id".into()],
            on_failure,
        }),
        filter: None,
        transform: None,
    }
}

fn key_of(c: &Claimed) -> Option<String> {
    let body: Value = serde_json::from_slice(&c.payload).ok()?;
    body["data"]["customer_id"].as_str().map(String::from)
}

crate::stores::store_tests!(
    racing_claimers_keep_each_keys_order,
    a_held_key_longer_than_the_window_holds_back_no_other_key
);

/// A claim first looks at a window of the oldest due states (64 at least); a failed event
/// holding a key with a longer queue than that must not hide the keys behind it. Seen failing
/// (on SQLite, through the HTTP test of the same name) with the whole-backlog look left out.
fn a_held_key_longer_than_the_window_holds_back_no_other_key(kind: crate::stores::StoreKind) {
    let h = Harness::on(kind, 1000, 30);
    let ids = h
        .store
        .sync_subscriptions(&[ordered_pull(OnFailure::Hold)], now_ms())
        .unwrap();
    let sub = ids[0];
    let mut deliveries: Vec<_> = (0..101)
        .map(|i| {
            let body = order_body(&format!("a{i}"), "A", 1);
            ("shop", format!("a{i}"), "order.completed", body)
        })
        .collect();
    deliveries.push((
        "shop",
        "b0".into(),
        "order.completed",
        order_body("b0", "B", 1),
    ));
    let refs: Vec<_> = deliveries
        .iter()
        .map(|(s, id, t, b)| (*s, id.as_str(), *t, b.clone()))
        .collect();
    h.insert(&refs);
    let claim = || {
        h.store
            .claim_subscription("c", sub, 1, 30_000, now_ms())
            .unwrap()
            .claims
    };
    let first = claim();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].claim.event_id, "a0");
    let fail = Finish {
        claim: first[0].claim.clone(),
        next: Next::Fail {
            error: "bad".into(),
            result: webhook_inbox::store::AttemptResult::PermanentError,
            abandoned: false,
        },
    };
    h.store.finish(&[fail], now_ms()).unwrap();
    let next = claim();
    assert_eq!(next.len(), 1, "b0 waits behind a0's held key");
    assert_eq!(next[0].claim.event_id, "b0");
    // And nothing else of A comes while a0 holds it.
    assert!(claim().is_empty());
}

/// Six claimers through a barrier, each finishing a third of its claims as retries: every
/// key's events are claimed one at a time, each only after the one before it completed.
/// Seen failing (both stores) with the ordered condition left out of the claim.
fn racing_claimers_keep_each_keys_order(kind: crate::stores::StoreKind) {
    let h = Harness::on(kind, 1000, 30);
    let ids = h
        .store
        .sync_subscriptions(&[ordered_pull(OnFailure::Hold)], now_ms())
        .unwrap();
    let sub = ids[0];
    let order = Arc::new(Mutex::new(KeyOrder::default()));
    let mut deliveries = Vec::new();
    for i in 0..240 {
        // 8 keys, interleaved; every tenth event has no key (it waits for nothing).
        let body = if i % 10 == 9 {
            json!({"type": "note", "data": {"n": i}}).to_string()
        } else {
            order_body(&format!("o{i}"), &format!("k{}", i % 8), 1)
        };
        deliveries.push(("shop", format!("e{i}"), "order.completed", body));
    }
    let refs: Vec<_> = deliveries
        .iter()
        .map(|(s, id, t, b)| (*s, id.as_str(), *t, b.clone()))
        .collect();
    h.insert(&refs);
    // Register every key's events (by seq, the order they were stored) before the race.
    {
        let mut o = order.lock().unwrap();
        for (i, (_, id, _, _)) in deliveries.iter().enumerate() {
            if i % 10 != 9 {
                let seq = h.detail("shop", id).event.seq;
                o.expect(&format!("k{}", i % 8), seq);
            }
        }
    }
    let threads = 6;
    let barrier = Arc::new(Barrier::new(threads));
    let deadline = Instant::now() + Duration::from_secs(60);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, order, barrier) =
                (h.store.clone(), Arc::clone(&order), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let claims = store
                        .claim_subscription(&format!("c{t}"), sub, 4, 30_000, now_ms())
                        .unwrap()
                        .claims;
                    let mut finish = Vec::new();
                    {
                        let mut o = order.lock().unwrap();
                        for c in &claims {
                            let key = key_of(c);
                            if let Some(key) = &key {
                                o.claimed(key, c.claim.seq);
                            }
                            n += 1;
                            let complete = !(n + t as u64).is_multiple_of(3);
                            if let Some(key) = &key {
                                o.finishing(key, c.claim.seq, complete);
                            }
                            finish.push(Finish {
                                claim: c.claim.clone(),
                                next: if complete {
                                    Next::Complete {
                                        effect: None,
                                        outcome: Outcome::Delivered,
                                    }
                                } else {
                                    Next::Retry {
                                        at: now_ms(),
                                        error: "try again".into(),
                                    }
                                },
                            });
                        }
                    }
                    store.finish(&finish, now_ms()).unwrap();
                    if claims.is_empty() {
                        if order.lock().unwrap().all_done() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            })
        })
        .collect();
    for t in handles {
        t.join().unwrap();
    }
    let o = order.lock().unwrap();
    assert!(o.violations.is_empty(), "{:#?}", o.violations);
    assert!(o.all_done(), "not every keyed event completed");
    assert!(
        o.claims > 216,
        "retries make more claims than events: {}",
        o.claims
    );
    for (_, id, _, _) in &deliveries {
        let detail = h.detail("shop", id);
        assert_eq!(
            detail.event.subscriptions[0].status.as_str(),
            "completed",
            "{id}"
        );
    }
}

async fn ordered_app(kind: StoreKind, on_failure: &str) -> TestApp {
    let extra = format!(
        "ordered_by = \"/data/customer_id\"\non_failure = \"{on_failure}\"\nbackoff_base_ms = 1\n\
         backoff_max_ms = 2"
    );
    spawn_app_with_on(
        kind,
        crate::pull::pull_config(&extra),
        BuildOptions::default(),
    )
    .await
}

async fn claim_ids(app: &TestApp) -> Vec<(String, String)> {
    // A quiet moment first: beside recent ingest, SQLite claims an eighth of `max`.
    tokio::time::sleep(Duration::from_millis(250)).await;
    app.claim(json!({"max": 50}))
        .await
        .iter()
        .map(|c| {
            (
                c["event_id"].as_str().unwrap().to_string(),
                c["token"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn ack(app: &TestApp, token: &str, outcome: &str) {
    let r = app
        .pull(
            "ack",
            json!({"results": [{"token": token, "outcome": outcome, "error": "bad"}]}),
        )
        .await;
    assert_eq!(r.body["results"][0]["applied"], true, "{}", r.body);
}

/// A failed event holds its key (others go on) until ops skip it; the skip is in its history,
/// and the held key is shown until then.
async fn a_failed_event_holds_its_key_until_skipped(kind: StoreKind) {
    let app = ordered_app(kind, "hold").await;
    for (id, key) in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")] {
        app.deliver("shop", id, &order_body(id, key, 1)).await;
    }
    let first = claim_ids(&app).await;
    let ids: BTreeSet<_> = first.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["a1", "b1"].into(), "one event per key, the first");
    ack(
        &app,
        &first.iter().find(|(id, _)| id == "a1").unwrap().1,
        "fail",
    )
    .await;
    ack(
        &app,
        &first.iter().find(|(id, _)| id == "b1").unwrap().1,
        "done",
    )
    .await;
    let next = claim_ids(&app).await;
    assert_eq!(
        next.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["b2"]
    );
    ack(&app, &next[0].1, "done").await;
    assert!(
        claim_ids(&app).await.is_empty(),
        "a2 waits behind the failed a1"
    );
    let view = app.get("/subscriptions/orders").await.body;
    assert_eq!(view["ordered_by"], "/data/customer_id");
    assert_eq!(view["on_failure"], "hold");
    let held = view["held_keys"].as_array().unwrap();
    assert_eq!(held.len(), 1, "{view}");
    assert_eq!(held[0]["key"], "A");
    assert_eq!(held[0]["event_id"], "a1");
    assert_eq!(held[0]["waiting"], 1);

    // Skipping needs the subscription; a claimed state cannot be skipped.
    let r = app.admin_post("/events/shop/a1/skip", None).await;
    r.assert_error(422, "invalid_request");
    let r = app
        .admin_post("/events/shop/a1/skip?subscription=orders", None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let state = &r.body["subscriptions"][0];
    assert_eq!(state["status"], "completed", "{}", r.body);
    assert_eq!(state["outcome"], "skipped", "{}", r.body);
    let history = app.event("shop", "a1").await["history"].to_string();
    assert!(history.contains("skipped by ops"), "{history}");
    let after = claim_ids(&app).await;
    assert_eq!(
        after.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a2"]
    );
    let r = app
        .admin_post("/events/shop/a2/skip?subscription=orders", None)
        .await;
    r.assert_error(409, "conflict");
    ack(&app, &after[0].1, "done").await;
    let view = app.get("/subscriptions/orders").await.body;
    assert_eq!(view["held_keys"], json!([]), "{view}");
    app.stop().await;
}

/// With `on_failure = "skip"`, a failed event lets the later events of its key go on.
async fn on_failure_skip_lets_the_key_go_on(kind: StoreKind) {
    let app = ordered_app(kind, "skip").await;
    for id in ["a1", "a2"] {
        app.deliver("shop", id, &order_body(id, "A", 1)).await;
    }
    let first = claim_ids(&app).await;
    assert_eq!(first.len(), 1);
    ack(&app, &first[0].1, "fail").await;
    let next = claim_ids(&app).await;
    assert_eq!(
        next.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a2"]
    );
    assert!(
        app.get("/subscriptions/orders")
            .await
            .body
            .get("held_keys")
            .is_none()
    );
    app.stop().await;
}

/// A retried event keeps its place: the next event of its key waits for its retry.
async fn a_retry_keeps_its_place_and_keyless_events_wait_for_nothing(kind: StoreKind) {
    let app = ordered_app(kind, "hold").await;
    app.deliver("shop", "a1", &order_body("a1", "A", 1)).await;
    app.deliver("shop", "a2", &order_body("a2", "A", 1)).await;
    let note = json!({"type": "note", "data": {"text": "no key"}}).to_string();
    app.deliver("shop", "n1", &note).await;
    app.deliver("shop", "n2", &note).await;
    let first = claim_ids(&app).await;
    let ids: BTreeSet<_> = first.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["a1", "n1", "n2"].into());
    ack(
        &app,
        &first.iter().find(|(id, _)| id == "a1").unwrap().1,
        "retry",
    )
    .await;
    let again = claim_ids(&app).await;
    assert_eq!(
        again.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a1"]
    );
    ack(&app, &again[0].1, "done").await;
    let last = claim_ids(&app).await;
    assert_eq!(
        last.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a2"]
    );
    app.stop().await;
}

/// An in-process kind keeps the order too: an order its handler refuses holds its customer's
/// later orders until ops skip it.
async fn an_in_process_subscription_holds_a_key_behind_a_failed_event(kind: StoreKind) {
    let app = spawn_app_with_on(
        kind,
        |c| {
            c.push_str(
                "\n[[subscriptions]]\nname = \"points\"\nkind = \"loyalty-credit\"\n\
                 types = [\"order.completed\"]\nordered_by = \"/data/customer_id\"\n",
            )
        },
        BuildOptions::default(),
    )
    .await;
    // No order_id: the credit fails it (permanently), and c1's next order waits.
    let bad = json!({"type": "order.completed", "data": {"customer_id": "c1", "points": 5}});
    app.deliver("shop", "bad", &bad.to_string()).await;
    app.deliver("shop", "good", &order_body("o-good", "c1", 7))
        .await;
    app.deliver("shop", "other", &order_body("o-other", "c2", 3))
        .await;
    app.drain().await;
    assert_eq!(app.balance("c2").await, 3);
    let held = app.get("/subscriptions/points").await.body;
    assert_eq!(held["held_keys"][0]["event_id"], "bad", "{held}");
    assert_eq!(
        app.event("shop", "good").await["subscriptions"][0]["status"],
        "pending"
    );
    let r = app
        .admin_post("/events/shop/bad/skip?subscription=points", None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    app.drain().await;
    assert_eq!(app.balance("c1").await, 7);
    app.stop().await;
}

/// An `http` subscription forwards each key's events in order, at concurrency 8, through an
/// endpoint that fails some calls: the example receiver applied each customer's orders in the
/// order they were stored.
#[tokio::test]
async fn an_http_subscription_forwards_each_key_in_order() {
    use crate::endpoint::{Endpoint, receiver_available};
    if !receiver_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::start(dir.path(), SW_SECRET);
    let url = endpoint.hook_url();
    let app = spawn_app_with(
        move |c| {
            *c = c.replace("workers = 0", "workers = 1");
            c.push_str(&format!(
                "\n[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\nsources = [\"shop\"]\n\
                 url = \"{url}\"\nsigning_secret = \"{SW_SECRET}\"\nconcurrency = 8\n\
                 timeout_ms = 2000\nordered_by = \"/data/customer_id\"\nmax_attempts = 50\n"
            ))
        },
        BuildOptions {
            idle_poll: Some(Duration::from_millis(50)),
            ..BuildOptions::default()
        },
    )
    .await;
    endpoint.set_mode("500", Some(15), None).await;
    for i in 0..60 {
        let body = order_body(&format!("o{i}"), &format!("c{}", i % 4), 1);
        app.deliver("shop", &format!("e{i}"), &body).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = app.get("/subscriptions/billing").await.body["counts"].clone();
        if c["completed"] == 60 {
            break;
        }
        assert!(Instant::now() < deadline, "not delivered: {c}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let receiver = rusqlite::Connection::open(dir.path().join("receiver.db")).unwrap();
    let applied: Vec<(String, String)> = receiver
        .prepare(
            "SELECT p.event_id, c.customer_id FROM processed_events p
               JOIN loyalty_credits c ON c.webhook_id = p.webhook_id ORDER BY p.rowid",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(applied.len(), 60);
    let server = rusqlite::Connection::open(app.dir.path().join("inbox.db")).unwrap();
    let mut last: HashMap<String, i64> = HashMap::new();
    for (id, customer) in applied {
        let seq: i64 = server
            .query_row(
                "SELECT seq FROM event_log WHERE event_id = ?1",
                [&id],
                |r| r.get(0),
            )
            .unwrap();
        let before = last.insert(customer.clone(), seq).unwrap_or(0);
        assert!(
            seq > before,
            "{customer}: {id} (seq {seq}) after seq {before}"
        );
    }
    app.stop().await;
}

/// A failed event holding a key with more waiting events than a claim's first look (its
/// window: the oldest due states) holds back no other key: the claim then looks further.
/// Seen failing with that second look left out (b1 never claimed).
#[tokio::test]
async fn a_long_held_key_does_not_hold_back_the_keys_behind_it() {
    let app = ordered_app(StoreKind::Sqlite, "hold").await;
    for i in 1..=101 {
        let id = format!("a{i}");
        app.deliver("shop", &id, &order_body(&id, "A", 1)).await;
    }
    app.deliver("shop", "b1", &order_body("b1", "B", 1)).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let first = app.claim(json!({"max": 1})).await;
    assert_eq!(first[0]["event_id"], "a1");
    ack(&app, first[0]["token"].as_str().unwrap(), "fail").await;
    let next = app.claim(json!({"max": 1})).await;
    assert_eq!(next.len(), 1, "b1 waits behind a1's held key");
    assert_eq!(next[0]["event_id"], "b1");
    app.stop().await;
}

/// Of the async tests above, those run on both stores (in a module of their own: `store_tests!`
/// above names its modules `sqlite` and `postgres` too).
mod both {
    use super::*;
    use crate::stores::async_store_tests;

    async_store_tests!(
        a_failed_event_holds_its_key_until_skipped,
        on_failure_skip_lets_the_key_go_on,
        a_retry_keeps_its_place_and_keyless_events_wait_for_nothing,
        an_in_process_subscription_holds_a_key_behind_a_failed_event,
    );
}
