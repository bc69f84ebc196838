//! The ops API over real HTTP (SPEC section 5): filters, pagination under concurrent arrivals,
//! every retry case, and metrics.

use std::collections::HashMap;

use serde_json::{Value, json};
use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::Lane;

use crate::helpers::*;
use crate::stores::{StoreKind, async_store_tests};

async_store_tests!(
    list_filters_narrow_the_events_and_bad_values_are_422,
    retry_answers_each_case_as_the_spec_says,
    an_abandoned_at_most_once_event_needs_force_and_bulk_retry_skips_it,
    bulk_retry_takes_failed_events_matching_the_filter,
    metrics_parse_as_prometheus_text_and_move_with_traffic,
);

fn ids(page: &Value) -> Vec<String> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_string())
        .collect()
}

async fn list_filters_narrow_the_events_and_bad_values_are_422(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    app.deliver("shop", "a", &order_body("o-a", "c", 1)).await;
    app.deliver("shop", "b", r#"{"type":"customer.created"}"#)
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let middle = webhook_inbox::domain::time::rfc3339(now_ms());
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    app.deliver("hmac", "c", r#"{"type":"customer.created"}"#)
        .await;
    app.deliver("shop", "d", r#"{"type":"order.completed"}"#)
        .await; // fails: no order_id
    app.drain().await;

    assert_eq!(
        ids(&app.get("/events").await.body),
        ["d", "c", "b", "a"],
        "newest first"
    );
    assert_eq!(ids(&app.get("/events?source=hmac").await.body), ["c"]);
    assert_eq!(
        ids(&app.get("/events?type=customer.created").await.body),
        ["c", "b"]
    );
    assert_eq!(ids(&app.get("/events?status=failed").await.body), ["d"]);
    assert_eq!(
        ids(&app.get("/events?status=completed&source=shop").await.body),
        ["b", "a"]
    );
    assert_eq!(
        ids(&app
            .get(&format!("/events?received_after={middle}"))
            .await
            .body),
        ["d", "c"]
    );
    assert_eq!(
        ids(&app
            .get(&format!("/events?received_before={middle}"))
            .await
            .body),
        ["b", "a"]
    );
    let page = app.get("/events?limit=3").await.body;
    assert_eq!(ids(&page), ["d", "c", "b"]);
    assert!(page["next_cursor"].is_string());
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = app
        .get(&format!("/events?limit=3&cursor={cursor}"))
        .await
        .body;
    assert_eq!(ids(&rest), ["a"]);
    assert_eq!(rest["next_cursor"], Value::Null);
    for bad in [
        "limit=0",
        "limit=501",
        "limit=x",
        "cursor=bogus",
        "status=done",
        "received_after=yesterday",
    ] {
        let r = app.get(&format!("/events?{bad}")).await;
        r.assert_error(422, "invalid_request");
        let field = bad.split('=').next().unwrap();
        assert!(
            r.body["message"].as_str().unwrap().contains(field),
            "{bad}: {}",
            r.body
        );
    }
}

/// Deliveries arrive from another thread while the pages are walked: on both stores.
mod paging {
    use crate::stores::StoreKind;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::pagination_walks_every_event_exactly_once_while_deliveries_keep_arriving(
            StoreKind::Sqlite,
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        if crate::pgdb::available() {
            super::pagination_walks_every_event_exactly_once_while_deliveries_keep_arriving(
                StoreKind::Postgres,
            )
            .await
        }
    }
}

async fn pagination_walks_every_event_exactly_once_while_deliveries_keep_arriving(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    for i in 0..120 {
        app.deliver("shop", &format!("old-{i}"), r#"{"type":"ping"}"#)
            .await;
    }
    // A writer keeps delivering new events while the walk goes on.
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = {
        let client = app.client.clone();
        let url = app.url("/webhooks/shop");
        let settings = app.settings.clone();
        tokio::spawn(async move {
            let mut sent = 0;
            while sent < 2000 && stop_rx.try_recv().is_err() {
                let id = format!("new-{sent}");
                let body = r#"{"type":"ping"}"#;
                let mut req = client.post(&url).body(body);
                for (k, v) in sign_for(&settings, "shop", &id, body.as_bytes()) {
                    req = req.header(k, v);
                }
                assert_eq!(req.send().await.unwrap().status(), 200);
                sent += 1;
            }
            sent
        })
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let path = match &cursor {
            Some(c) => format!("/events?limit=7&cursor={c}"),
            None => "/events?limit=7".to_string(),
        };
        let page = app.get(&path).await.body;
        for id in ids(&page) {
            *seen.entry(id).or_default() += 1;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let _ = stop_tx.send(());
    let sent = writer.await.unwrap();
    assert!(sent > 0, "nothing arrived during the walk");
    for i in 0..120 {
        assert_eq!(seen.get(&format!("old-{i}")), Some(&1), "old-{i}");
    }
    assert!(seen.values().all(|n| *n == 1), "an event was repeated");
}

async fn retry_answers_each_case_as_the_spec_says(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    app.deliver("shop", "failed", r#"{"type":"order.completed"}"#)
        .await;
    app.deliver("shop", "done", &order_body("o-1", "c-1", 10))
        .await;
    app.drain().await;
    app.deliver("shop", "pending", r#"{"type":"ping"}"#).await;

    // failed -> pending, due now, fresh budget; attempts keep counting.
    let r = app.admin_post("/events/shop/failed/retry", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "pending");
    assert_eq!(r.body["attempts"], 1);
    assert!(r.body["next_attempt_at"].is_string());
    // pending: 200, nothing changes.
    let r = app.admin_post("/events/shop/pending/retry", None).await;
    assert_eq!(
        (r.status, r.body["status"].clone()),
        (200, json!("pending"))
    );
    // claimed: 200, nothing changes.
    let claimed = app
        .store
        .claim("ops-test", Lane::InProcess, 10, 60_000, now_ms())
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let r = app.admin_post("/events/shop/pending/retry", None).await;
    assert_eq!(
        (r.status, r.body["status"].clone()),
        (200, json!("claimed"))
    );
    // completed: 409 without force; with force it runs again and moves no balance.
    app.admin_post("/events/shop/done/retry", None)
        .await
        .assert_error(409, "conflict");
    let r = app
        .admin_post("/events/shop/done/retry?force=true", None)
        .await;
    assert_eq!(r.body["status"], "pending");
    app.drain().await;
    let done = app.event("shop", "done").await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["outcome"], "credited");
    assert_eq!(done["history"][1]["result"], "already_processed");
    assert_eq!(app.balance("c-1").await, 10);
    // Unknown event: 404.
    app.admin_post("/events/shop/nope/retry", None)
        .await
        .assert_error(404, "not_found");
    app.admin_post("/events/shop/done/retry?force=maybe", None)
        .await
        .assert_error(422, "invalid_request");
}

async fn an_abandoned_at_most_once_event_needs_force_and_bulk_retry_skips_it(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let id = app.post("/requests", Some(SUBMIT_TOKEN), None).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    app.store
        .claim("dead-worker", Lane::CallOut, 1, 1, now_ms())
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    app.consumer.sweep().unwrap();
    assert_eq!(app.event("requests", &id).await["abandoned"], true);
    let r = app.admin_post("/events/retry", Some(json!({}))).await;
    assert_eq!(r.body, json!({"retried": 0}));
    let r = app
        .admin_post(&format!("/events/requests/{id}/retry"), None)
        .await;
    r.assert_error(409, "conflict");
    assert!(r.body["message"].as_str().unwrap().contains("force"));
    let r = app
        .admin_post(&format!("/events/requests/{id}/retry?force=true"), None)
        .await;
    assert_eq!(r.body["status"], "pending");
    assert_eq!(r.body["abandoned"], false);
}

async fn bulk_retry_takes_failed_events_matching_the_filter(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    for i in 0..3 {
        app.deliver("shop", &format!("s{i}"), r#"{"type":"order.completed"}"#)
            .await;
        app.deliver("hmac", &format!("h{i}"), r#"{"type":"order.completed"}"#)
            .await;
    }
    app.deliver("shop", "ok", r#"{"type":"ping"}"#).await;
    app.drain().await;
    assert_eq!(ids(&app.get("/events?status=failed").await.body).len(), 6);
    let r = app
        .admin_post("/events/retry", Some(json!({"source": "shop"})))
        .await;
    assert_eq!(r.body, json!({"retried": 3}));
    assert_eq!(
        ids(&app.get("/events?status=pending").await.body),
        ["s2", "s1", "s0"]
    );
    let r = app.admin_post("/events/retry", None).await;
    assert_eq!(r.body, json!({"retried": 3}), "no body: every failed event");
    let r = app
        .admin_post("/events/retry", Some(json!({"sorce": "shop"})))
        .await;
    r.assert_error(422, "invalid_request");
    assert!(r.body["message"].as_str().unwrap().contains("sorce"));
    app.admin_post("/events/retry", Some(json!({"status": "completed"})))
        .await
        .assert_error(422, "invalid_request");
    app.admin_post("/events/retry", Some(json!({"received_after": "nope"})))
        .await
        .assert_error(422, "invalid_request");
}

/// Every sample line is `name{labels} value`; the OpenMetrics text ends with `# EOF`.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    let mut samples = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line}"));
        let name_ok = key
            .split('{')
            .next()
            .unwrap()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
        assert!(name_ok, "bad metric name in {line}");
        if key.contains('{') {
            assert!(key.ends_with('}'), "unclosed labels in {line}");
        }
        samples.insert(
            key.to_string(),
            value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("bad value in {line}")),
        );
    }
    samples
}

async fn metrics_parse_as_prometheus_text_and_move_with_traffic(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    let scrape = || async { parse_metrics(&app.metrics_text().await) };
    let before = scrape().await;
    assert_eq!(
        before.get(r#"webhook_inbox_events{status="pending"}"#),
        Some(&0.0)
    );
    app.deliver("shop", "m1", &order_body("o-1", "c-1", 1))
        .await;
    app.deliver("shop", "m1", &order_body("o-1", "c-1", 1))
        .await;
    app.deliver("shop", "m2", &order_body("o-1", "c-1", 1))
        .await;
    let mut bad = sign_for(&app.settings, "shop", "m3", b"{}");
    bad.retain(|(k, _)| k != "webhook-signature");
    app.post_webhook("shop", &bad, b"{}").await;
    let mid = scrape().await;
    assert_eq!(
        mid[r#"webhook_inbox_deliveries_total{source="shop",result="queued"}"#],
        2.0
    );
    assert_eq!(
        mid[r#"webhook_inbox_deliveries_total{source="shop",result="duplicate"}"#],
        1.0
    );
    assert_eq!(
        mid[r#"webhook_inbox_deliveries_total{source="shop",result="rejected"}"#],
        1.0
    );
    assert_eq!(mid[r#"webhook_inbox_events{status="pending"}"#], 2.0);
    assert!(mid["webhook_inbox_oldest_pending_seconds"] >= 0.0);
    assert_eq!(mid["webhook_inbox_ingest_seconds_count"], 4.0);
    app.drain().await;
    let after = scrape().await;
    assert_eq!(
        after[r#"webhook_inbox_processed_total{handler="loyalty_credit",outcome="credited"}"#],
        1.0
    );
    assert_eq!(
        after[r#"webhook_inbox_processed_total{handler="loyalty_credit",outcome="duplicate_order"}"#],
        1.0
    );
    assert_eq!(
        after[r#"webhook_inbox_attempts_total{handler="loyalty_credit",result="ok"}"#],
        2.0
    );
    assert_eq!(after[r#"webhook_inbox_events{status="completed"}"#], 2.0);
    assert_eq!(after["webhook_inbox_processing_seconds_count"], 2.0);
}
