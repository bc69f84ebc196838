//! Retention's remaining pieces (SPEC section 12): a purged submission takes its request's
//! documents with it; a purge call is bounded and says where to go on; the CLI calls again
//! until the walk is done.

use serde_json::{Value, json};
use webhook_inbox::domain::time::{now_ms, rfc3339};
use webhook_inbox::retention::{self, PAUSE, Walk};
use webhook_inbox::store::PurgeCutoffs;

use crate::cli::{cli, stderr, stdout};
use crate::harness::Harness;
use crate::helpers::*;
use crate::stores::{StoreKind, store_tests};

fn everything() -> Value {
    let t = rfc3339(now_ms() + 60_000);
    json!({"completed_before": t, "failed_before": t})
}

async fn request_with_documents(app: &TestApp, names: &[&str]) -> String {
    let r = app.post("/requests", Some(SUBMIT_TOKEN), None).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    for name in names {
        let doc = json!({"name": name, "content_type": "text/plain", "content": "hello"});
        let r = app
            .post(
                &format!("/requests/{id}/documents"),
                Some(SUBMIT_TOKEN),
                Some(doc),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    id
}

fn documents_of(app: &TestApp, id: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM request_documents WHERE request_id = '{id}'"
    ))
}

async fn completed_events(app: &TestApp, n: usize) {
    for i in 0..n {
        app.deliver(
            "shop",
            &format!("e{i}"),
            &order_body(&format!("o-{i}"), "c-1", 1),
        )
        .await;
    }
    app.drain().await;
}

/// A submission's body is its request's documents: purging its event drops them, and only
/// its; a draft's documents and a queued submission's stay.
#[tokio::test]
async fn a_purged_submission_takes_its_request_documents_with_it() {
    let app = spawn_app().await;
    let done = request_with_documents(&app, &["a.txt", "b.txt"]).await;
    let r = app
        .post(
            &format!("/requests/{done}/submit"),
            Some(SUBMIT_TOKEN),
            None,
        )
        .await;
    assert_eq!(r.body["queued"], true, "{}", r.body);
    app.drain().await;
    let status = app.get(&format!("/requests/{done}")).await.body["event"]["status"].clone();
    assert!(status == "completed" || status == "failed", "{status}");
    // Submitted after the drain: still pending when the purge runs.
    let queued = request_with_documents(&app, &["c.txt"]).await;
    app.post(
        &format!("/requests/{queued}/submit"),
        Some(SUBMIT_TOKEN),
        None,
    )
    .await;
    let draft = request_with_documents(&app, &["d.txt"]).await;
    assert_eq!(documents_of(&app, &done), 2);

    let r = app.admin_post("/events/purge", Some(everything())).await;
    assert_eq!(r.body["purged"], 1, "{}", r.body);

    assert_eq!(
        documents_of(&app, &done),
        0,
        "the purged submission's documents go"
    );
    let r = app.get(&format!("/requests/{done}")).await;
    assert_eq!(r.status, 200, "the request itself stays: {}", r.body);
    assert_eq!(r.body["status"], "submitted");
    assert_eq!(r.body["documents"], json!([]));
    assert_eq!(r.body["event"]["status"], status);
    assert_eq!(app.event("requests", &done).await["purged"], true);
    assert_eq!(
        documents_of(&app, &queued),
        1,
        "a pending submission keeps them"
    );
    assert_eq!(documents_of(&app, &draft), 1, "a draft keeps them");
}

