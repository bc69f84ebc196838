//! Power loss, simulated (docs/power-loss.md). The real binary runs with its database on
//! [`LazyFs`], a FUSE filesystem that keeps every write in memory until the file is synced;
//! signed deliveries arrive from several threads; the binary is killed while some are in flight
//! and everything not synced is dropped. What remains is what a disk would hold after a power
//! cut: the binary restarts on it, and every delivery it had acknowledged must be there.
//!
//! The SIGKILL test (crash.rs) cannot see a missing fsync: the page cache outlives a killed
//! process. This one can, and proves it by running once more with the store's fdatasync
//! switched off.

mod fuse_ops;
mod lazyfs;
mod overlay;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use webhook_inbox::config::Settings;
use webhook_inbox::store::sqlite::UNSAFE_SKIP_WAL_FSYNC;

use crate::helpers::{ADMIN_TOKEN, SW_SECRET, assert_integrity, order_body, sign_for};
use crate::process::{ServerProcess, free_port};
use lazyfs::LazyFs;

const SENDERS: usize = 4;
/// Deliveries offered in all; the power is cut long before the last.
const OFFERED: usize = 300;
/// Acknowledgements to wait for before the cut. Few enough that the WAL stays under one
/// checkpoint (seen: 4.5 to 8.6 frames per acknowledged delivery with the consumers running;
/// an upper bound of about 13 when every delivery commits alone).
const CUT_AFTER: usize = 60;
/// SQLite's default `wal_autocheckpoint` (the store keeps it): a checkpoint syncs the WAL,
/// which would make commits durable with or without the store's own fdatasync.
const AUTOCHECKPOINT_FRAMES: u64 = 1000;
/// A WAL file: a 32-byte header, then frames of a 24-byte header and a 4096-byte page.
const WAL_HEADER: u64 = 32;
const WAL_FRAME: u64 = 24 + 4096;

fn config(dir: &Path, name: &str, port: u16, db: &Path, workers: usize) -> (PathBuf, Settings) {
    let text = format!(
        "listen = \"127.0.0.1:{port}\"\ndatabase_url = \"sqlite://{db}\"\n\
         admin_token = \"{ADMIN_TOKEN}\"\n[consumers]\nworkers = {workers}\n\
         [[sources]]\nname = \"shop\"\nscheme = \"standard-webhooks\"\nsecrets = [\"{SW_SECRET}\"]\n",
        db = db.display()
    );
    let path = dir.join(name);
    std::fs::write(&path, &text).unwrap();
    (path, Settings::from_toml(&text, name, vec![]).unwrap())
}

/// What one power cut left.
struct Outcome {
    acked: Vec<String>,
    /// Acknowledged before the cut, not found after the restart.
    missing: Vec<String>,
    /// Requests sent but not answered when the process was killed.
    in_flight: usize,
    /// The WAL's size as the process saw it just before the cut.
    wal_bytes: u64,
}

