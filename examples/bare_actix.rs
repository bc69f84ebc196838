//! The benchmark's reference: a bare actix-web handler on the same route shape as the receiver.
//! `--verify` adds Standard Webhooks verification (no store), to separate the cost of
//! signatures from the cost of durability.
//!
//! cargo run --release --example bare_actix -- 127.0.0.1:18081 [--verify SECRET]

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use webhook_inbox::domain::time::now_secs;
use webhook_inbox::signature::Scheme;
use webhook_inbox::signature::Secret;

struct Verify(Option<Secret>);

async fn receive(req: HttpRequest, body: web::Bytes, verify: web::Data<Verify>) -> HttpResponse {
    if let Some(secret) = &verify.0 {
        let headers: Vec<(String, String)> =
            ["webhook-id", "webhook-timestamp", "webhook-signature"]
                .iter()
                .filter_map(|h| {
                    let v = req.headers().get(*h)?.to_str().ok()?;
                    Some((h.to_string(), v.to_string()))
                })
                .collect();
        let secrets = std::slice::from_ref(secret);
        if Scheme::StandardWebhooks
            .verify(&headers, &body, secrets, now_secs(), 300)
            .is_err()
        {
            return HttpResponse::Unauthorized().finish();
        }
    }
    HttpResponse::Ok()
        .json(serde_json::json!({"status": "queued", "queued": true, "bytes": body.len()}))
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18081".into());
    let verify = match (args.next().as_deref(), args.next()) {
        (Some("--verify"), Some(secret)) => Some(Secret::new(secret)),
        _ => None,
    };
    let verify = web::Data::new(Verify(verify));
    HttpServer::new(move || {
        App::new()
            .app_data(verify.clone())
            .app_data(web::PayloadConfig::new(1 << 20))
            .route("/webhooks/{source}", web::post().to(receive))
    })
    .backlog(4096)
    .bind(listen)?
    .run()
    .await
}
