//! Ordering per key, for ops (SPEC section 13): skipping the event that holds its key.

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::auth::Admin;
use super::events::known_subscription;
use super::openapi::ErrorBody;
use super::{ApiError, AppState, blocking, views};
use crate::domain::time::now_ms;
use crate::store::SkipOutcome;

#[derive(Debug, Deserialize)]
pub struct SkipParams {
    subscription: Option<String>,
}

/// Skip one subscription's state of an event: the failed (or waiting) event that holds its key
/// in an ordered subscription becomes completed with outcome `skipped`, recorded in its
/// history as an attempt by `ops`, and the later events of its key go on.
#[utoipa::path(post, path = "/events/{source}/{event_id}/skip",
    operation_id = "skipEvent", tag = "ops", security(("bearer" = [])),
    params(("source" = String, Path), ("event_id" = String, Path),
        ("subscription" = String, Query, description = "The subscription whose state is skipped")),
    responses(
        (status = 200, description = "The event after the skip", body = super::views::Event),
        (status = 404, description = "`not_found`: no such event, or no state of it in that subscription", body = ErrorBody),
        (status = 409, description = "`conflict`: the state is claimed (in flight) or completed", body = ErrorBody),
        (status = 422, description = "`invalid_request`: `subscription` missing or unknown", body = ErrorBody),
    ))]
pub async fn skip(
    _: Admin,
    path: web::Path<(String, String)>,
    query: web::Query<SkipParams>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let subscription = query.subscription.clone().ok_or_else(|| {
        ApiError::InvalidRequest("subscription: required (the state to skip)".into())
    })?;
    known_subscription(&state, &subscription).await?;
    let outcome = {
        let (source, event_id, sub) = (source.clone(), event_id.clone(), subscription.clone());
        blocking(&state, move |s| s.skip(&source, &event_id, &sub, now_ms())).await?
    };
    match outcome {
        SkipOutcome::NotFound => Err(ApiError::NotFound(format!(
            "no event `{event_id}` of source `{source}` in subscription `{subscription}`"
        ))),
        SkipOutcome::Skipped(e) => {
            tracing::info!(%source, %event_id, %subscription, "event skipped by ops");
            state.queued.notify_waiters();
            Ok(HttpResponse::Ok().json(views::event(&e)))
        }
        SkipOutcome::Refused(status) => Err(ApiError::Conflict(format!(
            "event `{event_id}` is {} in `{subscription}`: only a failed or waiting event can be \
             skipped",
            status.as_str()
        ))),
    }
}
