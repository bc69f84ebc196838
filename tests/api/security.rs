//! What an outsider controls (ids, types, headers, answers) kept in its place: ids that a
//! browser would normalise away are refused, the request id is a token or a new one, answers
//! with data are not cached or sniffed, and a refused delivery's headers stay bounded.

use serde_json::json;

use crate::helpers::*;

/// An hmac-sha256 delivery of `body` with `id` in `X-Event-Id` (none when empty).
async fn deliver_hmac(app: &TestApp, id: &str, body: &str) -> Reply {
    let mut headers = sign_for(&app.settings, "hmac", "x", body.as_bytes());
    headers.retain(|(k, _)| k != "X-Event-Id");
    if !id.is_empty() {
        headers.push(("X-Event-Id".into(), id.into()));
    }
    app.post_webhook("hmac", &headers, body.as_bytes()).await
}

/// `/events/shop/../retry` is `/events/retry` to a browser: an id made only of dots would turn
/// one row's Retry into a retry of every failed event. It is refused at ingest with its own
/// code (`missing_event_id` is for an id that is not there), from a header and from a body.
#[tokio::test]
async fn event_ids_made_only_of_dots_are_refused() {
    let app = spawn_app().await;
    let body = json!({"type": "order.completed"}).to_string();
    for id in [".", "..", "...", " .. "] {
        let r = deliver_hmac(&app, id, &body).await;
        r.assert_error(400, "invalid_event_id");
        assert!(
            r.body["message"].as_str().unwrap().contains("dots"),
            "{}",
            r.body
        );
        // Standard Webhooks signs the id, and refuses it all the same.
        if id.trim() == id {
            let r = app.deliver("shop", id, &body).await;
            r.assert_error(400, "invalid_event_id");
        }
    }
    let r = deliver_hmac(
        &app,
        "",
        &json!({"event_id": "..", "type": "x"}).to_string(),
    )
    .await;
    r.assert_error(400, "invalid_event_id");
    // Too long is not missing either.
    let r = deliver_hmac(&app, &"x".repeat(256), &body).await;
    r.assert_error(400, "invalid_event_id");
    // Dots among other characters are an ordinary id, reached through an escaped path too.
    for id in ["..a", "a.b", ".x."] {
        assert_eq!(deliver_hmac(&app, id, &body).await.status, 200);
    }
    let r = app.get("/events/hmac/%2E%2Ea").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["event_id"], "..a");
    let r = app.get("/events/hmac/a%2Eb").await;
    assert_eq!(r.body["event_id"], "a.b", "{}", r.body);
    assert_eq!(app.count("SELECT count(*) FROM events"), 3);
}

/// hmac-sha256 signs the body only: `X-Event-Id` beside it is not covered, so the body's
/// `event_id`, when there is one, is the id; the header is the fallback.
#[tokio::test]
async fn hmac_sha256_prefers_the_signed_body_event_id() {
    let app = spawn_app().await;
    let body = json!({"event_id": "in-body", "type": "x"}).to_string();
    let r = deliver_hmac(&app, "in-header", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["event_id"], "in-body");
    // The same signed body replayed under another header id is a duplicate, not a new event.
    let r = deliver_hmac(&app, "another", &body).await;
    assert_eq!(r.body["status"], "duplicate", "{}", r.body);
    let r = deliver_hmac(&app, "only-header", &json!({"type": "x"}).to_string()).await;
    assert_eq!(r.body["event_id"], "only-header", "{}", r.body);
    assert_eq!(app.count("SELECT count(*) FROM events"), 2);
}

