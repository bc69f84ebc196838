//! Sender allowlists (`allow_from`) and trusted proxies, over real HTTP from several loopback
//! addresses (the whole of 127.0.0.0/8 is local on Linux): a delivery from outside the list is
//! 403 `forbidden_sender`, stored nowhere and counted; forwarding headers count only from a
//! trusted proxy, and then the nearest untrusted hop is the sender.

use std::net::IpAddr;

use crate::helpers::*;

/// `shop` takes deliveries from 127.0.0.2 and 192.0.2.0/24 only; 127.0.0.4 and 127.0.0.5 are
/// trusted proxies.
async fn guarded_app() -> TestApp {
    spawn_app_with(
        |config| {
            *config = config
                .replacen(
                    "admin_token =",
                    "trusted_proxies = [\"127.0.0.4\", \"127.0.0.5/32\"]\nadmin_token =",
                    1,
                )
                .replacen(
                    "name = \"shop\"\n",
                    "name = \"shop\"\nallow_from = [\"127.0.0.2\", \"192.0.2.0/24\"]\n",
                    1,
                );
        },
        Default::default(),
    )
    .await
}

/// A signed delivery to `shop` sent from the local address `from`, with extra headers.
async fn send_from(app: &TestApp, from: &str, event_id: &str, headers: &[(&str, &str)]) -> Reply {
    let client = reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .build()
        .unwrap();
    let body = order_body(&format!("o-{event_id}"), "c-1", 1);
    let mut req = client
        .post(app.url("/webhooks/shop"))
        .header("content-type", "application/json")
        .body(body.clone());
    for (k, v) in sign_for(&app.settings, "shop", event_id, body.as_bytes()) {
        req = req.header(k, v);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let body = r.json().await.unwrap();
    Reply {
        status,
        body,
        headers: Default::default(),
    }
}

#[tokio::test]
async fn deliveries_from_outside_allow_from_are_refused_and_stored_nowhere() {
    let app = guarded_app().await;
    let r = send_from(&app, "127.0.0.2", "allowed", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "queued");

    let r = send_from(&app, "127.0.0.3", "outsider", &[]).await;
    r.assert_error(403, "forbidden_sender");
    assert!(r.body["message"].as_str().unwrap().contains("127.0.0.3"));
    // Spoofed forwarding headers from an untrusted peer are not read.
    let spoofed = [
        ("x-forwarded-for", "127.0.0.2"),
        ("forwarded", "for=127.0.0.2"),
    ];
    let r = send_from(&app, "127.0.0.3", "spoofed", &spoofed).await;
    r.assert_error(403, "forbidden_sender");

    for id in ["outsider", "spoofed"] {
        assert_eq!(app.get(&format!("/events/shop/{id}")).await.status, 404);
    }
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains(r#"webhook_inbox_deliveries_total{source="shop",result="forbidden"} 2"#),
        "{metrics}"
    );
    // Other sources keep taking deliveries from anywhere.
    let r = app.deliver("hmac", "anywhere", "{}").await;
    assert_ne!(r.status, 403, "{}", r.body);
}

/// Event id, local address, headers, expected status.
type Case = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    u16,
);

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_sender_is_checked() {
    let app = guarded_app().await;
    let cases: [Case; 7] = [
        // Through one trusted proxy: its header names the sender.
        (
            "one-hop",
            "127.0.0.4",
            &[("x-forwarded-for", "192.0.2.10")],
            200,
        ),
        (
            "one-hop-out",
            "127.0.0.4",
            &[("x-forwarded-for", "198.51.100.1")],
            403,
        ),
        // The client spoofed the leftmost entry; the proxy appended the real peer.
        (
            "spoofed-left",
            "127.0.0.4",
            &[("x-forwarded-for", "192.0.2.10, 198.51.100.1")],
            403,
        ),
        // Two trusted proxies in a row.
        (
            "two-hops",
            "127.0.0.4",
            &[("x-forwarded-for", "127.0.0.2, 127.0.0.5")],
            200,
        ),
        // RFC 7239, preferred over X-Forwarded-For.
        (
            "forwarded",
            "127.0.0.5",
            &[
                ("forwarded", "for=\"192.0.2.77:1234\";proto=https"),
                ("x-forwarded-for", "198.51.100.1"),
            ],
            200,
        ),
        // A hop the proxy could not name: nobody can say who sent it.
        ("unknown", "127.0.0.4", &[("forwarded", "for=unknown")], 403),
        // The proxy itself is not an allowed sender.
        ("proxy-itself", "127.0.0.4", &[], 403),
    ];
    for (id, from, headers, status) in cases {
        let r = send_from(&app, from, id, headers).await;
        assert_eq!(r.status, status, "{id}: {}", r.body);
        let stored = app.get(&format!("/events/shop/{id}")).await.status;
        assert_eq!(stored, if status == 200 { 200 } else { 404 }, "{id}");
    }
}

#[test]
fn a_bad_range_is_refused_at_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(&dir).replacen(
        "name = \"shop\"\n",
        "name = \"shop\"\nallow_from = [\"10.0.0.0/33\"]\n",
        1,
    );
    let err = webhook_inbox::config::Settings::from_toml(&config, "t", vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sources[0].allow_from") && err.contains("10.0.0.0/33"),
        "{err}"
    );
    let config = format!(
        "trusted_proxies = [\"proxy.internal\"]\n{}",
        test_config(&dir)
    );
    let err = webhook_inbox::config::Settings::from_toml(&config, "t", vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trusted_proxies") && err.contains("proxy.internal"),
        "{err}"
    );
}