/// Mount, migrate, serve, send, kill, cut, unmount, restart on what the disk kept, and look
/// up every acknowledged delivery. `None` when FUSE is not available (the test is skipped).
/// `workers`: the consumers' workers. Their commits make the WAL durable too, so with none
/// running only ingest's own commits can have synced what it acknowledged.
fn power_cut(skip_wal_fsync: bool, workers: usize) -> Option<Outcome> {
    let dir = tempfile::tempdir().unwrap();
    let (disk, mnt) = (dir.path().join("disk"), dir.path().join("mnt"));
    std::fs::create_dir(&disk).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let fs = LazyFs::mount(&disk, &mnt);
    if !crate::requires::available(
        "a FUSE mount",
        fs.as_ref().map(|_| ()).map_err(Clone::clone),
    ) {
        return None;
    }
    let fs = fs.unwrap();

    // The schema goes in first, synced as usual: then only deliveries are at stake.
    let port = free_port();
    let (mounted, settings) = config(dir.path(), "mounted.toml", port, &mnt.join("t.db"), workers);
    migrate(dir.path(), &mounted);

    let env: &[(&str, &str)] = if skip_wal_fsync {
        &[(UNSAFE_SKIP_WAL_FSYNC, "1")]
    } else {
        &[]
    };
    let mut server = ServerProcess::start_with_env(dir.path(), &mounted, port, "first.log", env);
    if skip_wal_fsync {
        assert!(
            server.logs().contains("NOT made durable"),
            "{}",
            server.logs()
        );
    }

    let acked = Arc::new(Mutex::new(Vec::new()));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let senders = (0..SENDERS)
        .map(|t| {
            let (acked, in_flight, stop) = (acked.clone(), in_flight.clone(), stop.clone());
            let (base, settings) = (server.base.clone(), settings.clone());
            std::thread::spawn(move || send(t, &base, &settings, &acked, &in_flight, &stop))
        })
        .collect::<Vec<_>>();
    let no_ops = {
        let (base, stop) = (server.base.clone(), stop.clone());
        std::thread::spawn(move || send_no_ops(&base, &stop))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < CUT_AFTER {
        let done = senders.iter().all(|s| s.is_finished());
        assert!(
            Instant::now() < deadline && !done,
            "deliveries were not acknowledged: {}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // The power cut: the process dies, then everything it wrote and did not sync is gone.
    let unanswered = in_flight.load(Ordering::SeqCst);
    server.kill();
    let wal_bytes = std::fs::metadata(mnt.join("t.db-wal")).map_or(0, |m| m.len());
    let cut = fs.cut();
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.join().unwrap();
    }
    let answered = no_ops.join().unwrap();
    assert!(
        answered > 0,
        "no no-op write reached the store before the cut"
    );
    fs.unmount();
    let acked = Arc::try_unwrap(acked).unwrap().into_inner().unwrap();
    assert!(
        acked.len() < OFFERED,
        "the cut came too late to test anything"
    );
    eprintln!(
        "cut: {} acknowledged, {unanswered} in flight, WAL {wal_bytes} bytes, dropped {:?}",
        acked.len(),
        cut.0
    );

    // Restart on what the disk kept, without FUSE.
    let port = free_port();
    let (kept, _) = config(dir.path(), "kept.toml", port, &disk.join("t.db"), workers);
    let server = ServerProcess::start(dir.path(), &kept, port, "second.log");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let missing = acked
        .iter()
        .filter(|id| {
            let status = client
                .get(format!("{}/events/shop/{id}", server.base))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .unwrap()
                .status()
                .as_u16();
            assert!(status == 200 || status == 404, "{id}: {status}");
            status == 404
        })
        .cloned()
        .collect();
    drop(server);
    let db = disk.join("t.db");
    assert!(db.exists(), "the database file survives");
    assert_integrity(&db);
    Some(Outcome {
        acked,
        missing,
        in_flight: unanswered,
        wal_bytes,
    })
}

/// `webhook-inbox migrate`, killed if it takes more than 30 s.
fn migrate(dir: &Path, config: &Path) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .args(["migrate", "--config"])
        .arg(config)
        .current_dir(dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let status = crate::process::exit_within(
        &mut child,
        Duration::from_secs(30),
        "migrate should have finished",
    );
    assert!(status.success(), "migrate failed: {status}");
}

/// Send this thread's share of the deliveries until told to stop; record each 2xx.
fn send(
    t: usize,
    base: &str,
    settings: &Settings,
    acked: &Mutex<Vec<String>>,
    in_flight: &AtomicUsize,
    stop: &AtomicBool,
) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for i in (t..OFFERED).step_by(SENDERS) {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let id = format!("pc-{i}");
        let body = order_body(&format!("o-{i}"), &format!("c-{}", i % 10), 1);
        let mut req = client
            .post(format!("{base}/webhooks/shop"))
            .body(body.clone());
        for (k, v) in sign_for(settings, "shop", &id, body.as_bytes()) {
            req = req.header(k, v);
        }
        in_flight.fetch_add(1, Ordering::SeqCst);
        let answer = req.send();
        in_flight.fetch_sub(1, Ordering::SeqCst);
        match answer {
            Ok(r) if r.status().is_success() => acked.lock().unwrap().push(id),
            // Refused after the kill, or a 503: not acknowledged, nothing promised.
            _ => {}
        }
    }
}

/// Ops writes that change nothing, among the deliveries until told to stop: a commit that
/// wrote no WAL frame synced nothing, and must not make the deliveries beside it durable.
/// Returns how many were answered, each with its expected status (404, or 200 for the bulk
/// retry that matched nothing).
fn send_no_ops(base: &str, stop: &AtomicBool) -> usize {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let writes = [
        ("/requests/no-such-request/submit", "{}"),
        (
            "/requests/no-such-request/documents",
            r#"{"name":"a","content_type":"text/plain","content":"b"}"#,
        ),
        ("/events/shop/no-such-event/retry", "{}"),
        ("/events/retry", r#"{"source":"no-such-source"}"#),
    ];
    let mut answered = 0;
    for (path, body) in writes.iter().cycle().take(5_000) {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        // Answered 404 or 200 with nothing retried; refused once the process is killed.
        let sent = client
            .post(format!("{base}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(*body)
            .send();
        if let Ok(r) = sent {
            let expected = if *path == "/events/retry" { 200 } else { 404 };
            if r.status().as_u16() == expected {
                answered += 1;
            } else {
                assert!(r.status().is_server_error(), "{path}: {}", r.status());
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    answered
}

#[test]
fn acknowledged_deliveries_survive_a_power_cut() {
    assert_none_lost(power_cut(false, 2));
}

/// Ingest alone: each of its commits is synced inside `COMMIT`, and nothing else syncs the WAL
/// before the cut (with the consumers running, their commits' fsyncs would cover a missing one).
#[test]
fn acknowledged_deliveries_survive_a_power_cut_with_the_consumers_off() {
    assert_none_lost(power_cut(false, 0));
}

fn assert_none_lost(outcome: Option<Outcome>) {
    let Some(outcome) = outcome else {
        return;
    };
    assert!(outcome.acked.len() >= CUT_AFTER);
    assert!(
        outcome.missing.is_empty(),
        "{} of {} acknowledged deliveries lost, among them {:?}",
        outcome.missing.len(),
        outcome.acked.len(),
        &outcome.missing[..outcome.missing.len().min(5)]
    );
}

#[test]
fn without_the_wal_fsync_a_power_cut_loses_acknowledged_deliveries() {
    let Some(outcome) = power_cut(true, 2) else {
        return;
    };
    // Deterministic: the WAL stayed under one checkpoint, so nothing but the store's own
    // fdatasync could have synced its frames, and it was switched off.
    let frames = outcome.wal_bytes.saturating_sub(WAL_HEADER) / WAL_FRAME;
    assert!(
        frames < AUTOCHECKPOINT_FRAMES,
        "the WAL reached a checkpoint ({frames} frames): lower CUT_AFTER"
    );
    eprintln!(
        "without the fdatasync: lost {} of {} acknowledged deliveries \
         ({} in flight at the cut, {frames} WAL frames)",
        outcome.missing.len(),
        outcome.acked.len(),
        outcome.in_flight
    );
    assert!(
        !outcome.missing.is_empty(),
        "all {} acknowledged deliveries survived without the fdatasync: the test cannot see it",
        outcome.acked.len()
    );
}

/// The filesystem itself: a reader sees every write at once, the backing directory only what
/// was synced, and a cut drops the rest.
#[test]
fn the_power_cut_filesystem_keeps_only_synced_writes() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let (disk, mnt) = (dir.path().join("disk"), dir.path().join("mnt"));
    std::fs::create_dir(&disk).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let fs = LazyFs::mount(&disk, &mnt);
    if !crate::requires::available(
        "a FUSE mount",
        fs.as_ref().map(|_| ()).map_err(Clone::clone),
    ) {
        return;
    }
    let fs = fs.unwrap();
    let mut f = std::fs::File::create(mnt.join("f")).unwrap();
    f.write_all(b"synced").unwrap();
    f.sync_data().unwrap();
    f.write_all(b" and not").unwrap();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"synced and not");
    assert_eq!(std::fs::read(disk.join("f")).unwrap(), b"synced");
    f.set_len(3).unwrap();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"syn");
    assert_eq!(
        std::fs::read(disk.join("f")).unwrap(),
        b"synced",
        "truncates wait too"
    );
    f.write_all(b"!").unwrap(); // at offset 14: the gap reads as zeros
    assert_eq!(
        std::fs::read(mnt.join("f")).unwrap(),
        b"syn\0\0\0\0\0\0\0\0\0\0\0!"
    );
    let cut = fs.cut();
    assert_eq!(cut.0, [("f".to_string(), 4096)]);
    assert!(
        f.write_all(b"after").and_then(|()| f.sync_data()).is_err(),
        "no power"
    );
    drop(f);
    fs.unmount();
    assert_eq!(std::fs::read(disk.join("f")).unwrap(), b"synced");
}
