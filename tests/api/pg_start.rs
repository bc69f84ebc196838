//! `serve` started before its PostgreSQL server is up (a host's services starting together):
//! it waits for the database, bounded, saying so once per try, instead of exiting; once the
//! server is up it starts serving by itself. On a cluster of the test's own (stopping the
//! shared one would break the tests beside it).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::nodes::node_config;
use crate::pg_restart::PrivateCluster;
use crate::pgdb;
use crate::process::free_port;

/// The node's process, killed on drop whatever the outcome.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Seen failing before the change: the node exited at once (the database unreachable).
#[test]
fn serve_waits_for_a_postgres_that_is_not_up_yet() {
    if !pgdb::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = PrivateCluster::start(dir.path());
    let port = free_port();
    let config = node_config(dir.path(), "node", port, &cluster.url, "");
    cluster.ctl("stop");
    let log = dir.path().join("node.log");
    let mut node = Node(
        Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .current_dir(dir.path())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    // Waiting: still running, a line per try.
    let deadline = Instant::now() + Duration::from_secs(20);
    while logs().matches("waiting for the database").count() < 2 {
        if let Some(status) = node.0.try_wait().unwrap() {
            panic!("the node exited ({status}) instead of waiting:\n{}", logs());
        }
        assert!(Instant::now() < deadline, "no waiting line:\n{}", logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.ctl("start");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .is_ok_and(|r| r.status() == 200);
        if ready {
            break;
        }
        if let Some(status) = node.0.try_wait().unwrap() {
            panic!("the node exited ({status}):\n{}", logs());
        }
        assert!(Instant::now() < deadline, "not ready:\n{}", logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, outcome) =
        crate::nodes::send_one(&format!("http://127.0.0.1:{port}"), "e-1", "{}");
    assert_eq!((status, outcome.as_str()), (200, "queued"), "{}", logs());
}
