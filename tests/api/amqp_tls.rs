//! An `amqp` subscription over `amqps://` to a RabbitMQ node whose certificate an internal CA
//! signed (made here with rcgen, a TLS listener of a node of the test's own): its attempts fail
//! with the certificate error without the subscription's `ca_file` (nothing published), and it
//! publishes once it names the CA.

use std::time::{Duration, Instant};

use lapin::tcp::OwnedTLSConfig;
use lapin::{Connection, ConnectionProperties};

use crate::amqp::{Client, app_with_bus, broker, names};
use crate::brokers::{
    PrivateBroker, RABBITMQ_TLS, send_orders, until_failed_with, until_published,
};
use crate::https::Pki;

/// The test's own client over TLS, trusting `ca_pem`; retried (bounded) while the broker's TLS
/// listener, which opens beside the plain one, is not yet up (seen taking over 20 s while the
/// whole suite ran).
async fn tls_client(url: &str, ca_pem: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let tls = OwnedTLSConfig {
            identity: None,
            cert_chain: Some(ca_pem.to_string()),
        };
        let runtime = lapin::runtime::default_runtime().unwrap();
        let properties = ConnectionProperties::default();
        match Connection::connect_with_config(url, properties, tls, runtime).await {
            Ok(connection) => return Client::over(connection).await,
            Err(e) => assert!(Instant::now() < deadline, "no TLS connection: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_amqps_with_an_internal_ca_needs_the_ca_file() {
    if broker().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let (cert, key, _) = pki.issue(dir.path(), "rabbitmq");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pki.ca_pem()).unwrap();
    let tls = format!("{} {}", cert.display(), key.display());
    let private =
        tokio::task::block_in_place(|| PrivateBroker::start_with(dir.path(), &RABBITMQ_TLS, &tls));
    assert!(private.url.starts_with("amqps://"), "{}", private.url);
    let rabbit = tls_client(&private.url, &pki.ca_pem()).await;
    let n = names();
    rabbit.exchange(&n.exchange).await;
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;

    let app = app_with_bus(&private.url, &n, "").await;
    send_orders(&app, "t", 3).await;
    let state = until_failed_with(&app, "t-0", "invalid peer certificate").await;
    let error = state["last_error"].as_str().unwrap();
    assert!(error.contains("could not connect to the broker"), "{error}");
    assert!(error.contains("UnknownIssuer"), "{error}");
    assert!(!error.contains("guest"), "the URL's credentials in {error}");
    let event = app.event("shop", "t-0").await;
    let history = event["history"].as_array().unwrap();
    assert!(
        history.iter().any(|h| h["error"]
            .as_str()
            .unwrap_or("")
            .contains("invalid peer certificate")),
        "{event}"
    );
    let view = app.get("/subscriptions/bus").await.body;
    assert_eq!(view["counts"]["completed"], 0, "{view}");
    assert!(rabbit.take_all(&n.queue).await.is_empty());

    let body = serde_json::json!({ "ca_file": ca.display().to_string() }).to_string();
    let changed = crate::registry_routes::patch(&app, "bus", &body).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    // Less than a lease (30 s): a failing attempt of the old settings still in flight when
    // the PATCH lands cannot open the breaker again, and a probe given back untried is due
    // at once (tests/api/breaker_fence.rs); what is left is a backoff (at most 400 ms).
    until_published(&app, 3, Duration::from_secs(20)).await;
    let messages = rabbit.take_all(&n.queue).await;
    assert_eq!(messages.len(), 3);
    app.stop().await;
}
