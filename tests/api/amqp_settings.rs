//! An `amqp` subscription's settings through the API and the CLI (no broker needed): what the
//! config refuses is refused naming the key, and a good one is shown without its credentials.

use serde_json::json;

use crate::helpers::*;
use crate::registry_routes::{assert_names, create};

/// The API refuses what the config refuses, naming the key; a good one is shown with its
/// broker's origin (never the credentials), exchange and routing key (no broker needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_bad_settings_are_refused_in_the_api_naming_the_key() {
    let app = spawn_app().await;
    let good = json!({"name": "bus", "kind": "amqp", "url": "amqp://u:pw@127.0.0.1:5672/%2f",
                      "exchange": "", "routing_key": "hooks.{source}.{type}"});
    for (field, value) in [
        ("url", json!("nats://127.0.0.1:4222")),
        ("url", json!("amqp://")),
        ("exchange", json!("a b")),
        ("routing_key", json!("hooks.{id}")),
        ("routing_key", json!("k".repeat(256))),
        ("subject", json!("a")),
        ("signing_secret", json!(SW_SECRET)),
        ("timeout_ms", json!(0)),
    ] {
        let mut body = good.clone();
        body[field] = value;
        assert_names(&create(&app, body).await, field);
    }
    for missing in ["exchange", "routing_key", "url"] {
        let mut body = good.clone();
        body.as_object_mut().unwrap().remove(missing);
        assert_names(&create(&app, body).await, missing);
    }
    let on_nats = json!({"name": "n", "kind": "nats", "url": "nats://127.0.0.1:4222",
                         "subject": "a", "exchange": "x"});
    assert_names(&create(&app, on_nats).await, "exchange");
    let made = create(&app, good).await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["url_origin"], "amqp://127.0.0.1:5672");
    assert_eq!(made.body["exchange"], "");
    assert_eq!(made.body["routing_key"], "hooks.{source}.{type}");
    assert!(!made.body.to_string().contains("pw"), "{}", made.body);
    let patched = crate::registry_routes::patch(&app, "bus", r#"{"routing_key": "{x}"}"#).await;
    assert_names(&patched, "routing_key");
    app.stop().await;
}

/// The CLI's `--exchange` and `--routing-key` become the fields (no broker needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_the_cli_creates_an_amqp_subscription() {
    let app = spawn_app().await;
    let args = [
        "subscriptions",
        "create",
        "bus",
        "--kind",
        "amqp",
        "--endpoint-url",
        "amqp://127.0.0.1:5672",
        "--exchange",
        "webhooks",
        "--routing-key",
        "hooks.{type}",
    ];
    let made = crate::cli::cli(&app, &args).await;
    assert!(made.status.success(), "{made:?}");
    let shown = app.get("/subscriptions/bus").await.body;
    assert_eq!(shown["kind"], "amqp");
    assert_eq!(shown["exchange"], "webhooks");
    assert_eq!(shown["routing_key"], "hooks.{type}");
    let update = ["subscriptions", "update", "bus", "--exchange", "a b"];
    let refused = crate::cli::cli(&app, &update).await;
    assert!(!refused.status.success());
    assert!(
        crate::cli::stderr(&refused).contains("exchange"),
        "{refused:?}"
    );
    app.stop().await;
}
