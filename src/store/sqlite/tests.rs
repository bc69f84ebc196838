//! The SQLite store's own tests: durability (each commit durable in one of two ways, and a
//! commit that wrote nothing making nothing durable), and new connections writing nothing.

use super::{SqliteOptions, SqliteStore};
use crate::store::{EventOrigin, Lane, NewDelivery, Store as _};

/// A stored-shape delivery of `shop` with an empty body (for the store's tests).
pub(super) fn delivery(id: &str) -> NewDelivery {
    NewDelivery {
        source: "shop".into(),
        event_id: id.into(),
        event_type: "order.completed".into(),
        payload: b"{}".to_vec(),
        content_type: None,
        sha256: [0; 32],
        received_at: 1,
        reject_mismatch: false,
        origin: EventOrigin::Webhook,
        traceparent: None,
    }
}

/// A slow disk: a consumer's shared fsync is held, a delivery commits beside it and waits
/// for that fsync, and then, once the consumer's commit is older than [`RECENT_WRITE`] (so
/// that writes take the FULL path), every kind of write that can change nothing runs, and
/// the checkpoint thread and an inline checkpoint run too. None of them may report the
/// delivery durable: it stays unanswered until the held fsync completes. (Seen failing:
/// with every commit marking itself synced at FULL, the first no-op write released it.)
#[test]
fn a_write_that_changes_nothing_makes_nothing_durable_while_the_disk_is_slow() {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use crate::store::{AddDocument, EventFilter, NewDocument, RetryOutcome, SubmitOutcome};

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("inbox.db"), SqliteOptions::default()).unwrap();
    store.migrate().unwrap();
    let store = &store;
    store.insert_deliveries(&[delivery("first")]).unwrap();
    let now = 1_000;
    store.create_request("sent", now).unwrap();
    store.submit_request("sent", now).unwrap();
    let written = || store.sync.last().0;
    let syncing = || store.sync.syncing();
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(5), "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };

    let slow_disk = store.sync.hold.write();
    std::thread::scope(|s| {
        let claim = s.spawn(|| store.claim("w", Lane::InProcess, 10, 60_000, now));
        until("the claim's fsync started", &|| syncing());
        let before = written();
        // A consumer holds its turn while the delivery commits, so that the delivery shares
        // the consumers' fsync however slowly this thread runs.
        let busy = store.consumer_turn.lock();
        let (answered, answer) = mpsc::channel();
        let ingest = s.spawn(move || {
            let outcome = store.insert_deliveries(&[delivery("second")]);
            answered.send(()).unwrap();
            outcome
        });
        until("the delivery committed", &|| written() > before);
        drop(busy);
        std::thread::sleep(super::RECENT_WRITE + Duration::from_millis(10));
        assert!(
            !store.consumers_active(),
            "the next writes take the FULL path"
        );

        let doc = NewDocument {
            id: "d".into(),
            name: "d".into(),
            content_type: "text/plain".into(),
            content: b"x".to_vec(),
        };
        let doc2 = NewDocument {
            id: "d2".into(),
            ..doc.clone()
        };
        let no_frames = store.no_frame_commits.load(Ordering::SeqCst);
        let no_ops = [
            s.spawn(|| {
                matches!(
                    store.submit_request("nope", now),
                    Ok(SubmitOutcome::NotFound)
                )
            }),
            s.spawn(move || {
                matches!(
                    store.add_document("nope", &doc, now),
                    Ok(AddDocument::NotFound)
                )
            }),
            s.spawn(|| {
                matches!(
                    store.retry("shop", "nope", None, false, now),
                    Ok(RetryOutcome::NotFound)
                )
            }),
            s.spawn(|| matches!(store.retry_failed(&EventFilter::default(), now), Ok(0))),
            s.spawn(|| {
                matches!(
                    store.retry("shop", "second", None, false, now),
                    Ok(RetryOutcome::Unchanged(_))
                )
            }),
            s.spawn(move || {
                matches!(
                    store.add_document("sent", &doc2, now),
                    Ok(AddDocument::Submitted)
                )
            }),
        ];
        assert!(store.checkpointer.kick());
        super::checkpoint::inline(&store.writer.lock());
        let start = Instant::now();
        while store.no_frame_commits.load(Ordering::SeqCst) < no_frames + 6 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{} of 6 no-op writes committed without a frame",
                store.no_frame_commits.load(Ordering::SeqCst) - no_frames
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            store.writer_full.load(Ordering::SeqCst),
            "the no-op writes took the FULL path"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            answer.try_recv().is_err(),
            "the delivery was answered before the fsync that covers it ran"
        );
        assert_eq!(written(), before + 1, "the no-op writes took no ticket");

        drop(slow_disk);
        assert_eq!(ingest.join().unwrap().unwrap().len(), 1);
        assert_eq!(claim.join().unwrap().unwrap().len(), 1);
        for no_op in no_ops {
            assert!(no_op.join().unwrap());
        }
    });
}

