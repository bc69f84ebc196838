//! The publishes of an `amqp` subscription in flight, each on a confirm channel of its own
//! (src/forward/amqp.rs): a `basic.return` among many confirms in flight fails exactly the
//! event that was returned, never a routable one beside it.

use std::time::{Duration, Instant};

use crate::amqp::{app_with_bus, broker, client, copies, header, names};
use crate::helpers::*;

/// A backlog of 200 events flows with 4 publishes in flight; every second one is of another
/// type, whose routing key no queue is bound to. Each of those fails with the broker's return
/// naming its own key and is never completed; each of the 100 others is completed on its first
/// attempt and is in the queue once. Seen failing, 4 runs in 4, with every publish on one
/// shared channel (main at f04f8e5): RabbitMQ acks an unroutable publish together with the
/// routable ones confirmed before it (`multiple`), lapin gave its return to one of those, and
/// the unroutable event was completed on its next attempt without a return: lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_return_among_many_publishes_in_flight_fails_exactly_its_event() {
    let Some(url) = broker() else { return };
    let n = names();
    let rabbit = client(&url).await;
    rabbit.exchange(&n.exchange).await;
    let routable = format!("{}.shop.order_completed", n.prefix);
    rabbit.queue(&n.queue, &n.exchange, &routable).await;
    let app = app_with_bus(&url, &n, "concurrency = 4").await;
    assert_eq!(
        app.admin_post("/subscriptions/bus/pause", None)
            .await
            .status,
        200
    );
    let mut unroutable = Vec::new();
    for i in 0..200 {
        let id = format!("r-{i}");
        let mut body: serde_json::Value =
            serde_json::from_str(&order_body(&format!("o-{id}"), "c1", 1)).unwrap();
        if i % 2 == 1 {
            body["type"] = "order.refunded".into();
            unroutable.push(id.clone());
        }
        let delivered = app.deliver("shop", &id, &body.to_string()).await;
        assert_eq!(delivered.body["status"], "queued");
    }
    // Resumed with the whole backlog stored: the publishes go out 4 at a time.
    assert_eq!(
        app.admin_post("/subscriptions/bus/resume", None)
            .await
            .status,
        200
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = app.get("/subscriptions/bus").await.body;
        if view["counts"]["completed"] == 100 {
            break;
        }
        assert!(Instant::now() < deadline, "not published: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refunded = format!("routing key `{}.shop.order_refunded`", n.prefix);
    for id in &unroutable {
        let state = crate::brokers::until_failed_with(&app, id, "returned the message").await;
        let error = state["last_error"].as_str().unwrap();
        assert!(error.contains(&refunded), "{id}: {error}");
        assert_ne!(state["status"], "completed", "{id} was lost: {state}");
    }
    let messages = rabbit.take_all(&n.queue).await;
    assert_eq!(messages.len(), 100);
    assert_eq!(copies(&messages).len(), 100, "a duplicate");
    for m in &messages {
        let id = header(m, "webhook-inbox-event-id");
        assert!(!unroutable.contains(&id), "{id} was routed");
        let event = app.event("shop", &id).await;
        let bus = event["subscriptions"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == "bus").cloned())
            .unwrap();
        assert_eq!(bus["status"], "completed", "{id}: {bus}");
        assert_eq!(bus["attempts"], 1, "{id} failed an attempt: {bus}");
    }
    app.stop().await;
}
