//! `webhook-inbox listen` (the real binary) between a server with a `pull` subscription and
//! the example receiver of `examples/http_receiver.py` on a local port: every event arrives
//! signed and verifies, a failed answer is retried, one line is printed per event, and Ctrl-C
//! stops it cleanly.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use webhook_inbox::startup::BuildOptions;

use crate::endpoint::{Endpoint, receiver_available};
use crate::helpers::*;
use crate::process::exit_within;
use crate::pull::{PULL_TOKEN, pull_config};

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
