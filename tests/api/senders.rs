//! Sender allowlists (`allow_from`) and trusted proxies, over real HTTP from several loopback
//! addresses (the whole of 127.0.0.0/8 is local on Linux): a delivery from outside the list is
//! 403 `forbidden_sender`, stored nowhere and counted; forwarding headers count only from a
//! trusted proxy, and then the nearest untrusted hop is the sender.

use std::net::IpAddr;

use crate::helpers::*;

/// `shop` takes deliveries from 127.0.0.2 and 192.0.2.0/24 only; 127.0.0.4 and 127.0.0.5 are
/// trusted proxies, which set `X-Forwarded-For` (the default `forwarded_header`).
async fn guarded_app() -> TestApp {
    guarded_app_reading("").await
}

/// [`guarded_app`] with `extra` top-level settings (`forwarded_header = "forwarded"`).
async fn guarded_app_reading(extra: &str) -> TestApp {
    spawn_app_with(
        |config| {
            *config = config
                .replacen(
                    "admin_token =",
                    &format!(
                        "trusted_proxies = [\"127.0.0.4\", \"127.0.0.5/32\"]\n{extra}\nadmin_token ="
                    ),
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
    let cases: [Case; 6] = [
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
        // A hop the proxy could not name: nobody can say who sent it.
        (
            "unknown",
            "127.0.0.4",
            &[("x-forwarded-for", "unknown")],
            403,
        ),
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

/// The documented nginx sets `X-Forwarded-For` and passes on whatever `Forwarded` the client
/// wrote: only the header the operator names in `forwarded_header` is read, so a client cannot
/// name itself through the other one.
#[tokio::test]
async fn only_the_header_the_proxy_sets_names_the_sender() {
    let app = guarded_app().await;
    let cases: [Case; 3] = [
        // The client wrote `Forwarded` itself; nginx appended the real peer to X-Forwarded-For.
        (
            "xff-spoofed",
            "127.0.0.4",
            &[
                ("forwarded", "for=192.0.2.5"),
                ("x-forwarded-for", "198.51.100.1"),
            ],
            403,
        ),
        // nginx always sets X-Forwarded-For; without it the proxy is the sender.
        (
            "xff-absent",
            "127.0.0.4",
            &[("forwarded", "for=192.0.2.5")],
            403,
        ),
        (
            "xff-inside",
            "127.0.0.4",
            &[
                ("forwarded", "for=198.51.100.1"),
                ("x-forwarded-for", "192.0.2.5"),
            ],
            200,
        ),
    ];
    for (id, from, headers, status) in cases {
        let r = send_from(&app, from, id, headers).await;
        assert_eq!(r.status, status, "{id}: {}", r.body);
    }

    // A proxy that sets RFC 7239 `Forwarded`: X-Forwarded-For is the client's own.
    let app = guarded_app_reading("forwarded_header = \"forwarded\"").await;
    let cases: [Case; 5] = [
        (
            "fwd-spoofed",
            "127.0.0.4",
            &[
                ("x-forwarded-for", "192.0.2.5"),
                ("forwarded", "for=198.51.100.1"),
            ],
            403,
        ),
        (
            "fwd-absent",
            "127.0.0.4",
            &[("x-forwarded-for", "192.0.2.5")],
            403,
        ),
        (
            "fwd-inside",
            "127.0.0.5",
            &[
                ("forwarded", "for=\"192.0.2.77:1234\";proto=https"),
                ("x-forwarded-for", "198.51.100.1"),
            ],
            200,
        ),
        (
            "fwd-unknown",
            "127.0.0.4",
            &[("forwarded", "for=unknown")],
            403,
        ),
        // Still never read from a peer that is not a trusted proxy.
        (
            "fwd-untrusted",
            "127.0.0.3",
            &[("forwarded", "for=192.0.2.5")],
            403,
        ),
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
    let config = format!("forwarded_header = \"x-real-ip\"\n{}", test_config(&dir));
    let err = webhook_inbox::config::Settings::from_toml(&config, "t", vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("forwarded_header") && err.contains("x-real-ip"),
        "{err}"
    );
    let env = vec![(
        "WEBHOOK_INBOX_FORWARDED_HEADER".to_string(),
        "forwarded".to_string(),
    )];
    let settings =
        webhook_inbox::config::Settings::from_toml(&test_config(&dir), "t", env).unwrap();
    let settings = format!("{settings:?}");
    assert!(
        settings.contains("forwarded_header: Forwarded"),
        "{settings}"
    );
}