/// An event `type` longer than 256 characters is refused, from a body and from a header.
#[tokio::test]
async fn an_overlong_event_type_is_400() {
    let app = spawn_app().await;
    let long = "t".repeat(257);
    let r = deliver_hmac(&app, "long-type", &json!({"type": long}).to_string()).await;
    r.assert_error(400, "invalid_event_type");
    let ok = "t".repeat(256);
    let r = deliver_hmac(&app, "max-type", &json!({"type": ok}).to_string()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let body = br#"{"zen":"x"}"#;
    let mut headers = sign_for(&app.settings, "github", "gh-long", body);
    for (k, v) in headers.iter_mut() {
        if k.eq_ignore_ascii_case("X-GitHub-Event") {
            *v = long.clone();
        }
    }
    let r = app.post_webhook("github", &headers, body).await;
    r.assert_error(400, "invalid_event_type");
    assert_eq!(app.count("SELECT count(*) FROM events"), 1);
}

async fn request_id_for(app: &TestApp, given: &str) -> String {
    let r = app
        .client
        .get(app.url("/healthz"))
        .header("x-request-id", given)
        .send()
        .await
        .unwrap();
    r.headers()["x-request-id"].to_str().unwrap().to_string()
}

/// A request id is logged and echoed: only a token-like one is taken, else a new one is made.
#[tokio::test]
async fn only_a_token_like_request_id_is_taken() {
    let app = spawn_app().await;
    for good in ["abc-123", "req_1.2", &"a".repeat(128)] {
        assert_eq!(request_id_for(&app, good).await, good);
    }
    for bad in ["a b", "a=b", "x\"y", "k:v", &"a".repeat(129)] {
        let id = request_id_for(&app, bad).await;
        assert_ne!(id, bad);
        assert_eq!(id.len(), 36, "{id}");
    }
}

/// A delivery's answer (SPEC section 3), stored or duplicate, says it is JSON and carries the
/// headers every answer carries.
#[tokio::test]
async fn a_delivery_answer_is_json_with_the_common_headers() {
    let app = spawn_app().await;
    for status in ["queued", "duplicate"] {
        let r = app.deliver("shop", "h1", &order_body("o", "c", 1)).await;
        assert_eq!(r.body["status"], status, "{}", r.body);
        assert_eq!(r.headers["content-type"], "application/json", "{status}");
        assert_eq!(r.headers["cache-control"], "no-store", "{status}");
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{status}");
        assert_eq!(r.headers["x-request-id"].len(), 36, "{status}");
    }
}

/// Answers carrying events, refusals or settings are neither cached nor sniffed; errors do not
/// reflect the request's path back.
#[tokio::test]
async fn authenticated_answers_are_not_cached_or_sniffed() {
    let app = spawn_app().await;
    app.deliver("shop", "e1", &order_body("o", "c", 1)).await;
    for path in [
        "/events",
        "/events/export",
        "/events/stats",
        "/events/shop/e1",
        "/rejections",
        "/subscriptions",
        "/loyalty/c",
        "/events/shop/missing",
    ] {
        let r = app
            .client
            .get(app.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        let h = r.headers();
        assert_eq!(h["cache-control"], "no-store", "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
    }
    let r = app.admin_post("/events/retry", Some(json!({}))).await;
    assert_eq!(r.headers["cache-control"], "no-store", "{}", r.body);

    let probe = "/no-such-route/%3Cscript%3E";
    let r = app.get(probe).await;
    r.assert_error(404, "not_found");
    let message = r.body["message"].as_str().unwrap();
    assert!(
        !message.contains("no-such-route") && !message.contains("script"),
        "{message}"
    );
    let r = app.get("/webhooks/shop-echo").await;
    assert_eq!(r.status, 405);
    assert!(
        !r.body["message"].as_str().unwrap().contains("shop-echo"),
        "{}",
        r.body
    );
}

/// A header repeated many times in a refused delivery is kept joined, under the same cap as
/// one value.
#[tokio::test]
async fn a_repeated_header_in_a_refused_delivery_stays_capped() {
    let app = spawn_app().await;
    let mut req = app
        .client
        .post(app.url("/webhooks/shop"))
        .header("content-type", "application/json")
        .body("{}");
    for i in 0..80 {
        req = req.header("x-repeat", format!("value-{i:04}-{}", "r".repeat(40)));
    }
    assert_eq!(req.send().await.unwrap().status(), 401);
    let mut kept = json!(null);
    for _ in 0..100 {
        let r = app.get("/rejections").await;
        if let Some(first) = r.body["rejections"].as_array().and_then(|a| a.first()) {
            kept = first.clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let value = kept["headers"]["x-repeat"]
        .as_str()
        .unwrap_or_else(|| panic!("no x-repeat kept: {kept}"));
    assert!(
        value.chars().count() <= 256,
        "{} characters kept",
        value.len()
    );
}

/// An endpoint that answers every call 500 with a body that claims 8 MB, sends 1 MB of it and
/// then holds the connection open without sending more.
fn endless_500() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(50) {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 8192];
                // The request's head and body (its Content-Length), then the answer.
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let head = "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n\
                            content-length: 8388608\r\n\r\n";
                let _ = stream.write_all(head.as_bytes());
                let chunk = "boom ".repeat(1000);
                for _ in 0..200 {
                    if stream.write_all(chunk.as_bytes()).is_err() {
                        return;
                    }
                }
                std::thread::sleep(std::time::Duration::from_secs(10));
            });
        }
    });
    url
}

