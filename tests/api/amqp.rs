//! Subscriptions of kind `amqp` (SPEC section 13) against a real RabbitMQ node (the one
//! `scripts/with-rabbitmq` starts): every event reaches the queue once with its properties and
//! headers, read back by a consumer here; a missing exchange and then a routing key no queue is
//! bound to fail attempts with their cause (exchange and key named), open the breaker, and
//! deliver once the queue is bound; a paused subscription publishes nothing; ordering per key
//! holds in the queue. Bad settings: amqp_settings.rs.

use std::collections::HashMap;
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use webhook_inbox::forward::call::webhook_id;

use crate::brokers::{
    ORDERED_BY, TRACEPARENT, app_with_table, assert_in_key_order, send_keyed_orders, send_orders,
    send_traced, until_failed_with, until_published,
};
use crate::helpers::*;
use crate::nats::unique;

/// The shared node's URL (`TEST_AMQP_URL`), or `None`: the test was skipped (or, under
/// `TEST_REQUIRE_ALL`, has failed).
pub fn broker() -> Option<String> {
    let url = std::env::var("TEST_AMQP_URL").ok();
    let found = url.as_ref().map(|_| ()).ok_or_else(|| {
        "TEST_AMQP_URL is not set (run scripts/with-rabbitmq cargo nextest run)".into()
    });
    crate::requires::available("a RabbitMQ node", found).then(|| url.unwrap())
}

/// The test's own connection and channel (kept together: dropping the connection closes it).
pub struct Client {
    _connection: Connection,
    pub channel: Channel,
}

pub async fn client(url: &str) -> Client {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to the broker");
    Client::over(connection).await
}

impl Client {
    pub async fn over(connection: Connection) -> Client {
        let channel = connection.create_channel().await.expect("a channel");
        Client {
            _connection: connection,
            channel,
        }
    }

    /// A durable topic exchange.
    pub async fn exchange(&self, name: &str) {
        self.channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the exchange");
    }

