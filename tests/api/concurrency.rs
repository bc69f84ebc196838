//! The dedup guarantee under real concurrency: threads released together through a barrier
//! against a real SQLite file, over real HTTP.

use std::sync::{Arc, Barrier};

use crate::helpers::*;

/// Send `(source, event_id, body)` deliveries from `threads` threads that start together.
fn blast(
    app: &TestApp,
    threads: usize,
    per_thread: impl Fn(usize) -> Vec<(String, String)> + Send + Sync + 'static,
) -> Vec<(u16, serde_json::Value)> {
    let barrier = Arc::new(Barrier::new(threads));
    let per_thread = Arc::new(per_thread);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            let per_thread = Arc::clone(&per_thread);
            let settings = app.settings.clone();
            let url = app.url("/webhooks/shop");
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                let deliveries = per_thread(t);
                let signed: Vec<_> = deliveries
                    .iter()
                    .map(|(id, body)| {
                        (
                            sign_for(&settings, "shop", id, body.as_bytes()),
                            body.clone(),
                        )
                    })
                    .collect();
                barrier.wait();
                signed
                    .into_iter()
                    .map(|(headers, body)| {
                        let mut req = client.post(&url).body(body);
                        for (k, v) in headers {
                            req = req.header(k, v);
                        }
                        let r = req.send().unwrap();
                        (r.status().as_u16(), r.json::<serde_json::Value>().unwrap())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_identical_deliveries_at_once_make_one_event() {
    let app = spawn_app().await;
    let body = order_body("o-1", "c-1", 10);
    let results = {
        let app = &app;
        let body = body.clone();
        tokio::task::block_in_place(move || {
            blast(app, 16, move |_| vec![("msg_race".into(), body.clone())])
        })
    };
    assert!(results.iter().all(|(s, _)| *s == 200), "{results:?}");
    let queued = results
        .iter()
        .filter(|(_, b)| b["status"] == "queued")
        .count();
    let duplicate = results
        .iter()
        .filter(|(_, b)| b["status"] == "duplicate")
        .count();
    assert_eq!((queued, duplicate), (1, 15), "{results:?}");
    assert_eq!(app.count("SELECT count(*) FROM events"), 1);
    assert_eq!(app.count("SELECT deliveries FROM events"), 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_distinct_deliveries_from_several_threads_are_all_stored() {
    let app = spawn_app().await;
    let results = tokio::task::block_in_place(|| {
        blast(&app, 8, |t| {
            (0..60)
                .map(|i| {
                    let id = format!("msg_{t}_{i}");
                    (id.clone(), order_body(&format!("o-{t}-{i}"), "c-1", 1))
                })
                .collect()
        })
    });
    assert_eq!(results.len(), 480);
    assert!(
        results
            .iter()
            .all(|(s, b)| *s == 200 && b["status"] == "queued"),
        "{results:?}"
    );
    assert_eq!(app.count("SELECT count(*) FROM events"), 480);
    assert_eq!(app.count("SELECT count(DISTINCT seq) FROM events"), 480);
}
