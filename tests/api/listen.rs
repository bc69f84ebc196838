//! `webhook-inbox listen` (the real binary) between a server with a `pull` subscription and
//! the example receiver of `examples/http_receiver.py` on a local port: every event arrives
//! signed and verifies, a failed answer is retried, one line is printed per event, and Ctrl-C
//! stops it cleanly.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use webhook_inbox::startup::BuildOptions;

use base64::Engine as _;

use crate::endpoint::{Endpoint, receiver_available};
use crate::helpers::*;
use crate::process::exit_within;
use crate::pull::{PULL_TOKEN, pull_config};
use crate::receiver::Receiver;

#[tokio::test]
async fn listen_forwards_signed_events_to_a_local_url() {
    if !receiver_available() {
        return;
    }
    let app = spawn_app_with(
        pull_config("backoff_base_ms = 10\nbackoff_max_ms = 50"),
        BuildOptions::default(),
    )
    .await;
    let endpoint = Endpoint::start(app.dir.path(), SW_SECRET);
    // Its first answer fails: that event is retried, then done.
    endpoint.set_mode("500", Some(1), None).await;
    let mut listen = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .args(["listen", "--subscription", "orders"])
        .args(["--forward-to", &endpoint.hook_url()])
        .args(["--url", &app.address, "--token", PULL_TOKEN])
        .args(["--signing-secret", SW_SECRET, "--batch", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut points = 0;
    for i in 0..12 {
        let body = order_body(&format!("o{i}"), "c1", 3);
        for _ in 0..2 {
            app.deliver("shop", &format!("e{i}"), &body).await;
        }
        points += 3;
    }
    // A business duplicate: the receiver credits its order once.
    app.deliver("shop", "again", &order_body("o0", "c1", 3))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = app.get("/subscriptions/orders").await.body;
        let c = &view["counts"];
        if c["completed"] == 13 && c["pending"] == 0 && c["claimed"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not all forwarded: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = endpoint.stats().await;
    assert_eq!(stats["rejected_signature"], 0, "{stats}");
    assert_eq!(stats["verified"], 13, "{stats}");
    assert_eq!(stats["credited_orders"], 12, "{stats}");
    assert_eq!(stats["business_duplicates"], 1, "{stats}");
    assert_eq!(stats["balances"]["c1"], points, "{stats}");
    // The failed answer was retried: one event took two attempts.
    let attempts = app.count(
        "SELECT max(attempts) FROM event_state s JOIN subscriptions u ON u.id = s.sub
          WHERE u.name = 'orders'",
    );
    assert_eq!(attempts, 2);

    // Ctrl-C: it stops, and says so.
    let status = Command::new("kill")
        .args(["-INT", &listen.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = exit_within(
        &mut listen,
        Duration::from_secs(10),
        "listen should stop on SIGINT",
    );
    assert!(exit.success(), "{exit:?}");
    let mut out = String::new();
    listen
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 14, "one line per forward: {out}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" shop  e3  order.completed  204 ")),
        "{out}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains(" 500 ")).count(),
        1,
        "{out}"
    );
    // A pull token that is not this subscription's is refused: it exits non-zero at once.
    let refused = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .args(["listen", "--subscription", "orders", "--forward-to"])
        .arg(endpoint.hook_url())
        .args(["--url", &app.address, "--token", "wrong-token-0123456789"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let claims = app.post(
        "/subscriptions/orders/claim",
        Some(PULL_TOKEN),
        Some(json!({})),
    );
    assert_eq!(claims.await.body["claims"], json!([]));
    app.stop().await;
}

/// A `listen` child with its output in files; killed on drop.
pub struct Listen {
    child: std::process::Child,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Listen {
    /// `listen --subscription orders --forward-to URL` against `server` with the pull token
    /// and the test's signing secret, plus `extra` flags; run in `dir`.
    pub fn start(dir: &std::path::Path, server: &str, forward_to: &str, extra: &[&str]) -> Listen {
        let (out, err) = (dir.join("listen.out"), dir.join("listen.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
            .args([
                "listen",
                "--subscription",
                "orders",
                "--forward-to",
                forward_to,
            ])
            .args([
                "--url",
                server,
                "--token",
                PULL_TOKEN,
                "--signing-secret",
                SW_SECRET,
            ])
            .args(extra)
            .current_dir(dir)
            .env_remove("WEBHOOK_INBOX_PULL_TOKEN")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Listen { child, out, err }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// What it printed so far: stdout, stderr.
    pub fn output(&self) -> (String, String) {
        (
            std::fs::read_to_string(&self.out).unwrap_or_default(),
            std::fs::read_to_string(&self.err).unwrap_or_default(),
        )
    }

    /// SIGINT (Ctrl-C), then its exit status, within `within`.
    pub fn interrupt(&mut self, within: Duration) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        exit_within(&mut self.child, within, "listen should stop on SIGINT")
    }
}

impl Drop for Listen {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait (bounded) until every state of `orders` is completed, `n` of them.
pub async fn all_completed(app: &TestApp, n: i64, within: Duration, listen: &Listen) {
    let deadline = Instant::now() + within;
    loop {
        let view = app.get("/subscriptions/orders").await.body;
        let c = &view["counts"];
        if c["completed"] == n && c["pending"] == 0 && c["claimed"] == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not all forwarded: {view}\n{:?}",
            listen.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The body a sender signed reaches the local endpoint byte for byte, signed over those bytes:
/// no number rounded (`1.50`, `1e3`, an integer past 64 bits), no escape or space rewritten.
#[tokio::test]
async fn listen_forwards_the_exact_bytes_it_was_given() {
    let app = spawn_app_with(pull_config(""), BuildOptions::default()).await;
    let endpoint = Receiver::start(Duration::ZERO, 204);
    let body = r#"{"amount":1.50, "exp":1e3,"big":123456789012345678901234567890,"s":"caf\u00e9 \/x","n":[ 1 ,2]}"#;
    assert_eq!(app.deliver("shop", "exact", body).await.status, 200);
    let listen = Listen::start(app.dir.path(), &app.address, &endpoint.url, &[]);
    all_completed(&app, 1, Duration::from_secs(15), &listen).await;
    let calls = endpoint.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(
        String::from_utf8_lossy(&call.body),
        body,
        "the endpoint got other bytes"
    );
    // The Standard Webhooks signature, checked by hand over the bytes received.
    let (id, ts) = (
        call.header("webhook-id").unwrap(),
        call.header("webhook-timestamp").unwrap(),
    );
    let key = base64::engine::general_purpose::STANDARD
        .decode(SW_SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(&key).unwrap();
    hmac::Mac::update(&mut mac, format!("{id}.{ts}.").as_bytes());
    hmac::Mac::update(&mut mac, &call.body);
    let expected =
        base64::engine::general_purpose::STANDARD.encode(hmac::Mac::finalize(mac).into_bytes());
    assert_eq!(
        call.header("webhook-signature"),
        Some(format!("v1,{expected}").as_str())
    );
    app.stop().await;
}

/// A refused token is named with where it was read from: the flag, the variable, the config
/// or the generated file, so that the user knows which one to fix.
#[tokio::test]
async fn listen_says_which_token_was_refused() {
    let app = spawn_app_with(pull_config(""), BuildOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let wrong = "wrong-token-0123456789";
    // `global` before `listen`, `flags` after it; waits without blocking the app's runtime.
    let run = async |global: &[&str], flags: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"));
        cmd.args(global)
            .args(["listen", "--subscription", "orders"])
            .args(flags)
            .args([
                "--forward-to",
                "http://127.0.0.1:9/in",
                "--url",
                &app.address,
            ])
            .current_dir(dir.path())
            .env_remove("WEBHOOK_INBOX_PULL_TOKEN");
        if let Some(t) = env {
            cmd.env("WEBHOOK_INBOX_PULL_TOKEN", t);
        }
        let err = dir.path().join("err");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let exit = loop {
            if let Some(exit) = child.try_wait().unwrap() {
                break exit;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("still running: {}", std::fs::read_to_string(&err).unwrap());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let said = std::fs::read_to_string(&err).unwrap();
        assert_eq!(exit.code(), Some(1), "{said}");
        said
    };
    let said = run(&[], &["--token", wrong], None).await;
    assert!(
        said.contains("refused the token of subscription `orders` read from --token"),
        "{said}"
    );
    let said = run(&[], &[], Some(wrong)).await;
    assert!(
        said.contains("read from the environment variable WEBHOOK_INBOX_PULL_TOKEN"),
        "{said}"
    );

    let config = dir.path().join("mine.toml");
    std::fs::write(
        &config,
        format!("[[subscriptions]]\nname = \"orders\"\nkind = \"pull\"\ntoken = \"{wrong}\"\n"),
    )
    .unwrap();
    let said = run(&["--config", config.to_str().unwrap()], &[], None).await;
    assert!(
        said.contains(&format!(
            "the subscription's `token` in {}",
            config.display()
        )),
        "{said}"
    );

    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/subscription-orders-token"), wrong).unwrap();
    let said = run(&[], &[], None).await;
    assert!(
        said.contains("read from the generated token file data/subscription-orders-token"),
        "{said}"
    );
    app.stop().await;
}
