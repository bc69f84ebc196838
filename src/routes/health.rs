//! Open routes: liveness, readiness and metrics.

use actix_web::{HttpResponse, web};
use serde_json::json;

use super::{ApiError, AppState, blocking};
use crate::domain::time::now_ms;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Ready when the store answers and every migration is applied.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if blocking(&state, |s| s.ready()).await? {
        Ok(HttpResponse::Ok().json(json!({"status": "ready"})))
    } else {
        Err(ApiError::Unavailable("migrations are not applied".into()))
    }
}

pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let counts = blocking(&state, |s| s.status_counts()).await?;
    let text = state.metrics.render(&counts, now_ms());
    Ok(HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(text))
}
