//! Retention (SPEC section 12): purged events keep a tombstone that deduplicates redeliveries
//! forever; pending and claimed events are never touched; the purge races ingest, consumers and
//! a redelivery of the very event it purges.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::Digest;
use tokio::sync::Barrier;
use webhook_inbox::domain::time::{now_ms, rfc3339};
use webhook_inbox::startup::BuildOptions;
use webhook_inbox::store::Lane;

use crate::helpers::*;

/// A purge of everything terminal: both cutoffs a minute from now.
fn everything() -> Value {
    let t = rfc3339(now_ms() + 60_000);
    json!({"completed_before": t, "failed_before": t})
}

async fn purge(app: &TestApp, body: Value) -> i64 {
    let r = app.admin_post("/events/purge", Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["purged"].as_i64().unwrap()
}

fn ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_purge_keeps_tombstones_of_terminal_events_and_never_touches_pending_or_claimed() {
    let app = spawn_app().await;
    let credited = order_body("o-1", "c-1", 10);
    app.deliver("shop", "done", &credited).await;
    app.deliver("shop", "bad", r#"{"type":"order.completed"}"#)
        .await;
    app.drain().await;
    app.deliver("shop", "waiting", &order_body("o-2", "c-1", 5))
        .await;
    app.deliver("shop", "held", &order_body("o-3", "c-1", 7))
        .await;
    // `held` is claimed (a long lease) and `waiting` stays pending, both through the purge.
    let claimed = app
        .store
        .claim("test", Lane::InProcess, 1, 60_000, now_ms())
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let held = claimed[0].claim.event_id.clone();

    assert_eq!(purge(&app, everything()).await, 2);

    let done = app.event("shop", "done").await;
    assert_eq!(done["purged"], true, "{done}");
    assert_eq!(done["status"], "completed");
    assert_eq!(done["outcome"], "credited");
    assert_eq!(done["payload"], Value::Null);
    assert_eq!(done["history"], json!([]));
    assert_eq!(
        done["payload_sha256"],
        hex::encode(sha2::Sha256::digest(credited.as_bytes()))
    );
    assert_eq!(done["finished_at"], done["completed_at"]);
    assert!(done["purged_at"].is_string() && done["received_at"].is_string());
    let bad = app.event("shop", "bad").await;
    assert_eq!(
        (bad["purged"].clone(), bad["status"].clone()),
        (json!(true), json!("failed"))
    );
    assert!(bad["finished_at"].is_string(), "{bad}");
    assert_eq!(bad["last_error"], "missing order_id");

    for id in ["waiting", "held"] {
        let e = app.event("shop", id).await;
        assert_eq!(e["purged"], false, "{e}");
        assert!(e["payload"].is_object(), "{id} keeps its body: {e}");
    }
    assert_eq!(app.event("shop", &held).await["status"], "claimed");
    // Bodies and history are gone from the database, guard rows and balances are not.
    assert_eq!(app.count("SELECT count(*) FROM event_payloads"), 2);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM event_attempts JOIN events ON seq = event_seq
              WHERE purged_at IS NOT NULL"
        ),
        0
    );
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 1);
    assert_eq!(app.count("SELECT count(*) FROM loyalty_credits"), 1);
    assert_eq!(app.balance("c-1").await, 10);

    // Lists leave tombstones out unless asked for them.
    assert_eq!(ids(&app.get("/events").await.body), ["held", "waiting"]);
    assert_eq!(
        ids(&app.get("/events?status=completed").await.body),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(&app.get("/events?status=purged").await.body),
        ["bad", "done"]
    );
    let metrics = app.metrics_text().await;
    assert!(metrics.contains("webhook_inbox_tombstones 2"), "{metrics}");
    assert!(
        metrics.contains("webhook_inbox_purged_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("webhook_inbox_database_bytes{pages=\"used\"}"),
        "{metrics}"
    );

    // A second purge finds nothing more.
    assert_eq!(purge(&app, everything()).await, 0);
}

