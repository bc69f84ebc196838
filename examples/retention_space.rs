//! Figures for docs/lifecycle.md (a measurement, not a test): the database file's size before
//! and after purging most of a large database, with the incremental auto-vacuum every new
//! database gets, and on a database created without it.
//!
//! `cargo run --release --example retention_space`

use std::path::Path;
use std::time::Instant;

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::retention::purge_pass;
use webhook_inbox::store::sqlite::{SqliteOptions, SqliteStore};
use webhook_inbox::store::{PurgeCutoffs, Store};

use sha2::Digest;
use webhook_inbox::store::{EventOrigin, NewDelivery};

fn new_delivery(id: &str, body: &str) -> NewDelivery {
    NewDelivery {
        source: "shop".into(),
        event_id: id.into(),
        event_type: "customer.created".into(),
        payload: body.as_bytes().to_vec(),
        content_type: Some("application/json".into()),
        sha256: sha2::Sha256::digest(body.as_bytes()).into(),
        received_at: now_ms(),
        reject_mismatch: false,
        origin: EventOrigin::Webhook,
        traceparent: None,
    }
}

fn assert_integrity(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}

const EVENTS: usize = 200_000;
const PURGED: usize = 180_000;

fn file_size(conn: &rusqlite::Connection, path: &Path) -> u64 {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    std::fs::metadata(path).unwrap().len()
}

fn measure(legacy: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    if legacy {
        // A database made before this version: no auto-vacuum.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA auto_vacuum = NONE; CREATE TABLE t (a); DROP TABLE t;")
            .unwrap();
    }
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    store.migrate().unwrap();
    let body = format!(
        r#"{{"type":"customer.created","data":"{}"}}"#,
        "x".repeat(1000)
    );
    for chunk in 0..EVENTS / 1000 {
        let batch: Vec<_> = (0..1000)
            .map(|i| new_delivery(&format!("e-{chunk}-{i}"), &body))
            .collect();
        store.insert_deliveries(&batch).unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .unwrap();
    // Completed, each with one attempt; the oldest PURGED completed long ago.
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         UPDATE events SET status = 'completed', outcome = 'logged', next_attempt_at = NULL,
                completed_at = CASE WHEN seq <= {PURGED} THEN 1 ELSE received_at END;
         INSERT INTO event_attempts (event_seq, attempt, worker, started_at, finished_at, result)
         SELECT seq, 1, 'w', received_at, received_at, 'ok' FROM events;
         COMMIT;"
    ))
    .unwrap();
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    let before = file_size(&conn, &path);
    let started = Instant::now();
    let cutoffs = PurgeCutoffs {
        completed_before: Some(2),
        failed_before: None,
    };
    let purged = purge_pass(&store, &cutoffs, now_ms(), 0, &|| false)
        .unwrap()
        .purged;
    let took = started.elapsed();
    assert_eq!(purged, PURGED);
    let after = file_size(&conn, &path);
    let free = store.lifecycle_counts().unwrap().free_bytes;
    println!(
        "auto_vacuum={mode} events={EVENTS} purged={purged} in {took:.1?}: file {:.1} MB -> {:.1} MB \
         ({} KB on the freelist)",
        before as f64 / 1e6,
        after as f64 / 1e6,
        free / 1000
    );
    if legacy {
        drop(store);
        conn.execute_batch("VACUUM").unwrap();
        println!(
            "  after VACUUM (server stopped): {:.1} MB",
            file_size(&conn, &path) as f64 / 1e6
        );
    }
    assert_integrity(&path);
}

fn main() {
    measure(false);
    measure(true);
}
