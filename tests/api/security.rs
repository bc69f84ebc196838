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
        assert!(r.body["message"].as_str().unwrap().contains("dots"), "{}", r.body);
        // Standard Webhooks signs the id, and refuses it all the same.
        if id.trim() == id {
            let r = app.deliver("shop", id, &body).await;
            r.assert_error(400, "invalid_event_id");
        }
    }
    let r = deliver_hmac(&app, "", &json!({"event_id": "..", "type": "x"}).to_string()).await;
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