#[tokio::test]
async fn a_purged_events_redelivery_is_a_duplicate_flagged_when_the_body_differs_and_never_runs() {
    let app = spawn_app().await;
    let body = order_body("o-1", "c-1", 10);
    app.deliver("shop", "e1", &body).await;
    app.deliver("shop", "f1", r#"{"type":"order.completed"}"#)
        .await;
    app.drain().await;
    assert_eq!(purge(&app, everything()).await, 2);

    let same = app.deliver("shop", "e1", &body).await;
    assert_eq!(same.status, 200);
    assert_eq!(same.body["status"], "duplicate");
    assert_eq!(same.body["queued"], false);
    assert!(same.body.get("payload_mismatch").is_none(), "{}", same.body);
    let other = app
        .deliver("shop", "e1", &order_body("o-1", "c-1", 99))
        .await;
    assert_eq!(other.body["status"], "duplicate");
    assert_eq!(other.body["payload_mismatch"], true, "{}", other.body);
    let strict = app.deliver("strict", "s1", &body).await;
    assert_eq!(strict.body["status"], "queued");

    assert_eq!(app.drain().await, 1, "only the new strict event runs");
    assert_eq!(app.balance("c-1").await, 10, "credited once");
    let e1 = app.event("shop", "e1").await;
    assert_eq!(
        (e1["deliveries"].clone(), e1["payload_mismatches"].clone()),
        (json!(3), json!(1))
    );
    assert_eq!(e1["purged"], true);

    // A tombstone can never run again: not retried, forced or not, nor in bulk.
    for path in [
        "/events/shop/e1/retry",
        "/events/shop/e1/retry?force=true",
        "/events/shop/f1/retry?force=true",
    ] {
        app.admin_post(path, None)
            .await
            .assert_error(409, "conflict");
    }
    let bulk = app.admin_post("/events/retry", Some(json!({}))).await;
    assert_eq!(bulk.body["retried"], 0, "{}", bulk.body);
    assert_eq!(app.drain().await, 0);
    // And the database itself refuses to make one pending.
    let conn = rusqlite::Connection::open(app.dir.path().join("inbox.db")).unwrap();
    let revived = conn.execute(
        "UPDATE event_state SET status = 'pending', next_attempt_at = 0
          WHERE seq = (SELECT seq FROM event_log WHERE event_id = 'f1')",
        [],
    );
    assert!(revived.is_err(), "the CHECK keeps a tombstone terminal");
}

/// A purge released with a redelivery of the same event, many times, while fresh deliveries
/// are ingested and consumers drain them: every redelivery is a duplicate (the tombstone or the
/// live row answers, whichever committed first), no order is credited twice, and no event is
/// purged before it is terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_racing_a_redelivery_under_ingest_and_consumers_loses_nothing() {
    let app = Arc::new(spawn_app().await);
    const ROUNDS: usize = 15;
    const FRESH: usize = 120;
    // Fresh orders, ingested throughout (each credits 1 point to c-fresh).
    let ingest = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            for i in 0..FRESH {
                let r = app
                    .deliver(
                        "shop",
                        &format!("fresh-{i}"),
                        &order_body(&format!("of-{i}"), "c-fresh", 1),
                    )
                    .await;
                assert_eq!(r.body["status"], "queued", "{}", r.body);
            }
        })
    };
    // Consumers, draining throughout.
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let consumer = {
        let (consumer, draining) = (Arc::clone(&app.consumer), Arc::clone(&draining));
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while draining.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                if consumer.run_once("racer", 16, &|| false).unwrap() == 0 {
                    // Nothing due: yield the core to the racing tasks a moment.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        })
    };
    for round in 0..ROUNDS {
        let id = format!("race-{round}");
        let body = order_body(&format!("or-{round}"), "c-race", 1);
        app.deliver("shop", &id, &body).await;
        // Bounded wait until the consumers finished it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while app.event("shop", &id).await["status"] != "completed" {
            assert!(Instant::now() < deadline, "{id} never completed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let barrier = Arc::new(Barrier::new(2));
        let purger = {
            let (app, barrier) = (Arc::clone(&app), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                purge(&app, json!({"completed_before": rfc3339(now_ms() + 1)})).await
            })
        };
        let redelivery = {
            let (app, barrier, id, body) = (
                Arc::clone(&app),
                Arc::clone(&barrier),
                id.clone(),
                body.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                app.deliver("shop", &id, &body).await
            })
        };
        let (purged, again) = (purger.await.unwrap(), redelivery.await.unwrap());
        assert!(purged >= 1, "round {round}: the raced event is purged");
        assert_eq!(again.status, 200);
        assert_eq!(
            again.body["status"], "duplicate",
            "round {round}: {}",
            again.body
        );
        let e = app.event("shop", &id).await;
        assert_eq!(
            (e["purged"].clone(), e["deliveries"].clone()),
            (json!(true), json!(2)),
            "{e}"
        );
    }
    ingest.await.unwrap();
    // Let the consumers finish the fresh events, then stop them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.count("SELECT count(*) FROM events WHERE status IN ('pending', 'claimed')") > 0 {
        assert!(Instant::now() < deadline, "fresh events never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    draining.store(false, std::sync::atomic::Ordering::SeqCst);
    consumer.await.unwrap();
    purge(&app, everything()).await;
    assert_eq!(app.drain().await, 0, "no tombstone is ever claimed");
    assert_eq!(app.balance("c-race").await, ROUNDS as i64);
    assert_eq!(
        app.balance("c-fresh").await,
        FRESH as i64,
        "every fresh order credited once"
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM events WHERE purged_at IS NOT NULL AND status = 'completed'"
        ),
        (ROUNDS + FRESH) as i64
    );
    assert_eq!(app.count("SELECT count(*) FROM event_payloads"), 0);
}

