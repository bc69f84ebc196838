//! Fault injection with the real binary (issue 14): the database on a small tmpfs that fills
//! up. While full, deliveries answer 503 `unavailable` with `Retry-After`, never 500, and no
//! acknowledged delivery is lost; once space is freed the server recovers by itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::helpers::ADMIN_TOKEN;
use crate::process::{ServerProcess, free_port, send_signed, write_config};
use crate::requires;

/// A size-limited tmpfs, unmounted on drop whatever the test's outcome.
pub struct SmallFs(pub PathBuf);

impl SmallFs {
    pub fn mount(at: &Path, size: &str) -> Result<SmallFs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if out.status.success() {
            Ok(SmallFs(at.to_path_buf()))
        } else {
            Err(format!(
                "mounting a tmpfs needs root: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl SmallFs {
    /// The mount, or `None` when this machine cannot mount one (the test then reports itself
    /// skipped, and `.ci/run` fails on a skip).
    pub fn mount_or_skip(at: &Path, size: &str) -> Option<SmallFs> {
        match SmallFs::mount(at, size) {
            Ok(fs) => Some(fs),
            Err(why) => {
                if requires::available("a tmpfs mount (root)", Err(why)) {
                    unreachable!()
                }
                None
            }
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Write zeros into `path` until the filesystem refuses (bounded by the filesystem's size).
fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    while written < 64 * 1024 * 1024 {
        match file.write(&block) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    let _ = file.flush();
    written
}

/// The real binary with `workers` consumers, its config in `dir` and its database file in
/// `db_dir`, and a blocking client for it.
fn serve_on(
    dir: &std::path::Path,
    db_dir: &std::path::Path,
    workers: u32,
) -> (
    ServerProcess,
    webhook_inbox::config::Settings,
    reqwest::blocking::Client,
) {
    serve_on_with(dir, db_dir, "", &format!("workers = {workers}\n"))
}

/// [`serve_on`] with `top` and `consumers` added to the config (see `write_config`).
pub fn serve_on_with(
    dir: &std::path::Path,
    db_dir: &std::path::Path,
    top: &str,
    consumers: &str,
) -> (
    ServerProcess,
    webhook_inbox::config::Settings,
    reqwest::blocking::Client,
) {
    let port = free_port();
    let (config, settings) = write_config(dir, port, top, consumers);
    let url = format!("sqlite://{}", db_dir.join("t.db").display());
    let server = ServerProcess::start_with_env(
        dir,
        &config,
        port,
        "server.log",
        &[("WEBHOOK_INBOX_DATABASE_URL", &url)],
    );
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    (server, settings, client)
}

#[test]
fn a_full_disk_answers_503_loses_no_acknowledged_delivery_and_recovers_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let Some(small) = SmallFs::mount_or_skip(&dir.path().join("db"), "4m") else {
        return;
    };
    let (server, settings, client) = serve_on(dir.path(), &small.0, 0);
    let body = |i: usize| {
        format!(
            r#"{{"type":"audit.note","n":{i},"pad":"{}"}}"#,
            "x".repeat(2000)
        )
    };
    let mut acknowledged = Vec::new();
    for i in 0..5 {
        let id = format!("before_{i}");
        assert_eq!(
            send_signed(&client, &server.base, &settings, &id, &body(i)),
            200
        );
        acknowledged.push(id);
    }

    let filler = small.0.join("filler");
    let filled = fill(&filler);
    assert!(filled > 0, "nothing could be written to fill the disk");
    let (mut refused, mut statuses) = (0, Vec::new());
    for i in 0..200 {
        let id = format!("full_{i}");
        let mut req = client
            .post(format!("{}/webhooks/shop", server.base))
            .body(body(i));
        for (k, v) in crate::helpers::sign_for(&settings, "shop", &id, body(i).as_bytes()) {
            req = req.header(k, v);
        }
        let response = req.send().unwrap();
        let status = response.status().as_u16();
        statuses.push(status);
        match status {
            200 => acknowledged.push(id),
            503 => {
                assert!(
                    response.headers().contains_key("retry-after"),
                    "503 without Retry-After"
                );
                let error: serde_json::Value = response.json().unwrap();
                assert_eq!(error["error"], "unavailable");
                refused += 1;
                if refused >= 20 {
                    break;
                }
            }
            other => panic!("a full disk answered {other}: {}", server.logs()),
        }
    }
    assert!(refused >= 20, "the disk never filled up: {statuses:?}");
    // A writing ops route answers 503 too, not 500.
    let created = client
        .post(format!("{}/requests", server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap()
        .status()
        .as_u16();
    // Before SQLITE_FULL was mapped to `unavailable` this was a 500 `internal`.
    assert_eq!(created, 503, "POST /requests on a full disk");

    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        let id = format!("after_{n}");
        let status = send_signed(&client, &server.base, &settings, &id, &body(n));
        if status == 200 {
            acknowledged.push(id);
            break;
        }
        assert_eq!(status, 503, "{}", server.logs());
        assert!(
            Instant::now() < deadline,
            "no recovery 20 s after space was freed"
        );
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let ready = client
        .get(format!("{}/readyz", server.base))
        .send()
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200, "{}", server.logs());
    for id in &acknowledged {
        let status = client
            .get(format!("{}/events/shop/{id}", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(status, 200, "acknowledged delivery {id} is missing");
    }
    eprintln!(
        "disk full: {} acknowledged, {refused} refused with 503, filler {filled} bytes",
        acknowledged.len()
    );
}

/// Before: the server started on a database it could not write, said it was ready, answered
/// 503 to deliveries and 500 to `POST /requests`. Now it refuses to start and says what to fix.
#[test]
fn a_read_only_database_refuses_to_start_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let Some(small) = SmallFs::mount_or_skip(&dir.path().join("db"), "8m") else {
        return;
    };
    let port = free_port();
    let (config, _) = write_config(dir.path(), port, "", "");
    let url = format!("sqlite://{}", small.0.join("t.db").display());
    let bin = env!("CARGO_BIN_EXE_webhook-inbox");
    let migrated = Command::new(bin)
        .args(["migrate", "--config"])
        .arg(&config)
        .env("WEBHOOK_INBOX_DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
    let remount = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&small.0)
        .status()
        .unwrap();
    assert!(remount.success());

    let mut child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(&config)
        .env("WEBHOOK_INBOX_DATABASE_URL", &url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = crate::process::exit_within(
        &mut child,
        Duration::from_secs(20),
        "serve should refuse a read-only database",
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "serve exited 0 on a read-only database");
    assert!(
        stderr.contains("is not writable by this process") && stderr.contains("t.db"),
        "unclear message: {stderr}"
    );
}

/// A loop-mounted ext4 image with `errors=remount-ro`: ext4's `trigger_fs_error` turns it
/// read-only under open files, as the kernel does after a disk error.
struct Ext4(PathBuf);

impl Ext4 {
    fn mount(dir: &Path) -> Result<Ext4, String> {
        let image = dir.join("fs.img");
        let mnt = dir.join("db");
        std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(16 << 20))
            .map_err(|e| e.to_string())?;
        let run = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            out.status
                .success()
                .then_some(())
                .ok_or_else(|| format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
        };
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
        run(Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&image)
            .arg(&mnt))?;
        Ok(Ext4(mnt))
    }

    fn fail(&self) {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.0)
            .output()
            .unwrap();
        let source = String::from_utf8(out.stdout).unwrap();
        let device = Path::new(source.trim()).file_name().unwrap().to_owned();
        let trigger = Path::new("/sys/fs/ext4")
            .join(device)
            .join("trigger_fs_error");
        std::fs::write(&trigger, "test: disk error").unwrap();
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The real binary with `workers` consumers over a database on a fresh ext4 image in `dir`,
/// after one delivery was stored; `None` (skipped, or failed under `TEST_REQUIRE_ALL`) where
/// no image can be mounted.
fn serve_on_ext4(
    dir: &std::path::Path,
    workers: u32,
) -> Option<(
    Ext4,
    ServerProcess,
    webhook_inbox::config::Settings,
    reqwest::blocking::Client,
)> {
    let fs = match Ext4::mount(dir) {
        Ok(fs) => fs,
        Err(why) => {
            if requires::available("a loop-mounted ext4 image (root, mkfs.ext4)", Err(why)) {
                unreachable!()
            }
            return None;
        }
    };
    let (server, settings, client) = serve_on(dir, &fs.0, workers);
    let note = r#"{"type":"note"}"#;
    assert_eq!(
        send_signed(&client, &server.base, &settings, "before", note),
        200
    );
    Some((fs, server, settings, client))
}

/// The filesystem under a running server turns read-only: `/readyz` says so with 503, and the
/// writing routes answer 503, not 500.
#[test]
fn a_database_that_becomes_unwritable_while_serving_is_not_ready_and_refuses_writes_with_503() {
    let dir = tempfile::tempdir().unwrap();
    let Some((fs, server, settings, client)) = serve_on_ext4(dir.path(), 0) else {
        return;
    };
    let note = r#"{"type":"note"}"#;
    // No worker writes meanwhile (workers = 0): `/readyz` must find out by itself.
    fs.fail();

    let ready = client
        .get(format!("{}/readyz", server.base))
        .send()
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503, "{}", server.logs());
    assert!(ready.headers().contains_key("retry-after"));
    let status = send_signed(&client, &server.base, &settings, "after", note);
    assert_eq!(
        status,
        503,
        "ingest on a read-only database: {}",
        server.logs()
    );
    let created = client
        .post(format!("{}/requests", server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(
        created,
        503,
        "POST /requests on a read-only database: {}",
        server.logs()
    );
}

/// Consumers on a database that turned unwritable back off: their failed passes come at
/// growing intervals (1 s, 2 s, 4 s, …), not at the idle poll's pace (every 500 ms) nor, as
/// once, eight times a second. A pass fails only where it has something to write (a claim that
/// finds no work commits nothing and touches no disk), so work stays due throughout: submitted
/// requests whose downstream refuses every connection, retried after a millisecond until the
/// downstream's breaker opens, then its probe, which the failed writes leave due.
#[test]
fn consumers_on_an_unwritable_database_back_off_exponentially() {
    let dir = tempfile::tempdir().unwrap();
    let fs = match Ext4::mount(dir.path()) {
        Ok(fs) => fs,
        Err(why) => {
            assert!(!requires::available(
                "a loop-mounted ext4 image (root, mkfs.ext4)",
                Err(why)
            ));
            return;
        }
    };
    let refusing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = refusing.local_addr().unwrap();
    drop(refusing);
    let (server, _, client) = serve_on_with(
        dir.path(),
        &fs.0,
        &format!(
            "submission_tokens = [\"faults-submit-token\"]\n[downstream]\nurl = \"http://{closed}/\"\n\
             mode = \"at-least-once\"\ntimeout_ms = 1000\n"
        ),
        "workers = 1\nmax_attempts = 1000000\nbackoff_base_ms = 1\nbackoff_max_ms = 2\n",
    );
    for _ in 0..20 {
        let created: serde_json::Value = client
            .post(format!("{}/requests", server.base))
            .bearer_auth("faults-submit-token")
            .send()
            .unwrap()
            .json()
            .unwrap();
        let id = created["id"].as_str().unwrap();
        let submitted = client
            .post(format!("{}/requests/{id}/submit", server.base))
            .bearer_auth("faults-submit-token")
            .send()
            .unwrap();
        assert_eq!(submitted.status().as_u16(), 200);
    }
    // The downstream calls are being retried.
    let retried = || {
        let page: serde_json::Value = client
            .get(format!("{}/events?source=requests", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let events = page["events"].as_array().unwrap().clone();
        for e in &events {
            // The error says what happened; whether it is retried is the event's state.
            let error = e["last_error"].as_str().unwrap_or("");
            assert!(!error.contains("will retry"), "{error}");
        }
        events
            .iter()
            .any(|e| e["attempts"].as_i64().unwrap_or(0) >= 2)
    };
    // Five calls in a row without an answer open the downstream's breaker (handlers::
    // downstream): from then on the call-out workers claim one probe per wait. The probe stays
    // due once the database is unwritable (moving it is a write), so the claims keep failing,
    // as every retried event's would without a breaker.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(retried() && server.logs().contains("breaker open")) {
        assert!(std::time::Instant::now() < deadline, "{}", server.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    fs.fail();
    let logs = || server.logs();
    // The first failure comes within a few idle polls.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !logs().contains("claim pass failed") {
        assert!(
            std::time::Instant::now() < deadline,
            "no failed pass logged: {}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Then a window of 6.5 s. Each worker (one in-process, two call-out by default) backs off
    // on its own, doubling each wait (1 + 2 + 4 s: at most four failures each, the first
    // included); the idle poll alone would fail 13 times each, the old loop about 50.
    std::thread::sleep(Duration::from_millis(6_500));
    let text = logs();
    let mut per_worker = std::collections::BTreeMap::<&str, usize>::new();
    for line in text.lines().filter(|l| l.contains("claim pass failed")) {
        let worker = line
            .split_whitespace()
            .find_map(|field| field.strip_prefix("worker="))
            .unwrap_or_else(|| panic!("no worker in {line}"));
        *per_worker.entry(worker).or_default() += 1;
    }
    assert!(!per_worker.is_empty());
    for (worker, seen) in &per_worker {
        assert!(
            (2..=4).contains(seen),
            "{worker}: {seen} failed passes in 6.5 s: {text}"
        );
    }
}
