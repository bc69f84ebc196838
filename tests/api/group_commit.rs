//! Correctness of the group commit: concurrent duplicates that share a batch get the right
//! answers, and a failed commit answers 503 to every delivery of its batch and stores none.

use std::sync::Arc;

use tokio::sync::Notify;
use webhook_inbox::ingest::{IngestOptions, Ingestor};
use webhook_inbox::store::{InsertOutcome, Readiness, Store, StoreError};

use crate::helpers::*;
use crate::stores::{StoreKind, store_tests};

fn duplicates_inside_one_batch_are_answered_in_order(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let a = order_body("o-1", "c-1", 1);
    let outcomes = h.insert(&[
        ("shop", "a", "t", a.clone()),
        ("shop", "a", "t", a.clone()),
        ("shop", "b", "t", a.clone()),
        ("shop", "a", "t", order_body("o-1", "c-1", 2)),
        ("other", "a", "t", a.clone()),
    ]);
    assert_eq!(
        outcomes,
        [
            InsertOutcome::Queued,
            InsertOutcome::Duplicate,
            InsertOutcome::Queued,
            InsertOutcome::Mismatch,
            InsertOutcome::Queued
        ]
    );
    assert_eq!(h.count("SELECT count(*) FROM events"), 3);
    assert_eq!(
        h.count("SELECT deliveries FROM events WHERE source = 'shop' AND event_id = 'a'"),
        3
    );
}

/// A batch as large as the writer takes (256), with repeats of earlier keys of the batch, of a
/// key stored by an earlier batch, and a differing body, spread over it: the SQLite store
/// writes such a batch with multi-row inserts of up to 64 rows, and a repeat may share its
/// statement with the delivery it repeats, or land on either side of a statement's edge.
fn a_full_batch_with_repeats_anywhere_is_answered_delivery_by_delivery(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    assert_eq!(
        h.insert(&[("shop", "old", "t", "{\"v\":0}".into())]),
        [InsertOutcome::Queued]
    );
    let mut batch = Vec::new();
    let mut expected = Vec::new();
    for i in 0..256_usize {
        let (id, body, outcome) = match i {
            // the stored key from the earlier batch
            0 | 63 | 64 | 200 => (
                "old".to_string(),
                "{\"v\":0}".to_string(),
                InsertOutcome::Duplicate,
            ),
            // a repeat of this batch's first new key, inside and across statements
            2 | 65 | 128 | 255 => ("k-1".into(), "{\"v\":1}".into(), InsertOutcome::Duplicate),
            // the same key with another body
            130 => ("k-1".into(), "{\"v\":2}".into(), InsertOutcome::Mismatch),
            _ => (
                format!("k-{i}"),
                format!("{{\"v\":{i}}}"),
                InsertOutcome::Queued,
            ),
        };
        batch.push(new_delivery("shop", &id, "t", &body));
        expected.push(outcome);
    }
    assert_eq!(h.store.insert_deliveries(&batch).unwrap(), expected);
    let new = expected
        .iter()
        .filter(|o| **o == InsertOutcome::Queued)
        .count() as i64;
    assert_eq!(new, 247);
    assert_eq!(h.count("SELECT count(*) FROM events"), 1 + new);
    assert_eq!(h.count("SELECT count(*) FROM event_payloads"), 1 + new);
    // Every new event has its own body.
    for i in [3_usize, 62, 66, 127, 129, 131, 254] {
        let detail = h.detail("shop", &format!("k-{i}"));
        assert_eq!(
            detail.payload,
            format!("{{\"v\":{i}}}").into_bytes(),
            "k-{i}"
        );
        assert_eq!(detail.event.deliveries, 1, "k-{i}");
    }
    // SQLite numbers a batch's events itself, in the batch's order (PostgreSQL's sequence
    // promises commit order only between batches).
    if kind == StoreKind::Sqlite {
        assert_eq!(
            h.count(
                "SELECT count(*) FROM events a JOIN events b
                   ON a.event_id = 'k-3' AND b.event_id = 'k-254' AND a.seq < b.seq"
            ),
            1
        );
    }
    let old = h.detail("shop", "old");
    assert_eq!(
        (old.event.deliveries, old.payload),
        (5, b"{\"v\":0}".to_vec())
    );
    let first = h.detail("shop", "k-1");
    assert_eq!(first.event.deliveries, 6);
    assert_eq!(first.event.payload_mismatches, 1);
    assert_eq!(first.payload, b"{\"v\":1}".to_vec());
    // The queue counts each new event once: all of them drain.
    assert_eq!(h.drain(), 1 + new as usize);
}

