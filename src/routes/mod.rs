//! HTTP only: extract, call the library, map errors. No SQL and no business rules here.

mod alerts;
mod auth;
mod body;
mod error;
mod events;
mod health;
mod loyalty;
mod openapi;
mod ordering;
pub mod paging;
mod preview;
mod pull;
mod purge;
mod rejected;
mod rejections;
mod request_id;
mod requests;
mod secrets;
mod sender;
mod stats;
mod subscription_changes;
mod subscription_view;
mod subscriptions;
mod ui;
mod views;
mod webhooks;

use std::sync::Arc;

use actix_web::{HttpResponse, web};
use tokio::sync::Notify;

pub use error::ApiError;
pub use request_id::RequestId;

use crate::config::Settings;
use crate::consumer::Consumer;
use crate::ingest::Ingestor;
use crate::metrics::Metrics;
use crate::rejections::Rejections;
use crate::store::{Store, StoreResult};

/// What every route may use.
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<dyn Store>,
    pub ingest: Ingestor,
    pub metrics: Arc<Metrics>,
    pub consumer: Arc<Consumer>,
    /// Notified when new work is queued, so idle workers wake at once.
    pub queued: Arc<Notify>,
    /// `host-pid`, recorded on attempts made by `POST /events/run`.
    pub worker_name: String,
    /// Refused deliveries, kept for `GET /rejections`.
    pub rejections: Rejections,
    /// The registry's `pull` subscriptions (whose clients claim over HTTP) and forwarders.
    pub served: Arc<crate::served::Served>,
    /// The subscriptions' secrets (shown and rotated by `subscriptions/secrets.rs`).
    pub vault: Arc<crate::secrets::Vault>,
    /// Turns `true` when the service starts shutting down: long polls answer at once.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// Spans of deliveries and pull claims (`[telemetry]`; off: none).
    pub traces: crate::telemetry::Traces,
    /// The worker processes that run transforms (the preview's; the forwarders' and pull
    /// routes' are the same).
    pub transforms: Arc<crate::transform::Pool>,
}

/// Run a store call on the blocking pool, keeping the request's span.
async fn blocking<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&dyn Store) -> StoreResult<T> + Send + 'static,
) -> Result<T, ApiError> {
    let store = Arc::clone(&state.store);
    let span = tracing::Span::current();
    let result = web::block(move || span.in_scope(|| f(store.as_ref())))
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("blocking task failed: {e}")))?;
    Ok(result?)
}

/// Every route, and JSON errors for what actix would otherwise answer in plain text.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::PathConfig::default()
            .error_handler(|e, _| ApiError::InvalidRequest(format!("path: {e}")).into()),
    )
    .app_data(
        web::QueryConfig::default()
            .error_handler(|e, _| ApiError::InvalidRequest(format!("query string: {e}")).into()),
    )
    .service(resource("/healthz").route(web::get().to(health::healthz)))
    .service(resource("/readyz").route(web::get().to(health::readyz)))
    .service(resource("/metrics").route(web::get().to(health::metrics)))
    .service(resource("/webhooks/{source}").route(web::post().to(webhooks::receive)))
    .service(resource("/events").route(web::get().to(events::list)))
    .service(resource("/events/stats").route(web::get().to(stats::stats)))
    .service(resource("/events/retry").route(web::post().to(events::retry_bulk)))
    .service(resource("/events/export").route(web::get().to(events::export)))
    .service(resource("/events/run").route(web::post().to(events::run)))
    .service(resource("/events/purge").route(web::post().to(purge::purge)))
    .service(resource("/events/{source}/{event_id}").route(web::get().to(events::show)))
    .service(resource("/events/{source}/{event_id}/retry").route(web::post().to(events::retry)))
    .service(resource("/events/{source}/{event_id}/skip").route(web::post().to(ordering::skip)))
    .service(resource("/loyalty/{customer_id}").route(web::get().to(loyalty::show)))
    .service(resource("/rejections").route(web::get().to(rejections::list)))
    .service(resource("/alerts").route(web::get().to(alerts::list)))
    .service(
        resource("/subscriptions")
            .route(web::get().to(subscriptions::list))
            .route(web::post().to(subscription_changes::create)),
    )
    // Before `{name}`, and only for POST: a subscription named `preview` keeps its GET, PATCH
    // and DELETE (a resource's guard sends other methods on to the next resource).
    .service(
        resource("/subscriptions/preview")
            .guard(actix_web::guard::Post())
            .route(web::post().to(preview::preview)),
    )
    .service(
        resource("/subscriptions/{name}")
            .route(web::get().to(subscriptions::show))
            .route(web::patch().to(subscription_changes::update))
            .route(web::delete().to(subscription_changes::delete)),
    )
    .service(resource("/subscriptions/{name}/pause").route(web::post().to(subscriptions::pause)))
    .service(resource("/subscriptions/{name}/resume").route(web::post().to(subscriptions::resume)))
    .service(resource("/subscriptions/{name}/secret").route(web::get().to(secrets::show)))
    .service(resource("/subscriptions/{name}/rotate-secret").route(web::post().to(secrets::rotate)))
    .service(resource("/subscriptions/{name}/claim").route(web::post().to(pull::claim)))
    .service(resource("/subscriptions/{name}/ack").route(web::post().to(pull::ack)))
    .service(resource("/subscriptions/{name}/extend").route(web::post().to(pull::extend)))
    .service(
        resource("/subscriptions/{name}/backfill").route(web::post().to(subscriptions::backfill)),
    )
    .service(
        resource("/subscriptions/{name}/recover").route(web::post().to(subscriptions::recover)),
    )
    .service(resource("/requests").route(web::post().to(requests::create)))
    .service(resource("/requests/{id}").route(web::get().to(requests::get)))
    .service(resource("/requests/{id}/documents").route(web::post().to(requests::add_document)))
    .service(resource("/requests/{id}/submit").route(web::post().to(requests::submit)))
    .configure(ui::configure)
    .configure(openapi::configure)
    .default_service(web::to(no_route));
}

fn resource(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

/// The answer names neither the path nor the method: what a request sends is not echoed back
/// to whoever can make a browser send it.
async fn no_route() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(
        "no such route: the routes are listed in /openapi.json".into(),
    ))
}

async fn method_not_allowed() -> HttpResponse {
    HttpResponse::MethodNotAllowed().json(serde_json::json!({
        "error": "method_not_allowed",
        "message": "this route does not take that method: see /openapi.json",
    }))
}
