//! `GET /loyalty/{customer_id}` pages its credits with `limit`, `cursor` and `next_cursor`,
//! the cursor scheme of `GET /events`: newest first, each credit exactly once.

use std::collections::HashSet;

use crate::helpers::*;

#[tokio::test]
async fn loyalty_credits_page_newest_first_and_each_appears_once() {
    let app = spawn_app().await;
    for i in 1..=7 {
        app.deliver(
            "shop",
            &format!("e-{i}"),
            &order_body(&format!("o-{i}"), "c-p", i),
        )
        .await;
    }
    app.deliver("shop", "other", &order_body("o-x", "c-other", 5))
        .await;
    app.drain().await;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let path = match &cursor {
            Some(c) => format!("/loyalty/c-p?limit=3&cursor={c}"),
            None => "/loyalty/c-p?limit=3".to_string(),
        };
        let r = app.get(&path).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["balance"], 28, "the whole balance on every page");
        let credits = r.body["credits"].as_array().unwrap();
        assert!(credits.len() <= 3);
        seen.extend(
            credits
                .iter()
                .map(|c| c["order_id"].as_str().unwrap().to_string()),
        );
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let expected: Vec<String> = (1..=7).rev().map(|i| format!("o-{i}")).collect();
    assert_eq!(
        seen, expected,
        "newest first, each once, no other customer's"
    );
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 7);

    // Without parameters: the default page holds all seven, and says there is no more.
    let r = app.get("/loyalty/c-p").await;
    assert_eq!(r.body["credits"].as_array().unwrap().len(), 7);
    assert!(r.body["next_cursor"].is_null());
    let r = app.get("/loyalty/nobody").await;
    assert_eq!(
        (
            r.body["balance"].as_i64(),
            r.body["credits"].as_array().map(Vec::len)
        ),
        (Some(0), Some(0))
    );
}

#[tokio::test]
async fn loyalty_refuses_bad_paging_parameters_and_unknown_keys() {
    let app = spawn_app().await;
    for (query, names) in [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=-1", "limit"),
        ("cursor=bogus", "cursor"),
        ("limt=3", "limt"),
    ] {
        let r = app.get(&format!("/loyalty/c-1?{query}")).await;
        r.assert_error(422, "invalid_request");
        let message = r.body["message"].as_str().unwrap();
        assert!(message.contains(names), "{query}: {message}");
    }
}
