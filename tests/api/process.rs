//! The real binary as a child process, for crash and shutdown tests. Every process started here
//! is killed on drop, whatever the test's outcome.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct ServerProcess {
    child: Option<Child>,
    pub base: String,
    pub log: PathBuf,
}

/// Write a config for the binary in `dir`: database `t.db`, the test admin token, one
/// standard-webhooks source `shop`, plus the given top-level and `[consumers]` lines. Returns
/// its path and the parsed settings (for signing).
pub fn write_config(
    dir: &Path,
    port: u16,
    top: &str,
    consumers: &str,
) -> (PathBuf, webhook_inbox::config::Settings) {
    use crate::helpers::{ADMIN_TOKEN, SW_SECRET};
    let text = format!(
        "listen = \"127.0.0.1:{port}\"\ndatabase_url = \"sqlite://t.db\"\n\
         admin_token = \"{ADMIN_TOKEN}\"\n{top}\n[consumers]\n{consumers}\n\
         [[sources]]\nname = \"shop\"\nscheme = \"standard-webhooks\"\nsecrets = [\"{SW_SECRET}\"]\n"
    );
    let path = dir.join("t.toml");
    std::fs::write(&path, &text).unwrap();
    let settings = webhook_inbox::config::Settings::from_toml(&text, "t", vec![]).unwrap();
    (path, settings)
}

/// POST a delivery signed for `shop` with a blocking client; returns the status.
pub fn send_signed(
    client: &reqwest::blocking::Client,
    base: &str,
    settings: &webhook_inbox::config::Settings,
    id: &str,
    body: &str,
) -> u16 {
    let mut req = client
        .post(format!("{base}/webhooks/shop"))
        .body(body.to_string());
    for (k, v) in crate::helpers::sign_for(settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    req.send().unwrap().status().as_u16()
}

/// Wait for a child to exit, at most `within`; past that it is killed and the test fails
/// naming `what` was expected.
pub fn exit_within(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port that was free a moment ago (the child binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl ServerProcess {
    /// Start `webhook-inbox serve --config <config>` in `dir` and wait until it answers.
    pub fn start(dir: &Path, config: &Path, port: u16, log_name: &str) -> ServerProcess {
        Self::start_with_env(dir, config, port, log_name, &[])
    }

    /// `start`, with extra environment variables for the child.
    pub fn start_with_env(
        dir: &Path,
        config: &Path,
        port: u16,
        log_name: &str,
        env: &[(&str, &str)],
    ) -> ServerProcess {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        Self::spawn(dir, config, base, log_name, env, &client)
    }

    /// `start` for a config with `tls_cert` and `tls_key`: `base` is `https://localhost:PORT`,
    /// waited for with a client that trusts `client`'s roots.
    pub fn start_https(
        dir: &Path,
        config: &Path,
        port: u16,
        log_name: &str,
        client: &reqwest::blocking::Client,
    ) -> ServerProcess {
        let base = format!("https://localhost:{port}");
        Self::spawn(dir, config, base, log_name, &[], client)
    }

    fn spawn(
        dir: &Path,
        config: &Path,
        base: String,
        log_name: &str,
        env: &[(&str, &str)],
        client: &reqwest::blocking::Client,
    ) -> ServerProcess {
        let log = dir.join(log_name);
        let child = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .current_dir(dir)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the webhook-inbox binary");
        let mut server = ServerProcess {
            child: Some(child),
            base,
            log,
        };
        server.wait_ready(client);
        server
    }

    fn wait_ready(&mut self, client: &reqwest::blocking::Client) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("server exited early ({status}): {}", self.logs());
            }
            if client
                .get(format!("{}/readyz", self.base))
                .send()
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("server did not become ready: {}", self.logs());
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait (every 50 ms, at most `within`) until `done` says yes; the node's log on a
    /// timeout.
    pub fn wait_for(&self, within: Duration, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !done() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting: {what}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Send a signal by name (`TERM`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    /// SIGTERM, then wait (bounded) for a clean exit; returns the exit status.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        let mut child = self.child.take().unwrap();
        exit_within(&mut child, within, "the server should exit on SIGTERM")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