/// `limit` stops a call early with `"more": true` and a cursor; the cursor goes on where the
/// last call stopped (what lies before it is not walked again), so three calls purge seven
/// events exactly once; bad values are 422s naming their field.
#[tokio::test]
async fn a_purge_call_stops_at_its_limit_and_its_cursor_goes_on() {
    let app = spawn_app().await;
    // The oldest event fails; these calls purge completed events only.
    app.deliver("shop", "bad", r#"{"type":"order.completed"}"#)
        .await;
    completed_events(&app, 7).await;
    assert_eq!(app.event("shop", "bad").await["status"], "failed");
    let mut body = json!({"completed_before": rfc3339(now_ms() + 60_000), "limit": 3});
    let mut seen = Vec::new();
    let mut last_cursor = None;
    for _ in 0..5 {
        let r = app.admin_post("/events/purge", Some(body.clone())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        seen.push((r.body["purged"].as_i64().unwrap(), r.body["more"] == true));
        match &r.body["next_cursor"] {
            Value::String(c) => {
                body["cursor"] = json!(c);
                last_cursor = Some(c.clone());
            }
            Value::Null => break,
            other => panic!("next_cursor {other}"),
        }
    }
    assert_eq!(seen, [(3, true), (3, true), (1, false)]);
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE purged_at IS NOT NULL"),
        7
    );
    // From the last cursor, the failed event (before it) is out of reach; from the start not.
    let failed = json!({"failed_before": rfc3339(now_ms() + 60_000)});
    let mut from_cursor = failed.clone();
    from_cursor["cursor"] = json!(last_cursor.unwrap());
    let r = app.admin_post("/events/purge", Some(from_cursor)).await;
    assert_eq!(r.body["purged"], 0, "{}", r.body);
    let r = app.admin_post("/events/purge", Some(failed)).await;
    assert_eq!(r.body["purged"], 1, "{}", r.body);

    // A list cursor is not a purge cursor, nor is any other text.
    app.deliver("shop", "x1", &order_body("o-x1", "c-1", 1))
        .await;
    app.deliver("shop", "x2", &order_body("o-x2", "c-1", 1))
        .await;
    let list_cursor = app.get("/events?limit=1").await.body["next_cursor"].clone();
    assert!(list_cursor.is_string(), "{list_cursor}");
    for (bad, field) in [
        (json!({"cursor": list_cursor}), "cursor"),
        (json!({"cursor": "not-a-cursor"}), "cursor"),
        (json!({"cursor": 12}), "cursor"),
        (json!({"limit": 0}), "limit"),
        (json!({"limit": -1}), "limit"),
        (json!({"limit": "3"}), "limit"),
    ] {
        let r = app.admin_post("/events/purge", Some(bad.clone())).await;
        r.assert_error(422, "invalid_request");
        let message = r.body["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{bad}: {message}");
    }
}

/// A walk asked to stop stops after one batch, and names where the next one starts: what
/// bounds a route call in time (`CALL_BUDGET`) without waiting that long in a test.
#[tokio::test]
async fn a_walk_told_to_stop_ends_after_one_batch_and_resumes_where_it_stopped() {
    let app = spawn_app().await;
    let n = retention::BATCH + 20;
    completed_events(&app, n).await;
    let cutoffs = PurgeCutoffs {
        completed_before: Some(now_ms() + 60_000),
        failed_before: None,
    };
    let store = app.store.clone();
    let (first, second) = tokio::task::spawn_blocking(move || {
        let mut walk = Walk {
            after: 0,
            limit: None,
            pause: PAUSE,
            settle: false,
        };
        let first =
            retention::purge_walk(store.as_ref(), &cutoffs, now_ms(), &walk, &|| true).unwrap();
        walk.after = first.resume_after.expect("stopped before the end");
        let second =
            retention::purge_walk(store.as_ref(), &cutoffs, now_ms(), &walk, &|| false).unwrap();
        (first, second)
    })
    .await
    .unwrap();
    assert_eq!(first.purged, retention::BATCH);
    assert_eq!((second.purged, second.resume_after), (20, None));
}

/// The real binary: `events purge` calls again while the server says `more`, printing
/// progress, and completes a purge larger than one call.
#[tokio::test]
async fn events_purge_calls_again_until_the_walk_is_done() {
    let app = spawn_app().await;
    completed_events(&app, 5).await;
    let o = cli(
        &app,
        &[
            "events",
            "purge",
            "--completed-before",
            "0s",
            "--per-call",
            "2",
            "--json",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let answer: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(answer, json!({"purged": 5, "calls": 3}));
    assert!(
        stderr(&o).contains("purged 4 events so far (2 calls)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE purged_at IS NOT NULL"),
        5
    );
    let o = cli(&app, &["events", "purge", "--per-call", "0"]).await;
    assert_eq!(o.status.code(), Some(2), "a usage error: {}", stderr(&o));
}

/// A walk stops at the first window of events received after the cutoffs: none of them can be
/// due (an event is finished after it is received), so it reads no further. Before, a walk with
/// nothing to purge read the whole log every ten minutes, and the WAL could not restart while
/// it did (seen in the soak: 600 MB of WAL and a minute of lag at 3.5 million events).
fn a_walk_stops_at_the_first_window_received_after_the_cutoffs(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    // More than a window (2,000 events) of fresh deliveries, finished.
    let ids: Vec<String> = (0..2_500).map(|i| format!("w{i}")).collect();
    let deliveries: Vec<_> = ids
        .iter()
        .map(|id| {
            (
                "shop",
                id.as_str(),
                "audit.note",
                r#"{"type":"audit.note"}"#.to_string(),
            )
        })
        .collect();
    h.insert(&deliveries);
    h.drain();
    let hour_ago = now_ms() - 3_600_000;
    let old = PurgeCutoffs {
        completed_before: Some(hour_ago),
        failed_before: Some(hour_ago),
    };
    let batch = h.store.purge_batch(&old, 0, 100, now_ms()).unwrap();
    assert_eq!((batch.purged, batch.next_after), (0, None));
    // Cutoffs after them: the walk reads on, window after window, and purges them all.
    let later = now_ms() + 60_000;
    let all = PurgeCutoffs {
        completed_before: Some(later),
        failed_before: Some(later),
    };
    let (mut after, mut purged, mut batches) = (0, 0, 0);
    for _ in 0..100 {
        let batch = h.store.purge_batch(&all, after, 1_000, now_ms()).unwrap();
        (purged, batches) = (purged + batch.purged, batches + 1);
        match batch.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(purged, 2_500);
    assert!(batches >= 3, "{batches} batches");
}

/// The background walk starts after the tombstones the walk before it found first, and never
/// after an event that can still change: walk 1 stops settling at a failed event it keeps (no
/// failed cutoff), walk 2, from there, purges it once its cutoff says so. Seen failing on both
/// stores with `tombstones_through` answering yes whatever the bodies (walk 1 settled up to
/// 5,001, past the failed event at 2,501).
fn a_walk_starts_after_the_tombstones_before_it_and_never_past_a_live_event(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let audit = |i: usize| {
        (
            "shop",
            format!("w{i}"),
            "audit.note",
            r#"{"type":"audit.note"}"#.to_string(),
        )
    };
    // Three batches, so that the failed event sits in the middle on both stores (PostgreSQL
    // numbers a batch's rows in key order).
    let batches: [Vec<_>; 3] = [
        (0..2_500).map(audit).collect(),
        // No order in it: the loyalty credit fails it for good.
        vec![(
            "shop",
            "bad".into(),
            "order.completed",
            r#"{"type":"order.completed"}"#.into(),
        )],
        (2_500..5_000).map(audit).collect(),
    ];
    for batch in &batches {
        let refs: Vec<_> = batch
            .iter()
            .map(|(s, id, t, b)| (*s, id.as_str(), *t, b.clone()))
            .collect();
        h.insert(&refs);
    }
    h.drain();
    let bad = h.count("SELECT seq FROM event_log WHERE event_id = 'bad'");
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE status = 'failed'"),
        1
    );
    let later = now_ms() + 60_000;
    let completed_only = PurgeCutoffs {
        completed_before: Some(later),
        failed_before: None,
    };
    let first =
        retention::purge_pass(h.store.as_ref(), &completed_only, now_ms(), 0, &|| false).unwrap();
    assert_eq!(first.purged, 5_000);
    assert!(
        first.tombstones_through < bad
            && first.tombstones_through >= bad - 2 * retention::BATCH as i64,
        "walk 1 settles up to the batch before the failed event ({bad}): {}",
        first.tombstones_through
    );
    let again = retention::purge_pass(
        h.store.as_ref(),
        &completed_only,
        now_ms(),
        first.tombstones_through,
        &|| false,
    )
    .unwrap();
    assert_eq!(
        (again.purged, again.tombstones_through),
        (0, first.tombstones_through)
    );
    let everything = PurgeCutoffs {
        completed_before: Some(later),
        failed_before: Some(later),
    };
    let second = retention::purge_pass(
        h.store.as_ref(),
        &everything,
        now_ms(),
        first.tombstones_through,
        &|| false,
    )
    .unwrap();
    assert_eq!(
        second.purged, 1,
        "the failed event, behind the start of walk 1's settled part"
    );
    assert!(
        second.tombstones_through > bad,
        "settled past it now: {}",
        second.tombstones_through
    );
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE purged_at IS NULL"),
        0
    );
}

store_tests!(
    a_walk_stops_at_the_first_window_received_after_the_cutoffs,
    a_walk_starts_after_the_tombstones_before_it_and_never_past_a_live_event,
);
