//! Refused deliveries kept for ops (`GET /rejections`, `webhook-inbox rejections list`): the
//! reason, the sender, header names and the values of non-secret headers, the body's size and
//! digest; bounded by count and age; the same on both stores.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use webhook_inbox::store::{NewRejection, Page, RejectionFilter};

use crate::cli_config::stderr;
use crate::helpers::*;
use crate::stores::{StoreKind, TestDb, store_tests};

/// The kept refusals, newest first, once at least `n` are there (the writer is a background
/// task: bounded wait).
async fn kept(app: &TestApp, query: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = app.get(&format!("/rejections{query}")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let rows = r.body["rejections"].as_array().unwrap().clone();
        if rows.len() >= n || Instant::now() > deadline {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A delivery signed as `shop` would be, posted to a source nobody configured: 404.
pub async fn unknown_source(app: &TestApp, id: &str) {
    let headers = sign_for(&app.settings, "shop", id, b"{}");
    app.post_webhook("nope", &headers, b"{}")
        .await
        .assert_error(404, "unknown_source");
}

#[tokio::test]
async fn refused_deliveries_are_kept_with_their_reason_and_never_a_secret() {
    let app = spawn_app().await;
    // Signed for another secret: 401 invalid_signature.
    let body = order_body("o-1", "c-1", 1);
    let headers = sign_with(
        webhook_inbox::signature::Scheme::StandardWebhooks,
        "whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI=",
        "forged-1",
        body.as_bytes(),
        webhook_inbox::domain::time::now_secs(),
    );
    app.post_webhook("shop", &headers, body.as_bytes())
        .await
        .assert_error(401, "invalid_signature");
    unknown_source(&app, "x").await;
    let big = "x".repeat(5_000);
    app.post_webhook("shop", &[], big.as_bytes())
        .await
        .assert_error(413, "payload_too_large");
    assert_eq!(app.deliver("shop", "fine", &body).await.status, 200);

    let rows = kept(&app, "", 3).await;
    let reasons: Vec<&str> = rows.iter().map(|r| r["reason"].as_str().unwrap()).collect();
    assert_eq!(
        reasons,
        ["payload_too_large", "unknown_source", "invalid_signature"],
        "{rows:?}"
    );
    let forged = &rows[2];
    assert_eq!(forged["source"], "shop");
    assert_eq!(forged["status"], 401);
    assert_eq!(forged["peer"], "127.0.0.1");
    assert_eq!(forged["headers"]["webhook-id"], "forged-1");
    assert_eq!(
        forged["headers"]["webhook-signature"],
        Value::Null,
        "{forged}"
    );
    assert!(
        forged["headers"]
            .as_object()
            .unwrap()
            .contains_key("webhook-signature"),
        "the name is kept"
    );
    assert_eq!(forged["body_bytes"], body.len());
    assert_eq!(
        forged["body_sha256"],
        hex::encode(Sha256::digest(body.as_bytes()))
    );
    let oversize = &rows[0];
    assert_eq!(oversize["body_bytes"], 5_000, "from Content-Length");
    assert_eq!(oversize["body_sha256"], Value::Null, "never read");

    // Filters, paging, the token.
    let only = kept(&app, "?reason=unknown_source", 1).await;
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["source"], "nope");
    let r = app.get("/rejections?limit=2").await;
    let next = r.body["next_cursor"].as_str().unwrap().to_string();
    let r = app.get(&format!("/rejections?limit=2&cursor={next}")).await;
    assert_eq!(r.body["rejections"].as_array().unwrap().len(), 1);
    app.get("/rejections?colour=red")
        .await
        .assert_error(422, "invalid_request");
    let r = app.client.get(app.url("/rejections")).send().await.unwrap();
    assert_eq!(r.status(), 401);

    // The CLI.
    std::fs::write(app.dir.path().join("inbox.toml"), test_config(&app.dir)).unwrap();
    let o = crate::cli_config::bare_cli(
        app.dir.path(),
        &[
            "--config",
            "inbox.toml",
            "rejections",
            "list",
            "--url",
            &app.address,
        ],
        &[],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("invalid_signature") && out.contains("unknown_source"),
        "{out}"
    );
}

/// A flood cannot grow the table: it keeps the newest `keep_count`.
#[tokio::test]
async fn the_kept_refusals_are_bounded_by_count() {
    let app = spawn_app_with(
        |c| c.push_str("\n[rejections]\nkeep_count = 5\n"),
        Default::default(),
    )
    .await;
    for i in 0..20 {
        unknown_source(&app, &format!("n-{i}")).await;
    }
    // Wait until the last one is written, then count.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = kept(&app, "", 1).await;
        let newest = rows[0]["headers"]["webhook-id"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if newest == "n-19" {
            assert_eq!(rows.len(), 5, "{rows:?}");
            let ids: Vec<&str> = rows
                .iter()
                .map(|r| r["headers"]["webhook-id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, ["n-19", "n-18", "n-17", "n-16", "n-15"]);
            break;
        }
        assert!(Instant::now() < deadline, "{rows:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn refusal(source: &str, at: i64) -> NewRejection {
    NewRejection {
        received_at: at,
        source: source.into(),
        peer: Some("192.0.2.1".into()),
        reason: "invalid_signature".into(),
        status: 401,
        message: "no signature matched".into(),
        headers: json!({"webhook-id": "x", "webhook-signature": null}).to_string(),
        body_bytes: Some(12),
        body_sha256: Some("ab".repeat(32)),
    }
}

/// The store's part on both stores: a batch written, trimmed to a count and an age in the same
/// transaction, read back newest first with filters and paging.
fn rejections_are_stored_trimmed_and_paged(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let store = db.open_store();
    let batch: Vec<_> = (0..10)
        .map(|i| refusal(if i % 2 == 0 { "a" } else { "b" }, 1_000 + i))
        .collect();
    store.record_rejections(&batch, 100, 0).unwrap();
    let all = store
        .rejections(
            &RejectionFilter::default(),
            Page {
                limit: 100,
                before_seq: None,
            },
        )
        .unwrap();
    assert_eq!(all.len(), 10);
    assert_eq!(all[0].rejection, batch[9], "newest first, every field kept");
    let only_a = RejectionFilter {
        source: Some("a".into()),
        ..Default::default()
    };
    let page = store
        .rejections(
            &only_a,
            Page {
                limit: 2,
                before_seq: None,
            },
        )
        .unwrap();
    assert_eq!(page.len(), 2);
    let rest = store
        .rejections(
            &only_a,
            Page {
                limit: 10,
                before_seq: Some(page[1].id),
            },
        )
        .unwrap();
    assert_eq!(rest.len(), 3);
    assert!(
        page.iter().chain(&rest).all(|r| r.rejection.source == "a"),
        "only source a: {page:?} {rest:?}"
    );
    let window = RejectionFilter {
        reason: Some("invalid_signature".into()),
        received_after: Some(1_003),
        received_before: Some(1_006),
        ..Default::default()
    };
    let within: Vec<i64> = store
        .rejections(
            &window,
            Page {
                limit: 100,
                before_seq: None,
            },
        )
        .unwrap()
        .iter()
        .map(|r| r.rejection.received_at)
        .collect();
    assert_eq!(within, [1_005, 1_004, 1_003], "from (inclusive) and before");
    let other_reason = RejectionFilter {
        reason: Some("unknown_source".into()),
        ..Default::default()
    };
    let none = store.rejections(
        &other_reason,
        Page {
            limit: 100,
            before_seq: None,
        },
    );
    assert!(none.unwrap().is_empty());
    // Trimmed to the newest 4, and nothing received before 1,007.
    store
        .record_rejections(&[refusal("a", 1_010)], 4, 1_007)
        .unwrap();
    let left: Vec<i64> = store
        .rejections(
            &RejectionFilter::default(),
            Page {
                limit: 100,
                before_seq: None,
            },
        )
        .unwrap()
        .iter()
        .map(|r| r.rejection.received_at)
        .collect();
    assert_eq!(left, [1_010, 1_009, 1_008, 1_007]);
    store.record_rejections(&[], 4, 1_009).unwrap();
    assert_eq!(db.count("SELECT count(*) FROM rejections"), 2);
}

store_tests!(rejections_are_stored_trimmed_and_paged);