#[tokio::test]
async fn tombstones_survive_a_restart() {
    let app = spawn_app().await;
    let body = order_body("o-1", "c-1", 10);
    app.deliver("shop", "e1", &body).await;
    app.drain().await;
    assert_eq!(purge(&app, everything()).await, 1);
    let before = app.event("shop", "e1").await;
    let config = test_config(&app.dir);
    let dir = app.stop().await;

    let app = spawn_in(dir, &config, BuildOptions::default()).await;
    assert_eq!(app.event("shop", "e1").await, before);
    assert_eq!(ids(&app.get("/events?status=purged").await.body), ["e1"]);
    let again = app.deliver("shop", "e1", &body).await;
    assert_eq!(again.body["status"], "duplicate", "{}", again.body);
    assert_eq!(app.drain().await, 0);
    assert_eq!(app.balance("c-1").await, 10);
}

#[tokio::test]
async fn the_purge_route_refuses_a_bad_time_with_422_naming_the_field() {
    let app = spawn_app().await;
    for (body, field) in [
        (json!({"completed_before": "yesterday"}), "completed_before"),
        (
            json!({"failed_before": "2026-13-01T00:00:00Z"}),
            "failed_before",
        ),
        (json!({"failed_before": 1700000000}), "failed_before"),
        (
            json!({"completed_after": "2026-01-01T00:00:00Z"}),
            "completed_after",
        ),
    ] {
        let r = app.admin_post("/events/purge", Some(body.clone())).await;
        r.assert_error(422, "invalid_request");
        assert!(
            r.body["message"].as_str().unwrap().starts_with(field),
            "{body}: {}",
            r.body
        );
    }
    let r = app
        .client
        .post(app.url("/events/purge"))
        .bearer_auth(ADMIN_TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    app.post("/events/purge", None, Some(json!({})))
        .await
        .assert_error(401, "unauthorized");
    // No body: the [retention] ages, under which nothing fresh is old enough.
    app.deliver("shop", "e1", &order_body("o-1", "c-1", 1))
        .await;
    app.drain().await;
    let r = app.admin_post("/events/purge", None).await;
    assert_eq!(
        (r.status, r.body["purged"].clone()),
        (200, json!(0)),
        "{}",
        r.body
    );
}

/// The background purge applies `[retention]`: an event completed two days ago goes with
/// `completed_days = 1`; a fresh one stays; failed events stay with `failed_days = 0`.
#[tokio::test]
async fn the_background_purge_follows_the_retention_ages() {
    let options = BuildOptions {
        purge_every: Some(Duration::from_millis(50)),
        ..Default::default()
    };
    let app = spawn_app_with(
        |c| c.push_str("\n[retention]\ncompleted_days = 1\nfailed_days = 0\n"),
        options,
    )
    .await;
    app.deliver("shop", "old", &order_body("o-1", "c-1", 1))
        .await;
    app.deliver("shop", "new", &order_body("o-2", "c-1", 1))
        .await;
    app.deliver("shop", "failed", r#"{"type":"order.completed"}"#)
        .await;
    app.drain().await;
    let two_days_ago = now_ms() - 2 * 86_400_000;
    let conn = rusqlite::Connection::open(app.dir.path().join("inbox.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    // Received two days ago too: an event is finished after it is received.
    conn.execute(
        "UPDATE event_log SET received_at = ?1, last_delivered_at = ?1
          WHERE event_id IN ('old', 'failed')",
        [two_days_ago],
    )
    .unwrap();
    conn.execute(
        "UPDATE event_state SET completed_at = ?1
          WHERE seq = (SELECT seq FROM event_log WHERE event_id = 'old')",
        [two_days_ago],
    )
    .unwrap();
    conn.execute(
        "UPDATE event_attempts SET finished_at = ?1
          WHERE event_seq = (SELECT seq FROM events WHERE event_id = 'failed')",
        [two_days_ago],
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.event("shop", "old").await["purged"] != true {
        assert!(Instant::now() < deadline, "the background purge never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(app.event("shop", "new").await["purged"], false);
    assert_eq!(app.event("shop", "failed").await["purged"], false);
    assert_eq!(
        app.event("shop", "old").await["finished_at"],
        rfc3339(two_days_ago)
    );
}