/// Opening a connection on a database in use commits nothing (seen failing: every new
/// pooled connection wrote page 1 for `auto_vacuum`, taking the write lock and an fsync).
#[test]
fn a_new_connection_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    store.migrate().unwrap();
    store.insert_deliveries(&[delivery("a")]).unwrap();
    let watcher = rusqlite::Connection::open(&path).unwrap();
    let version = || -> i64 {
        watcher
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .unwrap()
    };
    let before = version();
    let mut fresh = rusqlite::Connection::open(&path).unwrap();
    super::init_connection(&mut fresh, super::DEFAULT_WAIT).unwrap();
    assert_eq!(version(), before, "a new connection committed a change");
    let vacuum: i64 = fresh
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(vacuum, 2, "INCREMENTAL");
    // The watcher does see a real commit.
    store.insert_deliveries(&[delivery("b")]).unwrap();
    assert_ne!(version(), before);
}

fn writer_synchronous(store: &SqliteStore) -> i64 {
    store
        .writer
        .lock()
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap()
}

/// Ingest alone is synced by SQLite inside its commit (FULL, no shared fsync); beside a
/// consumer transaction it commits at NORMAL and shares the consumers' fsync.
#[test]
fn ingest_syncs_in_its_commit_alone_and_shares_the_flush_beside_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("inbox.db"), SqliteOptions::default()).unwrap();
    store.migrate().unwrap();
    let before = store.sync.syncs();
    store.insert_deliveries(&[delivery("a")]).unwrap();
    assert_eq!(store.sync.syncs(), before, "SQLite synced it inside COMMIT");
    assert_eq!(writer_synchronous(&store), 2, "FULL");

    let claimed = store.claim("w", Lane::InProcess, 10, 60_000, 2).unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(store.sync.syncs(), before + 1, "the claim's shared fsync");
    assert_eq!(writer_synchronous(&store), 1, "NORMAL");

    store.insert_deliveries(&[delivery("b")]).unwrap();
    assert_eq!(
        store.sync.syncs(),
        before + 2,
        "beside consumers: the shared fsync"
    );
    assert_eq!(writer_synchronous(&store), 1);
}

/// A busy database is unavailable (503, not acknowledged), and the error keeps SQLite's own
/// as its source: the log line of the 503 shows the whole chain, not a flattened copy (the
/// answer's side: `routes::error`'s test).
#[test]
fn an_unavailable_store_keeps_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder
        .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x); BEGIN IMMEDIATE")
        .unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.busy_timeout(std::time::Duration::ZERO).unwrap();
    let refused = other.execute("INSERT INTO t VALUES (1)", []).unwrap_err();
    let err = crate::store::StoreError::from(refused);
    let crate::store::StoreError::Unavailable(why) = &err else {
        panic!("not unavailable: {err}");
    };
    assert!(why.cause().is_some(), "{err}");
    assert!(err.to_string().contains("database is locked"), "{err}");
    let chain = why.chain();
    assert!(
        chain.starts_with("database busy: database is locked"),
        "{chain}"
    );
}
