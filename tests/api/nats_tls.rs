//! A `nats` subscription over `tls://` to a broker whose certificate an internal CA signed
//! (made here with rcgen): refused without the subscription's `ca_file` (a failed attempt
//! naming the connect), published once it names the CA.

use std::time::{Duration, Instant};

use crate::brokers::{NATS, PrivateBroker, send_orders, until_published};
use crate::https::Pki;
use crate::nats::{app_with_bus, broker, make_stream, stored, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_tls_with_an_internal_ca_needs_the_ca_file() {
    if broker().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let (cert, key, _) = pki.issue(dir.path(), "nats");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pki.ca_pem()).unwrap();
    let options = format!(
        "--tls --tlscert {} --tlskey {}",
        cert.display(),
        key.display()
    );
    let private =
        tokio::task::block_in_place(|| PrivateBroker::start_with(dir.path(), &NATS, &options));
    let url = private.url.replacen("nats://", "tls://", 1);
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(ca.clone())
        .require_tls(true)
        .connect(url.as_str())
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let (name, prefix) = (unique("S"), unique("p"));
    make_stream(&js, &name, &prefix).await;
    let app = app_with_bus(&url, &prefix, "").await;
    send_orders(&app, "t", 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let event = app.event("shop", "t-0").await.to_string();
        if event.contains("could not connect to the broker") {
            break;
        }
        assert!(Instant::now() < deadline, "no failed connect: {event}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = serde_json::json!({ "ca_file": ca.display().to_string() }).to_string();
    let changed = crate::registry_routes::patch(&app, "bus", &body).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(changed.body["ca_file"], ca.display().to_string());
    until_published(&app, 1, Duration::from_secs(30)).await;
    assert_eq!(stored(&js, &name).await.len(), 1);
    app.stop().await;
}
