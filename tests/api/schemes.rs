//! Each scheme end to end over HTTP, including independent vectors without a timestamp (their
//! signatures do not expire) and GitHub's form-encoded deliveries.

use serde_json::json;

use crate::helpers::*;

#[derive(serde::Deserialize)]
struct Vector {
    name: String,
    scheme: String,
    secret: String,
    body: String,
    headers: std::collections::BTreeMap<String, String>,
    valid: bool,
}

#[tokio::test]
async fn untimed_independent_vectors_are_accepted_or_refused_over_http() {
    let file: serde_json::Value =
        serde_json::from_str(include_str!("../vectors/signatures.json")).unwrap();
    let vectors: Vec<Vector> = serde_json::from_value(file["vectors"].clone()).unwrap();
    let untimed: Vec<&Vector> = vectors
        .iter()
        .filter(|v| matches!(v.scheme.as_str(), "github" | "shopify" | "hmac-sha256"))
        .collect();
    assert!(untimed.len() >= 15);
    // One source per vector, configured with that vector's secret.
    let mut sources = String::new();
    for (i, v) in untimed.iter().enumerate() {
        sources.push_str(&format!(
            "[[sources]]\nname = \"v{i}\"\nscheme = \"{}\"\nsecrets = [{}]\n",
            v.scheme,
            serde_json::to_string(&v.secret).unwrap()
        ));
    }
    let app = spawn_app_with(|c| c.push_str(&sources), Default::default()).await;
    for (i, v) in untimed.iter().enumerate() {
        let headers: Vec<(String, String)> = v
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut req = app
            .client
            .post(app.url(&format!("/webhooks/v{i}")))
            .body(v.body.clone());
        for (k, val) in &headers {
            req = req.header(k, val);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap();
        // Only a JSON object is a webhook body (SPEC section 3).
        let is_json = serde_json::from_str::<serde_json::Value>(&v.body)
            .is_ok_and(|b| b.is_object())
            || v.body.starts_with("payload=");
        match (v.valid, is_json) {
            (true, true) => {
                assert_eq!(status, 200, "{}: {body}", v.name);
                assert_eq!(body["status"], "queued", "{}", v.name);
            }
            // Authentic but not a JSON object (GitHub's `Hello, World!`): past the signature check.
            (true, false) => assert_eq!(body["error"], "invalid_json", "{}: {body}", v.name),
            (false, _) => assert_eq!(status, 401, "{}: {body}", v.name),
        }
    }
}

#[tokio::test]
async fn github_form_encoded_delivery_is_verified_on_the_raw_form_and_read_from_payload() {
    let app = spawn_app().await;
    let json_payload = json!({"action": "opened", "number": 7}).to_string();
    let form: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &json_payload)
        .finish();
    let headers = sign_for(&app.settings, "github", "gh-delivery-1", form.as_bytes());
    let mut req = app
        .client
        .post(app.url("/webhooks/github"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form.clone());
    for (k, v) in &headers {
        req = req.header(k, v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let event = app.event("github", "gh-delivery-1").await;
    assert_eq!(event["payload"]["number"], 7);
    assert_eq!(
        event["type"], "order.completed",
        "type comes from X-GitHub-Event"
    );
}

#[tokio::test]
async fn every_scheme_accepts_its_own_signature_and_takes_id_and_type_from_the_right_place() {
    let app = spawn_app().await;
    let stripe_body = json!({"id": "evt_42", "type": "charge.succeeded"}).to_string();
    assert_eq!(
        app.deliver("stripe", "", &stripe_body).await.body["event_id"],
        "evt_42"
    );
    assert_eq!(
        app.event("stripe", "evt_42").await["type"],
        "charge.succeeded"
    );

    let body = json!({"type": "invoice.paid"}).to_string();
    assert_eq!(
        app.deliver("hmac", "hm-1", &body).await.body["event_id"],
        "hm-1"
    );
    assert_eq!(app.event("hmac", "hm-1").await["type"], "invoice.paid");
    // hmac-sha256 without X-Event-Id: the body's event_id.
    let body = json!({"type": "invoice.paid", "event_id": "hm-body"}).to_string();
    let mut headers = sign_for(&app.settings, "hmac", "x", body.as_bytes());
    headers.retain(|(k, _)| k != "X-Event-Id");
    assert_eq!(
        app.post_webhook("hmac", &headers, body.as_bytes())
            .await
            .body["event_id"],
        "hm-body"
    );

    let body = json!({"id": 1}).to_string();
    assert_eq!(
        app.deliver("shopify", "sh-1", &body).await.body["status"],
        "queued"
    );
    assert_eq!(
        app.event("shopify", "sh-1").await["type"],
        "order.completed"
    );

    // Standard Webhooks under Svix's header names, signed with the older rotated secret.
    let body = json!({"type": "svix.test"}).to_string();
    let now = webhook_inbox::domain::time::now_secs();
    let headers: Vec<(String, String)> = sign_with(
        webhook_inbox::signature::Scheme::StandardWebhooks,
        "whsec_b2xkIHNlY3JldCBiZWZvcmUgcm90YXRpb24=",
        "svix-1",
        body.as_bytes(),
        now,
    )
    .into_iter()
    .map(|(k, v)| (k.replace("webhook-", "svix-"), v))
    .collect();
    assert_eq!(
        app.post_webhook("shop", &headers, body.as_bytes())
            .await
            .body["status"],
        "queued"
    );
}
