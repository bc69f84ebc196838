//! A disk that the service fills itself, under sustained load (issue 42), with the real binary
//! on a small tmpfs: eight senders deliver without pause while the consumers drain and the
//! checkpoints copy the WAL into the database file, until the disk is full. Every answer is a
//! 200 or a 503 with `Retry-After`, none slower than the client's timeout; once ops free some
//! space the service takes deliveries again without a restart; and with the server stopped,
//! every acknowledged delivery is in the file and the integrity check passes.

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::faults::{SmallFs, serve_on_with};
use crate::process::send_signed;

/// What one sender saw.
#[derive(Default)]
struct Seen {
    acknowledged: Vec<String>,
    refused: usize,
    slowest: Duration,
    other: Vec<String>,
}

#[test]
fn sustained_ingest_that_fills_the_disk_answers_503_and_recovers_with_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let Some(small) = SmallFs::mount_or_skip(&dir.path().join("db"), "12m") else {
        return;
    };
    // Space ops can free later: the service fills the rest by itself.
    let ballast = small.0.join("ballast");
    std::fs::write(&ballast, vec![0u8; 2 * 1024 * 1024]).unwrap();
    let (mut server, settings, _) = serve_on_with(dir.path(), &small.0, "", "workers = 2\n");
    let base = server.base.clone();
    let body = |i: usize| {
        format!(
            r#"{{"type":"audit.note","n":{i},"pad":"{}"}}"#,
            "x".repeat(2000)
        )
    };
    const SENDERS: usize = 8;
    let barrier = Arc::new(Barrier::new(SENDERS));
    let seen: Vec<Seen> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..SENDERS)
            .map(|t| {
                let (barrier, settings, base) = (Arc::clone(&barrier), &settings, &base);
                s.spawn(move || {
                    let client = reqwest::blocking::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .build()
                        .unwrap();
                    let mut seen = Seen::default();
                    barrier.wait();
                    let started = Instant::now();
                    // Until this sender has seen the disk full for a while (bounded in time).
                    for i in 0..20_000 {
                        if seen.refused >= 30 || started.elapsed() > Duration::from_secs(90) {
                            break;
                        }
                        let id = format!("t{t}_{i}");
                        let mut req = client.post(format!("{base}/webhooks/shop")).body(body(i));
                        for (k, v) in
                            crate::helpers::sign_for(settings, "shop", &id, body(i).as_bytes())
                        {
                            req = req.header(k, v);
                        }
                        let sent = Instant::now();
                        let response = match req.send() {
                            Ok(r) => r,
                            Err(e) => {
                                seen.other.push(format!("{id}: {e}"));
                                break;
                            }
                        };
                        seen.slowest = seen.slowest.max(sent.elapsed());
                        match response.status().as_u16() {
                            200 => seen.acknowledged.push(id),
                            503 if response.headers().contains_key("retry-after") => {
                                let error: serde_json::Value = response.json().unwrap();
                                assert_eq!(error["error"], "unavailable");
                                seen.refused += 1;
                            }
                            other => seen.other.push(format!("{id}: {other}")),
                        }
                    }
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let other: Vec<&String> = seen.iter().flat_map(|s| &s.other).collect();
    assert!(
        other.is_empty(),
        "answers that were not 200 or 503 with Retry-After: {other:?}\n{}",
        server.logs()
    );
    let refused: usize = seen.iter().map(|s| s.refused).sum();
    assert!(
        seen.iter().all(|s| s.refused >= 30),
        "the disk never filled up for every sender ({refused} refused)"
    );
    let slowest = seen.iter().map(|s| s.slowest).max().unwrap();
    let mut acknowledged: Vec<String> = seen.into_iter().flat_map(|s| s.acknowledged).collect();
    assert!(!acknowledged.is_empty());

    // Ops free space; the service takes deliveries again by itself.
    std::fs::remove_file(&ballast).unwrap();
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in 0.. {
        let id = format!("after_{n}");
        let status = send_signed(&client, &base, &settings, &id, &body(n));
        if status == 200 {
            acknowledged.push(id);
            break;
        }
        assert_eq!(status, 503, "{}", server.logs());
        assert!(
            Instant::now() < deadline,
            "no recovery 30 s after space was freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ready = client.get(format!("{base}/readyz")).send().unwrap();
    assert_eq!(ready.status().as_u16(), 200, "{}", server.logs());
    let logs = server.logs();
    let checkpoints_refused = logs.matches("checkpoint").count();
    server.terminate(Duration::from_secs(30));

    assert_intact(&small.0.join("t.db"), &acknowledged);
    eprintln!(
        "disk filled under load: {} acknowledged, {refused} refused with 503, slowest answer \
         {:?}, {checkpoints_refused} log lines of a refused checkpoint",
        acknowledged.len(),
        slowest
    );
}

/// The disk filling during a checkpoint (issue 42): deliveries leave their pages in the WAL, and
/// the checkpoint that would copy them into the database file finds no room to grow the file.
/// It fails (and says so in the log); every delivery before and after is answered 200 or 503
/// with `Retry-After`; the WAL keeps the pages; once ops free space, deliveries are taken again
/// and a later checkpoint copies the WAL into the file. With the server stopped, the integrity
/// check passes and every acknowledged delivery is there.
#[test]
fn a_checkpoint_that_finds_the_disk_full_loses_nothing_and_completes_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(small) = SmallFs::mount_or_skip(&dir.path().join("db"), "16m") else {
        return;
    };
    // Consumers off: only deliveries write, one at a time, so the WAL's growth is predictable.
    let (mut server, settings, client) = serve_on_with(dir.path(), &small.0, "", "workers = 0\n");
    let (db, wal) = (small.0.join("t.db"), small.0.join("t.db-wal"));
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    // About one page of the log per delivery: the checkpoint must grow the file by hundreds.
    let body = |i: usize| {
        format!(
            r#"{{"type":"audit.note","n":{i},"pad":"{}"}}"#,
            "x".repeat(3000)
        )
    };
    let mut acknowledged = Vec::new();
    let mut n = 0;
    let mut send = |prefix: &str| -> u16 {
        n += 1;
        let id = format!("{prefix}_{n}");
        let status = send_signed(&client, &server.base, &settings, &id, &body(n));
        match status {
            200 => acknowledged.push(id),
            503 => {}
            other => panic!("{id} answered {other}"),
        }
        status
    };

    // 1. Deliveries until the WAL holds about 3 MB, short of the first checkpoint (1,000
    //    frames of 4 KiB and a 24-byte header).
    const FRAME: u64 = 4096 + 24;
    for _ in 0..2_000 {
        if size(&wal) >= 3_000_000 {
            break;
        }
        assert_eq!(send("before"), 200);
    }
    assert!(size(&wal) >= 3_000_000, "the WAL did not grow");
    // 2. Ballast leaves room for the WAL to pass 1,000 frames (so the checkpoint runs), not for
    //    the database file to take the hundreds of pages it would copy.
    let stat = rustix::fs::statvfs(&small.0).unwrap();
    let free = stat.f_bavail * stat.f_frsize;
    let room = (1_030 * FRAME).saturating_sub(size(&wal)) + 32 * 1024;
    let ballast = small.0.join("ballast");
    std::fs::write(&ballast, vec![0u8; (free - room) as usize]).unwrap();
    let db_before = size(&db);

    // 3. Deliveries until the disk is full; the checkpoint has failed on the way.
    let mut refused = 0;
    for _ in 0..2_000 {
        if send("full") == 503 {
            refused += 1;
            if refused >= 10 {
                break;
            }
        }
    }
    assert!(refused >= 10, "the disk never filled up");
    let logs = server.logs();
    assert!(
        logs.contains("WAL checkpoint failed") && logs.contains("full"),
        "no checkpoint failed for lack of space (WAL {} bytes, file {} bytes): {logs}",
        size(&wal),
        size(&db)
    );

    // 4. Ops free space: deliveries are taken again, and a later checkpoint copies the WAL.
    std::fs::remove_file(&ballast).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while send("after") != 200 {
        assert!(
            Instant::now() < deadline,
            "no recovery 30 s after space was freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while size(&db) < db_before + 1_000_000 {
        assert_eq!(send("after"), 200, "{}", server.logs());
        assert!(
            Instant::now() < deadline,
            "no checkpoint copied the WAL into the file ({} bytes, {} before)",
            size(&db),
            db_before
        );
    }
    eprintln!(
        "checkpoint refused for lack of space, then done: {} acknowledged, {refused} refused; \
         database file {db_before} -> {} bytes",
        acknowledged.len(),
        size(&db)
    );
    let ready = reqwest::blocking::get(format!("{}/readyz", server.base)).unwrap();
    assert_eq!(ready.status().as_u16(), 200, "{}", server.logs());
    server.terminate(Duration::from_secs(30));

    assert_intact(&db, &acknowledged);
}

/// With the server stopped: the integrity check passes and every acknowledged delivery is in
/// the file, once.
fn assert_intact(db: &Path, acknowledged: &[String]) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let mut find = conn
        .prepare("SELECT count(*) FROM event_log WHERE source = 'shop' AND event_id = ?1")
        .unwrap();
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|id| find.query_row([id], |r| r.get::<_, i64>(0)).unwrap() != 1)
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged deliveries are missing: {:?}",
        missing.len(),
        acknowledged.len(),
        &missing[..missing.len().min(10)]
    );
}