fn concurrent_identical_deliveries_through_the_writer_get_one_queued(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(identical_deliveries_through_the_writer(&h));
    assert_eq!(h.count("SELECT sum(deliveries) FROM events"), 64);
}

async fn identical_deliveries_through_the_writer(h: &Harness) {
    let store: Arc<dyn Store> = h.store.clone();
    let ingest = Ingestor::start(store, IngestOptions::default(), Arc::new(Notify::new()));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (ingest, barrier) = (ingest.clone(), barrier.clone());
            tokio::spawn(async move {
                // Half send one key, half another, all at once: they share batches.
                let id = if i % 2 == 0 { "even" } else { "odd" };
                barrier.wait().await;
                ingest
                    .ingest(new_delivery("shop", id, "t", "{}"))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let queued = outcomes
        .iter()
        .filter(|o| **o == InsertOutcome::Queued)
        .count();
    let duplicate = outcomes
        .iter()
        .filter(|o| **o == InsertOutcome::Duplicate)
        .count();
    assert_eq!((queued, duplicate), (2, 62));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_the_wait_answers_503_to_every_waiting_delivery_and_stores_none() {
    let app = spawn_app().await;
    let lock = rusqlite::Connection::open(app.dir.path().join("inbox.db")).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut tasks = Vec::new();
    for i in 0..24 {
        let client = app.client.clone();
        let url = app.url("/webhooks/shop");
        let body = order_body(&format!("o-{i}"), "c", 1);
        let headers = sign_for(
            &app.settings,
            "shop",
            &format!("batch-{i}"),
            body.as_bytes(),
        );
        tasks.push(tokio::spawn(async move {
            let mut req = client.post(url).body(body);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let r = req.send().await.unwrap();
            let retry_after = r.headers().get("retry-after").is_some();
            let body: serde_json::Value = r.json().await.unwrap();
            (
                body["error"].as_str().unwrap_or("").to_string(),
                retry_after,
            )
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    lock.execute_batch("ROLLBACK").unwrap();
    assert!(
        answers.iter().all(|(e, ra)| e == "unavailable" && *ra),
        "{answers:?}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events"),
        0,
        "nothing of the failed batches is stored"
    );
    // The same deliveries, retried by the provider, now succeed.
    for i in 0..24 {
        let r = app
            .deliver(
                "shop",
                &format!("batch-{i}"),
                &order_body(&format!("o-{i}"), "c", 1),
            )
            .await;
        assert_eq!(r.body["status"], "queued");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once_instead_of_waiting() {
    let h = Harness::new(5, 30);
    let store: Arc<dyn Store> = h.store.clone();
    let options = IngestOptions {
        queue: 2,
        ..IngestOptions::default()
    };
    let ingest = Ingestor::start(store, options, Arc::new(Notify::new()));
    // Another connection holds the write lock: the writer blocks on its first batch.
    let lock = rusqlite::Connection::open(h.dir.path().join("inbox.db")).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut waiting = Vec::new();
    for i in 0..3 {
        let ingest = ingest.clone();
        waiting.push(tokio::spawn(async move {
            ingest
                .ingest(new_delivery("shop", &format!("q{i}"), "t", "{}"))
                .await
        }));
        // Let the writer take the first one before the queue fills.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // QueueFull comes only from the non-blocking send: the delivery did not wait.
    let refused = ingest
        .ingest(new_delivery("shop", "q-last", "t", "{}"))
        .await;
    assert!(
        matches!(refused, Err(webhook_inbox::ingest::IngestError::QueueFull)),
        "{refused:?}"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    for w in waiting {
        // Each of those either committed after the lock went or was answered 503; none hangs.
        let _ = w.await.unwrap();
    }
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE event_id = 'q-last'"),
        0
    );
}

#[test]
fn a_wal_that_cannot_be_made_durable_refuses_every_later_write() {
    let mut h = Harness::new(5, 30);
    h.check_integrity = false;
    h.insert(&[("shop", "a", "t", "{}".into())]);
    // The WAL file vanishes under the live store (an operator's `rm`): an fsync can no longer
    // reach what SQLite writes, so nothing may be acknowledged from now on.
    std::fs::remove_file(h.dir.path().join("inbox.db-wal")).unwrap();
    let unsynced = h
        .store
        .insert_deliveries(&[new_delivery("shop", "b", "t", "{}")]);
    assert!(
        matches!(unsynced, Err(StoreError::Unavailable(_))),
        "{unsynced:?}"
    );
    assert_eq!(
        h.store.ready().unwrap(),
        Readiness::NotDurable,
        "readiness reports it"
    );
    let refused = h
        .store
        .insert_deliveries(&[new_delivery("shop", "c", "t", "{}")]);
    assert!(matches!(refused, Err(StoreError::Unavailable(_))));
    assert!(
        h.store.event("shop", "c").unwrap().is_none(),
        "a poisoned store writes nothing"
    );
    // "b" was answered 503: its commit went into a WAL that no longer exists on disk, so
    // whether it survives a restart depends on what SQLite checkpoints from the dead file when
    // the last connection closes (seen both ways). That is why a 503 promises only "not
    // acknowledged": the provider retries, and a "b" that survived is then a `duplicate`.
}

/// A 503 goes to unauthenticated senders: it says what to do, never the store's error chain
/// (here it would name the WAL file's absolute path), and it promises only "not acknowledged".
#[tokio::test]
async fn a_503_names_no_internal_detail() {
    let app = spawn_app().await;
    let dir = app.dir.path().display().to_string();
    std::fs::remove_file(app.dir.path().join("inbox.db-wal")).unwrap();
    let r = app.deliver("shop", "evt-1", "{}").await;
    r.assert_error(503, "unavailable");
    assert!(r.headers.get("retry-after").is_some());
    let message = r.body["message"].as_str().unwrap();
    assert!(!message.contains(&dir), "{message}");
    assert!(!message.contains("wal"), "{message}");
    assert!(message.contains("not acknowledged"), "{message}");
    let ready = app.get("/readyz").await;
    ready.assert_error(503, "unavailable");
    let reason = ready.body["message"].as_str().unwrap();
    assert!(reason.contains("could not be made durable"), "{reason}");
    assert!(!reason.contains("migrations"), "{reason}");
}

store_tests!(
    duplicates_inside_one_batch_are_answered_in_order,
    a_full_batch_with_repeats_anywhere_is_answered_delivery_by_delivery,
    concurrent_identical_deliveries_through_the_writer_get_one_queued,
);

/// A commit that does not finish (another connection holds the write lock for longer than the
/// store waits for it): the writer's watchdog answers 503 by each delivery's deadline plus the
/// backstop, to the delivery in that commit and to those queued behind it, with no timer of
/// their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_does_not_finish_is_answered_503_within_the_backstop() {
    use std::time::{Duration, Instant};
    use webhook_inbox::ingest::IngestError;
    use webhook_inbox::store::sqlite::{SqliteOptions, SqliteStore};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let options = SqliteOptions {
        wait: Duration::from_secs(3),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(&path, options).unwrap();
    store.migrate().unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let options = IngestOptions {
        wait: Duration::from_millis(200),
        backstop: Duration::from_millis(300),
        ..IngestOptions::default()
    };
    let ingest = Ingestor::start(store, options, Arc::new(Notify::new()));
    let lock = rusqlite::Connection::open(&path).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let mut answers = vec![tokio::spawn(
        ingest.ingest(new_delivery("shop", "w0", "t", "{}")),
    )];
    // Let the writer start its commit of the first; these queue behind it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 1..4 {
        answers.push(tokio::spawn(ingest.ingest(new_delivery(
            "shop",
            &format!("w{i}"),
            "t",
            "{}",
        ))));
    }
    for answer in answers {
        let answer = answer.await.unwrap();
        assert!(matches!(answer, Err(IngestError::Timeout)), "{answer:?}");
    }
    // 200 ms of wait and 300 of backstop, not the store's 3 s.
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_500),
        "answered after {took:?}"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    // The commit answered 503 lands once the lock is gone (a 503 is only "not acknowledged"):
    // the provider's retry is a duplicate. Until the writer notices the lock has gone, the
    // watchdog answers 503 at once; the ones queued behind the commit were never written.
    let mut retry = Err(IngestError::Timeout);
    for _ in 0..100 {
        retry = ingest.ingest(new_delivery("shop", "w0", "t", "{}")).await;
        if !matches!(retry, Err(IngestError::Timeout)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(retry.unwrap(), InsertOutcome::Duplicate);
    let later = ingest.ingest(new_delivery("shop", "w1", "t", "{}")).await;
    assert_eq!(later.unwrap(), InsertOutcome::Queued);
}
