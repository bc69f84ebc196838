//! The production `DownstreamSystem` against a real HTTP receiver, and without a URL.

use std::sync::Arc;

use crate::helpers::*;
use crate::requests::{create, doc};

#[tokio::test]
async fn the_http_downstream_posts_with_the_idempotency_key_to_a_real_receiver() {
    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
    let seen = Arc::new(std::sync::Mutex::new(
        Vec::<(String, serde_json::Value)>::new(),
    ));
    let recorded = seen.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let receiver = HttpServer::new(move || {
        let recorded = recorded.clone();
        App::new().route(
            "/in",
            web::post().to(
                move |req: HttpRequest, body: web::Json<serde_json::Value>| {
                    let recorded = recorded.clone();
                    async move {
                        let key = req
                            .headers()
                            .get("Idempotency-Key")
                            .unwrap()
                            .to_str()
                            .unwrap()
                            .to_string();
                        recorded.lock().unwrap().push((key, body.into_inner()));
                        HttpResponse::Ok().finish()
                    }
                },
            ),
        )
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .disable_signals()
    .run();
    let handle = receiver.handle();
    tokio::spawn(receiver);
    let app = spawn_app_with(
        move |c| {
            c.push_str(&format!(
                "\n[downstream]\nurl = \"http://127.0.0.1:{port}/in\"\ntimeout_ms = 2000\n"
            ))
        },
        Default::default(),
    )
    .await;
    let id = create(&app).await;
    app.post(
        &format!("/requests/{id}/documents"),
        Some(SUBMIT_TOKEN),
        Some(doc("a.txt")),
    )
    .await;
    app.post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    app.drain().await;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, format!("requests:{id}"));
        assert_eq!(seen[0].1["request_id"], id.as_str());
        assert_eq!(seen[0].1["documents"][0]["content_base64"], "aGVsbG8=");
    }
    assert_eq!(app.event("requests", &id).await["outcome"], "delivered");
    handle.stop(true).await;
}

#[tokio::test]
async fn an_unconfigured_downstream_fails_submissions_with_a_clear_reason() {
    let app = spawn_app().await;
    let id = create(&app).await;
    app.post(&format!("/requests/{id}/submit"), Some(SUBMIT_TOKEN), None)
        .await;
    app.drain().await;
    let event = app.event("requests", &id).await;
    assert_eq!(event["status"], "failed");
    assert!(
        event["last_error"]
            .as_str()
            .unwrap()
            .contains("downstream.url is not configured")
    );
}
