//! `examples/amqp_consumer.py`, run as a user would run it, against a queue an `amqp`
//! subscription filled, SIGKILLed several times mid-stream: it credits each order once although
//! the queue holds some events twice (published again, as after a lost confirm), some orders
//! come under two event ids, and every kill leaves messages taken and not acked (or committed
//! and not acked), which RabbitMQ delivers again.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use webhook_inbox::forward::call::webhook_id;

use crate::amqp::{Client, app_with_bus, broker, client, names};
use crate::brokers::until_published;
use crate::example_consumers::{
    assert_credited_once, consume_through_kills, example_consumer, processed, stop_consumer,
};
use crate::helpers::*;

/// The virtual environment `scripts/test-deps` installs `pika` into.
const AMQP_PYTHON: &str = "/opt/webhook-inbox/amqp-consumer/bin/python3";

/// Events published by the test itself beside the subscription's: enough that a kill lands
/// while the consumer works.
const MORE: usize = 600;
const KILLS: usize = 3;

/// A message as webhook-inbox publishes it (message_id, headers, JSON body).
async fn publish_like_the_node(rabbit: &Client, exchange: &str, key: &str, id: &str, body: &str) {
    let mut headers = FieldTable::default();
    for (name, value) in [
        ("webhook-inbox-source", "shop"),
        ("webhook-inbox-event-id", id),
        ("webhook-inbox-event-type", "order.completed"),
    ] {
        headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
    }
    let properties = BasicProperties::default()
        .with_message_id(webhook_id("shop", id).into())
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_headers(headers);
    rabbit
        .channel
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            properties,
        )
        .await
        .expect("publish");
}

fn consumer(url: &str, queue: &str, db: &Path, log: &Path) -> Child {
    let args = [
        "--url",
        url,
        "--queue",
        queue,
        "--prefetch",
        "20",
        "--wait",
        "0.3",
    ];
    example_consumer(AMQP_PYTHON, "amqp_consumer.py", &args, db, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_the_example_consumer_credits_each_order_once_through_sigkills() {
    let Some(url) = broker() else { return };
    if !crate::requires::available(
        "the RabbitMQ consumer example's Python environment",
        crate::requires::command(AMQP_PYTHON),
    ) {
        return;
    }
    let n = names();
    let rabbit = client(&url).await;
    rabbit.exchange(&n.exchange).await;
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;
    let app = app_with_bus(&url, &n, "").await;
    for i in 0..20 {
        let body = order_body(&format!("o-{i}"), &format!("c{}", i % 4), 10);
        app.deliver("shop", &format!("e-{i}"), &body).await;
        if i % 5 == 0 {
            app.deliver("shop", &format!("again-{i}"), &body).await;
        }
    }
    until_published(&app, 24, Duration::from_secs(30)).await;
    let key = format!("{}.shop.order_completed", n.prefix);
    for i in 0..MORE {
        let body = order_body(&format!("m-{i}"), &format!("c{}", i % 4), 1);
        let id = format!("m-{i}");
        publish_like_the_node(&rabbit, &n.exchange, &key, &id, &body).await;
        // Published twice, as after a confirm lost with a node.
        if i % 100 == 0 {
            publish_like_the_node(&rabbit, &n.exchange, &key, &id, &body).await;
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consumer.db");
    let log = dir.path().join("consumer.log");
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let events = (24 + MORE) as i64;
    let start = || consumer(&url, &n.queue, &db, &log);
    consume_through_kills(start, &db, events, KILLS, logs).await;
    let mut child = consumer(&url, &n.queue, &db, &log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while processed(&db) < events {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the consumer exited ({status}): {}", logs());
        }
        assert!(Instant::now() < deadline, "not consumed: {}", logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the last acks out, then stop it: nothing is left in the queue, taken or not.
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop_consumer(&mut child, logs);
    assert_eq!(rabbit.take_all(&n.queue).await.len(), 0, "left unacked");
    assert_credited_once(&db, MORE as i64);
    app.stop().await;
}
