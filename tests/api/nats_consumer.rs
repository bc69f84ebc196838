//! `examples/nats_consumer.py`, run as a user would run it, against a stream a `nats`
//! subscription filled, SIGKILLed several times mid-stream: it credits each order once although
//! the stream holds some events twice (re-published after the duplicate window), some orders
//! come under two event ids, and every kill leaves messages fetched and not acked (or committed
//! and not acked), which JetStream delivers again after the consumer's ack wait.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer};
use webhook_inbox::forward::call::webhook_id;

use crate::brokers::until_published;
use crate::example_consumers::{
    assert_credited_once, consume_through_kills, example_consumer, stop_consumer,
};
use crate::helpers::*;
use crate::nats::{app_with_bus, broker, jetstream_of, stored, unique};

/// The virtual environment `scripts/test-deps` installs `nats-py` into.
const NATS_PYTHON: &str = "/opt/webhook-inbox/nats-consumer/bin/python3";

/// Events published by the test itself beside the subscription's: enough that a kill lands
/// while the consumer works.
const MORE: usize = 600;
const KILLS: usize = 3;

/// A message as webhook-inbox publishes it (`Nats-Msg-Id`, headers, JSON body).
async fn publish_like_the_node(js: &jetstream::Context, subject: &str, id: &str, body: String) {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", webhook_id("shop", id).as_str());
    headers.insert("Content-Type", "application/json");
    headers.insert("webhook-inbox-source", "shop");
    headers.insert("webhook-inbox-event-id", id);
    headers.insert("webhook-inbox-event-type", "order.completed");
    let ack = js
        .publish_with_headers(subject.to_string(), headers, body.into())
        .await
        .expect("publish");
    assert!(!ack.await.expect("the stream's ack").duplicate);
}

fn consumer(url: &str, stream: &str, subject: &str, db: &Path, log: &Path) -> Child {
    let args = [
        "--url",
        url,
        "--stream",
        stream,
        "--durable",
        "loyalty",
        "--subject",
        subject,
    ];
    let tuning = ["--batch", "20", "--wait", "0.3"];
    example_consumer(
        NATS_PYTHON,
        "nats_consumer.py",
        &[&args[..], &tuning].concat(),
        db,
        log,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_the_example_consumer_credits_each_order_once_through_sigkills() {
    let Some(url) = broker() else { return };
    if !crate::requires::available(
        "the NATS consumer example's Python environment",
        crate::requires::command(NATS_PYTHON),
    ) {
        return;
    }
    let (name, prefix) = (unique("S"), unique("p"));
    let subject = format!("{prefix}.>");
    let js = jetstream_of(&url).await;
    // A short window, so that a copy published after it is stored again.
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            duplicate_window: Duration::from_millis(500),
            ..Default::default()
        })
        .await
        .unwrap();
    // The durable consumer the example binds to, made as an operator would, with a short ack
    // wait: what a killed consumer had fetched comes again within the test's time.
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("loyalty".into()),
            filter_subject: subject.clone(),
            ack_wait: Duration::from_secs(2),
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
    let more_subject = format!("{prefix}.shop.order_completed");
    for i in 0..MORE {
        let body = order_body(&format!("m-{i}"), &format!("c{}", i % 4), 1);
        publish_like_the_node(&js, &more_subject, &format!("m-{i}"), body).await;
    }
    // Past the window, a few copies are stored again, as after a node's publish whose ack was
    // lost and retried later.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let copies: Vec<_> = stored(&js, &name).await.into_iter().step_by(100).collect();
    for m in &copies {
        let copy = js
            .publish_with_headers(m.subject.clone(), m.headers.clone(), m.payload.clone())
            .await
            .unwrap();
        assert!(!copy.await.unwrap().duplicate, "the window should be over");
    }
    let events = (24 + MORE) as i64;
    let in_stream = events as u64 + copies.len() as u64;
    assert_eq!(stored(&js, &name).await.len() as u64, in_stream);

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consumer.db");
    let log = dir.path().join("consumer.log");
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let start = || consumer(&url, &name, &subject, &db, &log);
    consume_through_kills(start, &db, events, KILLS, logs).await;
    let mut child = consumer(&url, &name, &subject, &db, &log);
    let deadline = Instant::now() + Duration::from_secs(60);
    let info = loop {
        let info = js
            .get_stream(&name)
            .await
            .unwrap()
            .consumer_info("loyalty")
            .await
            .unwrap();
        if info.num_pending == 0
            && info.num_ack_pending == 0
            && info.delivered.stream_sequence == in_stream
        {
            break info;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the consumer exited ({status}): {}", logs());
        }
        assert!(
            Instant::now() < deadline,
            "not consumed: {info:?}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop_consumer(&mut child, logs);
    assert_credited_once(&db, MORE as i64);
    // The kills left messages fetched and not acked: delivered again, and dropped by the dedup.
    assert!(
        info.delivered.consumer_sequence > in_stream,
        "no redelivery: {info:?}"
    );
    app.stop().await;
}
