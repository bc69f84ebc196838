//! Open routes: liveness, readiness and metrics.

use actix_web::{HttpResponse, web};
use serde_json::json;

use super::openapi::ErrorBody;
use super::{ApiError, AppState, blocking};
use crate::domain::time::now_ms;
use crate::store::Readiness;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz",
    operation_id = "getHealth", tag = "open",
    responses((status = 200, description = "Alive", body = super::openapi::schemas::Health)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Ready when the store answers, every migration is applied and writes are still durable.
#[utoipa::path(get, path = "/readyz",
    operation_id = "getReadiness", tag = "open",
    responses(
        (status = 200, description = "Ready", body = super::openapi::schemas::Ready),
        (status = 503, description = "`unavailable`: not ready; `message` says why and what to do",
            body = ErrorBody, headers(("Retry-After" = u32, description = "Seconds"))),
    ))]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match blocking(&state, |s| s.ready()).await? {
        Readiness::NotWritable => Err(ApiError::NotReady(
            "the database is not writable by this process: give it write access, or \
             remount its filesystem read-write",
        )),
        Readiness::Ready => Ok(HttpResponse::Ok().json(json!({"status": "ready"}))),
        Readiness::NotMigrated => Err(ApiError::NotReady(
            "migrations are not applied: run `webhook-inbox migrate`",
        )),
        Readiness::NotDurable => Err(ApiError::NotReady(
            "a write could not be made durable (a failed fsync): writes are refused until the \
             service restarts",
        )),
    }
}

/// Prometheus metrics (OpenMetrics text).
#[utoipa::path(get, path = "/metrics",
    operation_id = "getMetrics", tag = "open",
    responses((status = 200, description = "The metrics", body = String,
        content_type = "application/openmetrics-text")))]
pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    // The lag is measured at each read's start, its snapshot: a time taken after it would add
    // the read's own duration, which grows with the history (`completed` is a count of every
    // state row; a soak's gauge crept from 0.05 to 0.22 s over 18 million events while the
    // oldest due event, read from the file, stayed at 0.01 to 0.04 s).
    let counted_at = now_ms();
    let counts = blocking(&state, |s| s.status_counts()).await?;
    let lifecycle = blocking(&state, |s| s.lifecycle_counts()).await?;
    let listed_at = now_ms();
    let subscriptions = blocking(&state, |s| s.subscriptions(false)).await?;
    state.metrics.set_lifecycle(&lifecycle);
    state.metrics.set_subscriptions(&subscriptions, listed_at);
    state.metrics.set_filtered_out(&state.store.filtered_out());
    let text = state.metrics.render(&counts, counted_at);
    Ok(HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(text))
}