/// Issue 57: the forwarder keeps the start of a failed answer for the history and drops the
/// rest unread; an endpoint's endless body neither fills memory nor holds the call to its
/// timeout.
#[tokio::test]
async fn a_huge_failed_answer_is_read_only_as_far_as_the_history_needs() {
    let url = endless_500();
    let app = spawn_app_with(
        |c| {
            *c = c.replace("workers = 0", "workers = 1");
            c.push_str(&format!(
                "\n[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\nsources = [\"shop\"]\n\
                 url = \"{url}\"\nsigning_secret = \"{SW_SECRET}\"\ntimeout_ms = 4000\n"
            ));
        },
        webhook_inbox::startup::BuildOptions {
            idle_poll: Some(std::time::Duration::from_millis(50)),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(app.deliver("shop", "big-500", "{}").await.status, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let attempt = loop {
        let event = app.event("shop", "big-500").await;
        let done = event["history"].as_array().and_then(|h| {
            h.iter()
                .find(|a| a["subscription"] == "billing" && !a["finished_at"].is_null())
                .cloned()
        });
        if let Some(a) = done {
            break a;
        }
        assert!(std::time::Instant::now() < deadline, "no attempt: {event}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let error = attempt["error"].as_str().unwrap();
    assert!(
        error.contains("500") && error.contains("boom boom"),
        "{attempt}"
    );
    assert!(error.len() < 1024, "{} bytes kept", error.len());
    let ms = |v: &serde_json::Value| {
        time::OffsetDateTime::parse(
            v.as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
        .unix_timestamp_nanos()
            / 1_000_000
    };
    let took = ms(&attempt["finished_at"]) - ms(&attempt["started_at"]);
    assert!(took < 2_000, "the call took {took} ms: {attempt}");
    app.stop().await;
}

/// A wrong token waits for its 401, on the admin, submission and pull routes; a missing one is
/// answered at once (checks that a route needs a token stay fast).
#[tokio::test]
async fn a_wrong_token_is_answered_slowly() {
    use std::time::{Duration, Instant};
    let app = spawn_app().await;
    let cases = [
        ("GET", "/events"),
        ("POST", "/requests"),
        ("POST", "/subscriptions/nobody/claim"),
    ];
    for (method, path) in cases {
        for (token, slow) in [(Some("a-wrong-token-guess"), true), (None, false)] {
            let mut req = app
                .client
                .request(method.parse().unwrap(), app.url(path))
                .json(&json!({}));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let started = Instant::now();
            let status = req.send().await.unwrap().status();
            let took = started.elapsed();
            assert_eq!(status, 401, "{method} {path}");
            if slow {
                assert!(
                    took >= Duration::from_millis(190),
                    "{method} {path}: {took:?}"
                );
            } else {
                assert!(
                    took < Duration::from_millis(150),
                    "{method} {path}: {took:?}"
                );
            }
        }
    }
}
