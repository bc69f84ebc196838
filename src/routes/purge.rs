//! `POST /events/purge` (SPEC section 12): purge on demand, with times that win over
//! `[retention]`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;

use super::auth::Admin;
use super::body::{parse_json, read_limited};
use super::{ApiError, AppState, blocking};
use crate::domain::time::{now_ms, parse_rfc3339};
use crate::retention::{self, PAUSE};

const FIELDS: [&str; 2] = ["completed_before", "failed_before"];

/// Body `{"completed_before","failed_before"}`, each an RFC 3339 time and optional (an empty
/// body is `{}`): a field given replaces that kind's `[retention]` age, one left out keeps it.
/// Answers `{"purged": n}` once the whole walk is done.
#[utoipa::path(post, path = "/events/purge", tag = "ops", security(("bearer" = [])),
    request_body(content = super::openapi::schemas::Purge, description = "The cut-off times; an empty body uses `[retention]`"),
    responses(
        (status = 200, description = "How many events became tombstones", body = super::openapi::schemas::Purged),
        (status = 400, description = "`invalid_json`: the body is not JSON", body = super::openapi::ErrorBody),
        (status = 413, description = "`payload_too_large`", body = super::openapi::ErrorBody),
        (status = 422, description = "`invalid_request`: an unknown field or a bad time, named in `message`", body = super::openapi::ErrorBody),
    ))]
pub async fn purge(
    _: Admin,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = read_limited(&req, payload, 4096).await?;
    let fields: serde_json::Map<String, serde_json::Value> = if body.is_empty() {
        serde_json::Map::new()
    } else {
        parse_json(&body)?
    };
    let now = now_ms();
    let mut cutoffs = retention::configured_cutoffs(&state.settings.retention, now);
    for (key, value) in &fields {
        let time = match value.as_str() {
            _ if !FIELDS.contains(&key.as_str()) => {
                return Err(ApiError::InvalidRequest(format!(
                    "{key}: unknown field; purge takes {}",
                    FIELDS.join(", ")
                )));
            }
            Some(text) => parse_rfc3339(text).ok_or_else(|| {
                ApiError::InvalidRequest(format!("{key}: `{text}` is not an RFC 3339 time"))
            })?,
            None => {
                return Err(ApiError::InvalidRequest(format!(
                    "{key}: must be an RFC 3339 time as a string, not {value}"
                )));
            }
        };
        match key.as_str() {
            "completed_before" => cutoffs.completed_before = Some(time),
            _ => cutoffs.failed_before = Some(time),
        }
    }
    let purged = blocking(&state, move |s| {
        retention::purge_pass(s, &cutoffs, now, PAUSE, &|| false)
    })
    .await?;
    state.metrics.purged(purged);
    Ok(HttpResponse::Ok().json(json!({"purged": purged})))
}
