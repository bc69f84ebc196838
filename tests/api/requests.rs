//! The submission API (SPEC section 6, seed 000): build a request, submit it once, deliver it
//! downstream once; real threads through barriers against a real SQLite file.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::json;
use webhook_inbox::domain::DeliveryMode;
use webhook_inbox::domain::time::now_ms;
use webhook_inbox::handlers::{CallFailure, DownstreamError};
use webhook_inbox::startup::BuildOptions;
use webhook_inbox::store::{Lane, Status};

use crate::helpers::*;
use crate::stores::{StoreKind, store_tests};

async fn app_with_downstream(mode: &str) -> (TestApp, Arc<RecordingDownstream>) {
    let downstream = Arc::new(RecordingDownstream::default());
    let options = BuildOptions {
        downstream: Some(downstream.clone()),
        ..Default::default()
    };
    let mode = mode.to_string();
    let app = spawn_app_with(
        move |c| {
            c.push_str(&format!(
                "\n[downstream]\nmode = \"{mode}\"\ntimeout_ms = 1000\n"
            ))
        },
        options,
    )
    .await;
    (app, downstream)
}

pub async fn create(app: &TestApp) -> String {
    let r = app.post("/requests", Some(SUBMIT_TOKEN), None).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["status"], "draft");
    assert_eq!(r.body["documents"], json!([]));
    assert_eq!(r.body["event"], serde_json::Value::Null);
    r.body["id"].as_str().unwrap().to_string()
}

pub fn doc(name: &str) -> serde_json::Value {
    json!({"name": name, "content_type": "text/plain", "content": "hello"})
}