    /// A durable queue bound to `exchange` for every key under `prefix`.
    pub async fn queue(&self, name: &str, exchange: &str, prefix: &str) {
        self.channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the queue");
        self.channel
            .queue_bind(
                name.into(),
                exchange.into(),
                format!("{prefix}.#").into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the queue");
    }

    /// Every message the queue holds, in order, taken out of it: the test's consumer.
    pub async fn take_all(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut all = Vec::new();
        // Bounded: a queue of a test holds a few hundred messages at most.
        for _ in 0..100_000 {
            let got = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get");
            match got {
                Some(m) => all.push(m.delivery),
                None => return all,
            }
        }
        panic!("the queue does not run dry");
    }
}

pub fn header(m: &lapin::message::Delivery, name: &str) -> String {
    let value = m
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name).cloned());
    match value {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

pub fn message_id(m: &lapin::message::Delivery) -> String {
    m.properties
        .message_id()
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// How many messages each `message_id` has: a duplicate carries the same id.
pub fn copies(messages: &[lapin::message::Delivery]) -> HashMap<String, usize> {
    let mut by_id = HashMap::new();
    for m in messages {
        *by_id.entry(message_id(m)).or_insert(0) += 1;
    }
    by_id
}

/// The `[[subscriptions]]` table of an `amqp` subscription `bus` taking `shop`'s events.
pub fn bus_table(url: &str, exchange: &str, prefix: &str, extra: &str) -> String {
    format!(
        r#"
[[subscriptions]]
name = "bus"
kind = "amqp"
sources = ["shop"]
url = "{url}"
exchange = "{exchange}"
routing_key = "{prefix}.{{source}}.{{type}}"
timeout_ms = 1500
backoff_base_ms = 50
backoff_max_ms = 400
max_attempts = 200
{extra}
"#
    )
}

/// A fresh exchange, queue and key prefix on the shared node.
pub struct Names {
    pub exchange: String,
    pub queue: String,
    pub prefix: String,
}

pub fn names() -> Names {
    Names {
        exchange: unique("x"),
        queue: unique("q"),
        prefix: unique("p"),
    }
}

pub async fn app_with_bus(url: &str, n: &Names, extra: &str) -> TestApp {
    app_with_table(bus_table(url, &n.exchange, &n.prefix, extra)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_every_event_reaches_the_queue_once_with_its_properties() {
    let Some(url) = broker() else { return };
    let n = names();
    let rabbit = client(&url).await;
    rabbit.exchange(&n.exchange).await;
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;
    let app = app_with_bus(&url, &n, "").await;
    let sent = send_orders(&app, "e", 20).await;
    // Another source's event is not `bus`'s.
    let other = order_body("x", "c1", 1);
    assert_eq!(
        app.deliver("strict", "s-1", &other).await.body["status"],
        "queued"
    );
    let view = until_published(&app, 20, Duration::from_secs(30)).await;
    // Shown without the URL's credentials.
    assert_eq!(
        view["url_origin"],
        url.replace("guest:guest@", "").trim_end_matches("/%2f")
    );
    assert_eq!(view["exchange"], n.exchange.as_str(), "{view}");
    assert_eq!(
        view["routing_key"],
        format!("{}.{{source}}.{{type}}", n.prefix)
    );
    let messages = rabbit.take_all(&n.queue).await;
    assert_eq!(messages.len(), 20);
    assert!(copies(&messages).values().all(|c| *c == 1), "a duplicate");
    for (id, body) in &sent {
        let m = messages
            .iter()
            .find(|m| header(m, "webhook-inbox-event-id") == *id)
            .unwrap_or_else(|| panic!("{id} is not in the queue"));
        assert_eq!(message_id(m), webhook_id("shop", id));
        assert_eq!(
            m.routing_key.as_str(),
            format!("{}.shop.order_completed", n.prefix)
        );
        assert_eq!(m.exchange.as_str(), n.exchange);
        assert_eq!(*m.properties.delivery_mode(), Some(2), "persistent");
        let content_type = m.properties.content_type().as_ref().map(|c| c.to_string());
        assert_eq!(content_type.as_deref(), Some("application/json"));
        assert_eq!(header(m, "webhook-inbox-source"), "shop");
        assert_eq!(header(m, "webhook-inbox-event-type"), "order.completed");
        assert_eq!(header(m, "webhook-inbox-attempt"), "1");
        assert_eq!(m.data, body.as_bytes());
    }
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains(r#"webhook_inbox_forwards_total{subscription="bus",result="acked"} 20"#),
        "{metrics}"
    );
    app.stop().await;
}

/// No exchange yet: the broker closes the channel, each attempt fails naming the exchange, and
/// the run of failures opens the breaker. The exchange alone, with no queue bound, returns
/// every message (`mandatory`): a failed attempt naming the exchange and the routing key, never
/// completed. Once a queue is bound, the probe closes the breaker and each event arrives once.
/// Seen failing without `mandatory` (the unroutable events were completed, and lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_an_unroutable_key_is_a_failed_attempt_naming_exchange_and_key() {
    let Some(url) = broker() else { return };
    let n = names();
    let app = app_with_bus(&url, &n, "").await;
    send_orders(&app, "m", 8).await;
    let state = until_failed_with(&app, "m-0", "NOT_FOUND").await;
    assert!(
        state["last_error"].as_str().unwrap().contains(&n.exchange),
        "{state}"
    );
    let rabbit = client(&url).await;
    rabbit.exchange(&n.exchange).await;
    let key = format!("{}.shop.order_completed", n.prefix);
    let state = until_failed_with(&app, "m-0", "returned the message").await;
    let error = state["last_error"].as_str().unwrap();
    assert!(
        error.contains(&format!("exchange `{}`", n.exchange)),
        "{error}"
    );
    assert!(error.contains(&format!("routing key `{key}`")), "{error}");
    assert!(error.contains("NO_ROUTE"), "{error}");
    assert_ne!(state["status"], "completed", "{state}");
    let view = app.get("/subscriptions/bus").await.body;
    assert_eq!(view["counts"]["completed"], 0, "{view}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while app.get("/subscriptions/bus").await.body["state"] != "probing" {
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker did not open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;
    let view = until_published(&app, 8, Duration::from_secs(30)).await;
    assert_eq!(view["state"], "active", "{view}");
    let messages = rabbit.take_all(&n.queue).await;
    assert_eq!(messages.len(), 8);
    assert_eq!(copies(&messages).len(), 8);
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains(r#"webhook_inbox_forwards_total{subscription="bus",result="refused"}"#),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_paused_subscription_publishes_nothing_until_resumed() {
    let Some(url) = broker() else { return };
    let n = names();
    let rabbit = client(&url).await;
    rabbit.exchange(&n.exchange).await;
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;
    let app = app_with_bus(&url, &n, "").await;
    let paused = app.admin_post("/subscriptions/bus/pause", None).await;
    assert_eq!(paused.status, 200);
    send_orders(&app, "p", 5).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        rabbit.take_all(&n.queue).await.len(),
        0,
        "published while paused"
    );
    let resumed = app.admin_post("/subscriptions/bus/resume", None).await;
    assert_eq!(resumed.status, 200);
    until_published(&app, 5, Duration::from_secs(30)).await;
    assert_eq!(copies(&rabbit.take_all(&n.queue).await).len(), 5);
    app.stop().await;
}

/// `ordered_by`: the events of one key reach the queue in the order they were stored, also
/// when the first attempts failed (no queue bound yet) and the backlog then flows at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_ordered_by_keeps_each_keys_order_in_the_queue() {
    let Some(url) = broker() else { return };
    let n = names();
    let rabbit = client(&url).await;
    rabbit.exchange(&n.exchange).await;
    let app = app_with_bus(&url, &n, ORDERED_BY).await;
    send_keyed_orders(&app).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;
    until_published(&app, 30, Duration::from_secs(30)).await;
    let messages = rabbit.take_all(&n.queue).await;
    assert_eq!(copies(&messages).len(), 30);
    let keyed: Vec<_> = messages
        .iter()
        .map(|m| {
            let body = String::from_utf8_lossy(&m.data).into_owned();
            (body, header(m, "webhook-inbox-event-id"))
        })
        .collect();
    assert_in_key_order(&keyed);
    app.stop().await;
}

/// A provider's W3C `traceparent`, stored with the event, rides on the message's headers (SPEC
/// section 15), passed on unchanged with tracing off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_providers_traceparent_rides_on_the_message() {
    let Some(url) = broker() else { return };
    let n = names();
    let rabbit = client(&url).await;
    rabbit.exchange(&n.exchange).await;
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;
    let app = app_with_bus(&url, &n, "").await;
    send_traced(&app).await;
    let messages = rabbit.take_all(&n.queue).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(header(&messages[0], "traceparent"), TRACEPARENT);
    app.stop().await;
}
