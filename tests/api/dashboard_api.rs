//! The dashboard's HTTP side without a browser: its files and their security headers, and
//! `GET /events/stats`, the read its overview makes.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::helpers::{order_body, spawn_app};

/// Every `src`/`href` of the page and every `from './…'` import of its scripts, followed from
/// `/ui/`: the whole set of files a browser loads.
fn references(base: &str, text: &str) -> Vec<String> {
    let dir = &base[..=base.rfind('/').unwrap()];
    let mut found = Vec::new();
    for marker in ["src=\"", "href=\"", "from './"] {
        for (i, _) in text.match_indices(marker) {
            let rest = &text[i + marker.len()..];
            let end = rest.find(['"', '\'']).unwrap();
            let target = &rest[..end];
            if target.starts_with('#') || target.is_empty() {
                continue;
            }
            found.push(format!("{dir}{target}"));
        }
    }
    found
}

#[tokio::test]
async fn ui_page_and_every_file_it_loads_carry_the_security_headers() {
    let app = spawn_app().await;
    let mut seen = BTreeSet::new();
    let mut queue = vec!["/ui/".to_string()];
    while let Some(path) = queue.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        // No token: the page and its files are open; the data calls are not.
        let r = app.client.get(app.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers().clone();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self';"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{path}");
        let media = h["content-type"].to_str().unwrap().to_string();
        let text = r.text().await.unwrap();
        let expected = match path.rsplit('.').next().unwrap() {
            "js" => "text/javascript",
            "css" => "text/css",
            "svg" => "image/svg+xml",
            _ => "text/html",
        };
        assert!(media.starts_with(expected), "{path}: {media}");
        if media.starts_with("text/html") || media.starts_with("text/javascript") {
            queue.extend(references(&path, &text));
        }
    }
    // The page, its stylesheet and icon, and the ten script modules.
    assert_eq!(seen.len(), 14, "{seen:?}");
}

#[tokio::test]
async fn ui_redirects_to_its_slash_and_answers_unknown_files_in_the_error_shape() {
    let app = spawn_app().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for path in ["/ui", "/"] {
        let r = client.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 308, "{path}");
        assert_eq!(r.headers()["location"], "/ui/", "{path}");
    }

    let r = app.get("/ui/no-such-file.js").await;
    r.assert_error(404, "not_found");
    let r = app.post("/ui/", None, None).await;
    r.assert_error(405, "method_not_allowed");
}

#[tokio::test]
async fn events_stats_needs_the_admin_token() {
    let app = spawn_app().await;
    let r = app
        .client
        .get(app.url("/events/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized");
    let r = app
        .client
        .get(app.url("/events/stats"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn events_stats_counts_statuses_the_oldest_pending_and_receipts_per_minute() {
    let app = spawn_app().await;
    let empty = app.get("/events/stats").await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    assert_eq!(empty.body["oldest_pending_seconds"], Value::Null);

    app.deliver("shop", "s1", &order_body("o1", "c1", 1)).await;
    app.deliver("shop", "s2", &order_body("o2", "c1", 1)).await;
    app.deliver("shop", "s3", r#"{"type":"order.completed","data":{}}"#)
        .await;
    app.drain().await;
    app.deliver("shop", "s4", &order_body("o4", "c1", 1)).await;

    let s = app.get("/events/stats").await.body;
    assert_eq!(
        s["counts"],
        serde_json::json!({"pending": 1, "claimed": 0, "completed": 2, "failed": 1})
    );
    let oldest = s["oldest_pending_seconds"].as_f64().unwrap();
    assert!((0.0..60.0).contains(&oldest), "{oldest}");

    let minutes = s["received_per_minute"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let total: i64 = minutes.iter().map(|m| m["count"].as_i64().unwrap()).sum();
    assert_eq!(
        total, 4,
        "each event counted once, in the window: {minutes:?}"
    );
    let times: Vec<i64> = minutes
        .iter()
        .map(|m| webhook_inbox::domain::time::parse_rfc3339(m["minute"].as_str().unwrap()).unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] == 60_000), "{times:?}");
    let now = webhook_inbox::domain::time::now_ms();
    assert!(
        now - times[59] < 60_000 + 1_000,
        "the last minute is the current one"
    );
    // A redelivery is not a new receipt.
    app.deliver("shop", "s4", &order_body("o4", "c1", 1)).await;
    let again = app.get("/events/stats").await.body;
    let total_again: i64 = again["received_per_minute"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["count"].as_i64().unwrap())
        .sum();
    assert_eq!(total_again, 4);
}

/// `received_per_minute` counts each event in the minute it was received, on both stores:
/// across minutes, with a minute of none between, an event older than the window left out, and
/// a gap in `seq` (a purged event) counted as nothing.
fn receipts_are_counted_in_their_minutes_across_gaps(kind: crate::stores::StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::stores::TestDb::create(kind, dir.path());
    let store = db.open_store();
    const MINUTE: i64 = 60_000;
    let now = webhook_inbox::domain::time::now_ms();
    let since = now - now.rem_euclid(MINUTE) - 59 * MINUTE;
    // (minute after `since`, how many): one two hours before the window, then 3, 0, 2, 1.
    let plan: [(i64, usize); 5] = [(-120, 1), (10, 3), (12, 2), (40, 1), (59, 4)];
    let mut n = 0;
    for (minute, count) in plan {
        let batch: Vec<_> = (0..count)
            .map(|i| {
                n += 1;
                let mut d = crate::harness::new_delivery(
                    "shop",
                    &format!("m-{n}"),
                    "order.completed",
                    "{}",
                );
                d.received_at = since + minute * MINUTE + i as i64 * 1_000;
                d
            })
            .collect();
        store.insert_deliveries(&batch).unwrap();
    }
    // The second event of minute 10 gone (as a purge would leave it): `seq` 3 is a gap.
    if kind == crate::stores::StoreKind::Postgres {
        db.execute(
            "DELETE FROM event_payloads WHERE seq = (SELECT seq FROM event_log WHERE event_id = 'm-3')",
        );
    }
    db.execute("DELETE FROM event_log WHERE event_id = 'm-3'");
    let minutes = store.received_per_minute(since).unwrap();
    assert_eq!(
        minutes,
        vec![
            (since + 10 * MINUTE, 2),
            (since + 12 * MINUTE, 2),
            (since + 40 * MINUTE, 1),
            (since + 59 * MINUTE, 4),
        ]
    );
    assert_eq!(store.received_per_minute(now + MINUTE).unwrap(), vec![]);
}

crate::stores::store_tests!(receipts_are_counted_in_their_minutes_across_gaps);