#[tokio::test]
async fn a_request_is_built_then_submitted_once_and_delivered() {
    let (app, downstream) = app_with_downstream("at-most-once").await;
    let id = create(&app).await;
    let r = app
        .post(
            &format!("/requests/{id}/documents"),
            Some(SUBMIT_TOKEN),
            Some(doc("a.txt")),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["documents"][0]["name"], "a.txt");
    assert_eq!(r.body["documents"][0]["size"], 5);
    let binary = json!({"name": "b.bin", "content_type": "application/octet-stream",
                        "content": "AAEC", "encoding": "base64"});
    let r = app
        .post(
            &format!("/requests/{id}/documents"),
            Some(ADMIN_TOKEN),
            Some(binary),
        )
        .await;
    assert_eq!(r.body["documents"][1]["size"], 3);

    let r = app
        .post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    assert_eq!(r.body, json!({"queued": true, "status": "queued"}));
    let r = app
        .post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    assert_eq!(r.status, 200, "a second submit is a success, not a 409");
    assert_eq!(r.body, json!({"queued": false, "status": "duplicate"}));
    let r = app
        .post(
            &format!("/requests/{id}/documents"),
            Some(SUBMIT_TOKEN),
            Some(doc("late")),
        )
        .await;
    r.assert_error(409, "conflict");

    let r = app.get(&format!("/requests/{id}")).await;
    assert_eq!(r.body["status"], "submitted");
    assert_eq!(r.body["event"]["status"], "pending");
    app.drain().await;
    assert_eq!(downstream.calls(), [format!("requests:{id}")]);
    let r = app.get(&format!("/requests/{id}")).await;
    assert_eq!(
        r.body["event"],
        json!({"status": "completed", "outcome": "delivered", "last_error": null})
    );
    // The request survives a restart.
    let config = test_config(&app.dir);
    let dir = app.stop().await;
    let app = spawn_in(dir, &config, Default::default()).await;
    assert_eq!(
        app.get(&format!("/requests/{id}")).await.body["documents"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_submits_queue_once_and_call_downstream_once() {
    let (app, downstream) = app_with_downstream("at-most-once").await;
    let id = create(&app).await;
    let url = app.url(&format!("/requests/{id}/submit"));
    let barrier = Arc::new(Barrier::new(8));
    let answers: Vec<serde_json::Value> = tokio::task::spawn_blocking(move || {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (barrier, url) = (Arc::clone(&barrier), url.clone());
                std::thread::spawn(move || {
                    let client = reqwest::blocking::Client::new();
                    barrier.wait();
                    let r = client.post(&url).bearer_auth(SUBMIT_TOKEN).send().unwrap();
                    assert_eq!(r.status(), 200);
                    r.json().unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
    .await
    .unwrap();
    let queued = answers.iter().filter(|a| a["queued"] == true).count();
    assert_eq!(queued, 1, "{answers:?}");
    assert_eq!(
        answers
            .iter()
            .filter(|a| a["status"] == "duplicate")
            .count(),
        7
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE source = 'requests'"),
        1
    );
    app.drain().await;
    assert_eq!(downstream.calls().len(), 1);
}

fn six_workers_drain_fifty_submissions_calling_downstream_once_each(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let ids: Vec<String> = (0..50).map(|i| format!("req-{i}")).collect();
    for id in &ids {
        h.store.create_request(id, now_ms()).unwrap();
        h.store.submit_request(id, now_ms()).unwrap();
    }
    let barrier = Arc::new(Barrier::new(6));
    let threads: Vec<_> = (0..6)
        .map(|w| {
            let (consumer, barrier) = (Arc::clone(&h.consumer), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..200 {
                    if consumer.run_once(&format!("w{w}"), 2, &|| false).unwrap() == 0 {
                        break;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut calls = h.downstream.calls();
    calls.sort();
    let mut expected: Vec<String> = ids.iter().map(|id| format!("requests:{id}")).collect();
    expected.sort();
    assert_eq!(calls, expected, "each request delivered exactly once");
    assert_eq!(
        h.count("SELECT count(*) FROM events WHERE outcome = 'delivered' AND attempts = 1"),
        50
    );
}

#[tokio::test]
async fn a_downstream_that_refuses_fails_the_event_visibly_and_is_not_called_again() {
    let (app, downstream) = app_with_downstream("at-most-once").await;
    *downstream.fail_with.lock().unwrap() = Some(DownstreamError::new(
        CallFailure::Rejected,
        "the downstream answered 422 Unprocessable Entity",
    ));
    let id = create(&app).await;
    app.post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    app.drain().await;
    app.drain().await;
    assert_eq!(downstream.calls().len(), 1, "at-most-once: one attempt");
    let failed = app.get("/events?status=failed").await.body;
    assert_eq!(failed["events"][0]["event_id"], id.as_str());
    assert!(
        failed["events"][0]["last_error"]
            .as_str()
            .unwrap()
            .contains("422")
    );
    let r = app.get(&format!("/requests/{id}")).await;
    assert_eq!(r.body["event"]["status"], "failed");
    assert!(
        r.body["event"]["last_error"]
            .as_str()
            .unwrap()
            .contains("422")
    );
    let event = app.event("requests", &id).await;
    assert_eq!(event["history"][0]["result"], "permanent_error");
}

#[tokio::test]
async fn at_least_once_mode_retries_a_failing_downstream_with_the_same_key() {
    let (app, downstream) = app_with_downstream("at-least-once").await;
    *downstream.fail_with.lock().unwrap() = Some(DownstreamError::new(
        CallFailure::Unknown,
        "no answer from the downstream within 450 ms",
    ));
    let id = create(&app).await;
    app.post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    app.drain().await;
    // max_attempts = 3 in the test config.
    assert_eq!(downstream.calls(), vec![format!("requests:{id}"); 3]);
    let event = app.event("requests", &id).await;
    assert_eq!(event["status"], "failed");
    assert_eq!(event["attempts"], 3);
}

/// A downstream subscription's own `mode` decides what an outcome-unknown call becomes, over
/// `[downstream].mode`: here at-least-once under an at-most-once default, so the call is made
/// again (seen failing while the shared handler's mode decided: abandoned after one call).
#[tokio::test]
async fn a_subscriptions_own_mode_decides_over_the_downstream_default() {
    let downstream = Arc::new(RecordingDownstream::default());
    let options = BuildOptions {
        downstream: Some(downstream.clone()),
        ..Default::default()
    };
    let app = spawn_app_with(
        |c| {
            c.push_str(
                "\n[downstream]\nmode = \"at-most-once\"\ntimeout_ms = 1000\n\n\
                 [[subscriptions]]\nname = \"payments\"\nkind = \"downstream\"\n\
                 mode = \"at-least-once\"\n",
            )
        },
        options,
    )
    .await;
    *downstream.fail_with.lock().unwrap() = Some(DownstreamError::new(
        CallFailure::Unknown,
        "no answer from the downstream within 450 ms",
    ));
    let id = create(&app).await;
    app.post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    app.drain().await;
    assert_eq!(downstream.calls(), vec![format!("requests:{id}"); 3]);
    let event = app.event("requests", &id).await;
    assert_eq!(event["status"], "failed");
    assert_eq!(event["abandoned"], false, "{event}");
    assert_eq!(event["subscriptions"][0]["name"], "payments");
}

fn a_worker_that_dies_after_claiming_abandons_at_most_once_and_repeats_at_least_once(
    kind: StoreKind,
) {
    for mode in [DeliveryMode::AtMostOnce, DeliveryMode::AtLeastOnce] {
        let h = Harness::with_mode_on(kind, 5, 30, mode);
        h.store.create_request("req-1", now_ms()).unwrap();
        h.store.submit_request("req-1", now_ms()).unwrap();
        // The worker claims, then dies: its lease runs out.
        assert_eq!(
            h.store
                .claim("dead", Lane::CallOut, 1, 1, now_ms())
                .unwrap()
                .len(),
            1
        );
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(h.consumer.sweep().unwrap(), 1);
        h.drain();
        let d = h.detail("requests", "req-1");
        match mode {
            DeliveryMode::AtMostOnce => {
                assert_eq!(d.event.status, Status::Failed);
                assert!(d.event.abandoned);
                assert!(h.downstream.calls().is_empty(), "never called again");
                assert_eq!(results(&d), ["lease_expired"]);
            }
            DeliveryMode::AtLeastOnce => {
                assert_eq!(d.event.status, Status::Completed);
                assert_eq!(h.downstream.calls(), ["requests:req-1"]);
                assert_eq!(results(&d), ["lease_expired", "ok"]);
            }
        }
    }
}

async fn a_document_racing_a_submit_lands_before_it_or_gets_409(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    for round in 0..10 {
        let id = create(&app).await;
        let barrier = Arc::new(Barrier::new(2));
        let (doc_url, submit_url) = (
            app.url(&format!("/requests/{id}/documents")),
            app.url(&format!("/requests/{id}/submit")),
        );
        let (doc_status, submit_status) = tokio::task::spawn_blocking(move || {
            let b2 = Arc::clone(&barrier);
            let adder = std::thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                b2.wait();
                client
                    .post(doc_url)
                    .bearer_auth(SUBMIT_TOKEN)
                    .json(&doc("race"))
                    .send()
                    .unwrap()
                    .status()
                    .as_u16()
            });
            let client = reqwest::blocking::Client::new();
            barrier.wait();
            let s = client
                .post(submit_url)
                .bearer_auth(SUBMIT_TOKEN)
                .send()
                .unwrap()
                .status()
                .as_u16();
            (adder.join().unwrap(), s)
        })
        .await
        .unwrap();
        assert_eq!(submit_status, 200);
        let r = app.get(&format!("/requests/{id}")).await;
        let docs = r.body["documents"].as_array().unwrap().len();
        match doc_status {
            200 => assert_eq!(docs, 1, "round {round}: accepted document must be there"),
            409 => assert_eq!(docs, 0, "round {round}: refused document must not be there"),
            other => panic!("round {round}: unexpected status {other}"),
        }
    }
}

async fn bad_requests_get_the_error_shape(kind: StoreKind) {
    let app = spawn_app_on(kind).await;
    app.post("/requests", None, None)
        .await
        .assert_error(401, "unauthorized");
    app.post("/requests", Some("nope"), None)
        .await
        .assert_error(401, "unauthorized");
    app.get("/requests/req_missing")
        .await
        .assert_error(404, "not_found");
    app.post("/requests/req_missing/submit", Some(SUBMIT_TOKEN), None)
        .await
        .assert_error(404, "not_found");
    app.post(
        "/requests/req_missing/documents",
        Some(SUBMIT_TOKEN),
        Some(doc("a")),
    )
    .await
    .assert_error(404, "not_found");
    let id = create(&app).await;
    let path = format!("/requests/{id}/documents");
    app.post(&path, Some(SUBMIT_TOKEN), Some(json!({"name": "a"})))
        .await
        .assert_error(422, "invalid_request");
    app.post(
        &path,
        Some(SUBMIT_TOKEN),
        Some(json!({"name": "", "content_type": "t", "content": ""})),
    )
    .await
    .assert_error(422, "invalid_request");
    app.post(
        &path,
        Some(SUBMIT_TOKEN),
        Some(json!({"name": "a", "content_type": "t", "content": "%%", "encoding": "base64"})),
    )
    .await
    .assert_error(422, "invalid_request");
    app.post(&path, Some(SUBMIT_TOKEN), Some(json!([1, 2])))
        .await
        .assert_error(422, "invalid_request");
    let r = app
        .client
        .post(app.url(&path))
        .bearer_auth(SUBMIT_TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "invalid_json");
    app.post(
        "/requests",
        Some(SUBMIT_TOKEN),
        Some(json!({"unexpected": 1})),
    )
    .await
    .assert_error(422, "invalid_request");
    let r = app
        .client
        .get(app.url("/requests"))
        .bearer_auth(SUBMIT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"],
        "method_not_allowed"
    );
    // The submission token opens the submission API only.
    let r = app
        .client
        .get(app.url("/events"))
        .bearer_auth(SUBMIT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let request = app.get(&format!("/requests/{id}")).await;
    assert_eq!(request.body["documents"], json!([]), "{}", request.body);
}

/// A purged submission takes its request's documents (its body) with it, on every store; a
/// draft's documents stay.
fn a_purged_submission_takes_its_documents_with_it(kind: StoreKind) {
    use webhook_inbox::store::{NewDocument, PurgeCutoffs};
    let h = Harness::on(kind, 5, 30);
    let document = |id: &str| NewDocument {
        id: format!("doc-{id}"),
        name: "a.txt".into(),
        content_type: "text/plain".into(),
        content: b"hello".to_vec(),
    };
    for id in ["req-sent", "req-draft"] {
        h.store.create_request(id, now_ms()).unwrap();
        h.store.add_document(id, &document(id), now_ms()).unwrap();
    }
    h.store.submit_request("req-sent", now_ms()).unwrap();
    for _ in 0..10 {
        if h.consumer.run_once("w", 10, &|| false).unwrap() == 0 {
            break;
        }
    }
    assert_eq!(h.downstream.calls(), ["requests:req-sent"]);
    let later = now_ms() + 60_000;
    let cutoffs = PurgeCutoffs {
        completed_before: Some(later),
        failed_before: Some(later),
    };
    let (mut after, mut purged) = (0, 0);
    for _ in 0..100 {
        let batch = h.store.purge_batch(&cutoffs, after, 100, now_ms()).unwrap();
        purged += batch.purged;
        match batch.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(purged, 1);
    assert!(h.store.request_documents("req-sent").unwrap().is_empty());
    assert_eq!(h.store.request_documents("req-draft").unwrap().len(), 1);
}

store_tests!(
    a_purged_submission_takes_its_documents_with_it,
    six_workers_drain_fifty_submissions_calling_downstream_once_each,
    a_worker_that_dies_after_claiming_abandons_at_most_once_and_repeats_at_least_once,
);

/// Of the async tests above, those run on both stores (in a module of their own: `store_tests!`
/// above names its modules `sqlite` and `postgres` too).
mod both {
    use super::*;
    use crate::stores::async_store_tests;

    async_store_tests!(
        a_document_racing_a_submit_lands_before_it_or_gets_409,
        bad_requests_get_the_error_shape,
    );
}
