//! `examples/nats_consumer.py`, run as a user would run it, against a stream a `nats`
//! subscription filled: it credits each order once although the stream holds some events
//! twice (re-published after the duplicate window) and some orders come under two event ids.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;

use crate::brokers::until_published;
use crate::helpers::*;
use crate::nats::{app_with_bus, broker, jetstream_of, stored, unique};
use crate::process::exit_within;

/// The virtual environment `scripts/test-deps` installs `nats-py` into.
const NATS_PYTHON: &str = "/opt/webhook-inbox/nats-consumer/bin/python3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_the_example_consumer_credits_each_order_once() {
    let Some(url) = broker() else { return };
    if !crate::requires::available(
        "the NATS consumer example's Python environment",
        crate::requires::command(NATS_PYTHON),
    ) {
        return;
    }
    let (name, prefix) = (unique("S"), unique("p"));
    let js = jetstream_of(&url).await;
    // A short window, so that a copy published after it is stored again.
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}.>")],
        duplicate_window: Duration::from_millis(500),
        ..Default::default()
    })
    .await
    .unwrap();
    let app = app_with_bus(&url, &prefix, "").await;
    for i in 0..20 {
        let body = order_body(&format!("o-{i}"), &format!("c{}", i % 4), 10);
        app.deliver("shop", &format!("e-{i}"), &body).await;
        if i % 5 == 0 {
            app.deliver("shop", &format!("again-{i}"), &body).await;
        }
    }
    until_published(&app, 24, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    for m in stored(&js, &name).await.into_iter().take(3) {
        let copy = js
            .publish_with_headers(m.subject.clone(), m.headers.clone(), m.payload.clone())
            .await
            .unwrap();
        assert!(!copy.await.unwrap().duplicate, "the window should be over");
    }
    assert_eq!(stored(&js, &name).await.len(), 27);

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consumer.db");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/nats_consumer.py");
    let mut child = Command::new(NATS_PYTHON)
        .arg(&example)
        .args(["--url", &url, "--stream", &name, "--durable", "loyalty"])
        .args(["--subject", &format!("{prefix}.>"), "--wait", "0.5", "--db"])
        .arg(&db)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("consumer.log")).unwrap())
        .spawn()
        .expect("run examples/nats_consumer.py");
    let logs = || std::fs::read_to_string(dir.path().join("consumer.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done = match js
            .get_stream(&name)
            .await
            .unwrap()
            .consumer_info("loyalty")
            .await
        {
            Ok(info) => {
                info.num_pending == 0
                    && info.num_ack_pending == 0
                    && info.delivered.stream_sequence == 27
            }
            Err(_) => false,
        };
        if done {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the consumer exited ({status}): {}", logs());
        }
        assert!(Instant::now() < deadline, "not consumed: {}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = tokio::task::block_in_place(|| {
        exit_within(
            &mut child,
            Duration::from_secs(15),
            "the consumer on SIGTERM",
        )
    });
    assert!(status.success(), "{status}: {}", logs());
    let conn = rusqlite::Connection::open(&db).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(count("SELECT count(*) FROM processed_messages"), 24);
    assert_eq!(
        count("SELECT count(*) FROM processed_messages WHERE outcome = 'business_duplicate'"),
        4
    );
    assert_eq!(count("SELECT sum(balance) FROM loyalty_balances"), 200);
    assert_eq!(
        count("SELECT balance FROM loyalty_balances WHERE customer_id = 'c0'"),
        50
    );
    app.stop().await;
}
