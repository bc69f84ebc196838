#![allow(dead_code)] // each test module uses a different part
//! The user's endpoint for `http` subscriptions: `examples/http_receiver.py`, run as a user
//! would run it (its own SQLite file, the `standardwebhooks` package verifying each call),
//! on 127.0.0.1. It can be told to misbehave, and reports what it saw. Stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The virtual environment `scripts/test-deps` installs `standardwebhooks` into.
pub const RECEIVER_PYTHON: &str = "/opt/webhook-inbox/receiver/bin/python3";

/// Whether the receiver can run here (see `requires`).
pub fn receiver_available() -> bool {
    crate::requires::available(
        "the example receiver's Python environment",
        crate::requires::command(RECEIVER_PYTHON),
    )
}

pub struct Endpoint {
    pub port: u16,
    child: Child,
    client: reqwest::Client,
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/http_receiver.py")
}

impl Endpoint {
    /// Start the receiver with its database in `dir`, verifying with `secret`.
    pub fn start(dir: &Path, secret: &str) -> Endpoint {
        Endpoint::start_on(dir, secret, 0)
    }

    /// [`Endpoint::start`] on a given port (0: any).
    pub fn start_on(dir: &Path, secret: &str, port: u16) -> Endpoint {
        let port_file = dir.join("receiver.port");
        let _ = std::fs::remove_file(&port_file);
        let child = Command::new(RECEIVER_PYTHON)
            .arg(example())
            .arg("--port")
            .arg(port.to_string())
            .arg("--db")
            .arg(dir.join("receiver.db"))
            .arg("--port-file")
            .arg(&port_file)
            .env("WEBHOOK_SECRET", secret)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting examples/http_receiver.py");
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break port;
            }
            assert!(Instant::now() < deadline, "the receiver did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        Endpoint {
            port,
            child,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    /// Where webhook-inbox forwards to.
    pub fn hook_url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks", self.port)
    }

    /// Misbehave (`mode`: ok, 500, hang, reset, 429, 410, late) for the next `count` calls
    /// (all, if `None`).
    pub async fn set_mode(&self, mode: &str, count: Option<u32>, retry_after: Option<&str>) {
        let mut body = json!({ "mode": mode });
        if let Some(n) = count {
            body["count"] = json!(n);
        }
        if let Some(r) = retry_after {
            body["retry_after"] = json!(r);
        }
        let reply = self
            .client
            .post(format!("http://127.0.0.1:{}/_control", self.port))
            .json(&body)
            .send()
            .await
            .expect("control call");
        assert_eq!(reply.status(), 200, "control {body}");
    }

    /// Counters, balances and credited orders (see the example's docstring).
    pub async fn stats(&self) -> Value {
        self.client
            .get(format!("http://127.0.0.1:{}/_stats", self.port))
            .send()
            .await
            .expect("stats call")
            .json()
            .await
            .expect("stats JSON")
    }

    pub async fn count(&self, key: &str) -> i64 {
        self.stats().await[key].as_i64().unwrap_or(0)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
