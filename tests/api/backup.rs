//! `webhook-inbox backup` (SPEC section 12): the real binary copies the database of a server
//! that keeps ingesting, and the copy is whole.

use std::collections::HashSet;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::helpers::*;

async fn backup(app: &TestApp, args: &[&str]) -> Output {
    let config = app.dir.path().join("backup-test.toml");
    std::fs::write(&config, test_config(&app.dir)).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"));
    command
        .arg("--config")
        .arg(&config)
        .arg("backup")
        .args(args)
        .current_dir(app.dir.path())
        .env_remove("RUST_LOG");
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn integrity(path: &std::path::Path) -> String {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_under_load_passes_integrity_check_and_holds_every_delivery_acknowledged_before_it()
 {
    let app = Arc::new(spawn_app().await);
    let acked = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let running = Arc::new(AtomicBool::new(true));
    // Four senders, each delivering unique events until told to stop (bounded in count).
    let senders: Vec<_> = (0..4)
        .map(|s| {
            let (app, acked, running) =
                (Arc::clone(&app), Arc::clone(&acked), Arc::clone(&running));
            tokio::spawn(async move {
                for i in 0..5_000 {
                    if !running.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = format!("load-{s}-{i}");
                    let r = app.deliver("shop", &id, &order_body(&id, "c-1", 1)).await;
                    assert_eq!(r.status, 200, "{}", r.body);
                    acked.lock().push(id);
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().len() < 200 {
        assert!(Instant::now() < deadline, "ingest too slow");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before: HashSet<String> = acked.lock().iter().cloned().collect();
    let copy = app.dir.path().join("copy.db");
    let o = backup(&app, &[copy.to_str().unwrap()]).await;
    let during = acked.lock().len() - before.len();
    running.store(false, Ordering::SeqCst);
    for s in senders {
        s.await.unwrap();
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("integrity_check: ok"));
    assert!(
        during > 0,
        "the server kept acknowledging during the backup"
    );
    assert_eq!(integrity(&copy), "ok");
    let conn = rusqlite::Connection::open(&copy).unwrap();
    let stored: HashSet<String> = conn
        .prepare("SELECT event_id FROM events JOIN event_payloads USING (seq)")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let missing: Vec<_> = before.difference(&stored).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged before the backup are missing: {missing:?}",
        missing.len()
    );
}

#[tokio::test]
async fn a_backup_refuses_to_overwrite_a_file_unless_forced() {
    let app = spawn_app().await;
    app.deliver("shop", "e1", &order_body("o-1", "c-1", 1))
        .await;
    let copy = app.dir.path().join("copy.db");
    std::fs::write(&copy, b"precious").unwrap();
    let o = backup(&app, &[copy.to_str().unwrap()]).await;
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(std::fs::read(&copy).unwrap(), b"precious");
    let o = backup(&app, &["--force", copy.to_str().unwrap()]).await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(integrity(&copy), "ok");
    let missing = app.dir.path().join("nowhere").join("x.db");
    let o = backup(&app, &[missing.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2), "a directory that does not exist");
}
