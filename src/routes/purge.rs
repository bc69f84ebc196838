//! `POST /events/purge` (SPEC section 12): purge on demand, with times that win over
//! `[retention]`. A call is bounded in time: a large first purge takes several calls, each
//! going on from where the last stopped (the CLI loops).

use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value, json};

use super::auth::Admin;
use super::body::{parse_json, read_limited};
use super::paging::{decode_tagged, encode_tagged};
use super::{ApiError, AppState, blocking};
use crate::domain::time::{now_ms, parse_rfc3339};
use crate::retention::{self, PAUSE, Walk};
use crate::store::PurgeCutoffs;

const FIELDS: [&str; 4] = ["completed_before", "failed_before", "limit", "cursor"];
/// One call walks this long at most (then one batch more), so that it answers well inside a
/// client's timeout however large the table; the answer says where to go on.
pub const CALL_BUDGET: Duration = Duration::from_secs(5);
/// Keeps purge cursors apart from list cursors.
const CURSOR_TAG: &str = "purge1";

/// Body `{"completed_before","failed_before","limit","cursor"}`, each optional (an empty body
/// is `{}`): a time given replaces that kind's `[retention]` age, one left out keeps it.
/// Answers `{"purged": n, "more": false, "next_cursor": null}` once the walk reached the newest
/// event; after `CALL_BUDGET` or `limit` tombstones, `"more": true` and the cursor to send
/// with the same times to go on.
#[utoipa::path(post, path = "/events/purge",
    operation_id = "purgeEvents", tag = "ops", security(("bearer" = [])),
    request_body(content = super::openapi::schemas::Purge, description = "The cut-off times; an empty body uses `[retention]`"),
    responses(
        (status = 200, description = "How many events became tombstones in this call, and whether to call again with `next_cursor`", body = super::openapi::schemas::Purged),
        (status = 400, description = "`invalid_json`: the body is not JSON", body = super::openapi::ErrorBody),
        (status = 413, description = "`payload_too_large`", body = super::openapi::ErrorBody),
        (status = 422, description = "`invalid_request`: an unknown field, a bad time, limit or cursor, named in `message`", body = super::openapi::ErrorBody),
    ))]
pub async fn purge(
    _: Admin,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = read_limited(&req, payload, 4096).await?;
    let fields: Map<String, Value> = if body.is_empty() {
        Map::new()
    } else {
        parse_json(&body)?
    };
    let now = now_ms();
    let mut cutoffs = retention::configured_cutoffs(&state.settings.retention, now);
    let walk = parse(&fields, &mut cutoffs)?;
    let deadline = Instant::now() + CALL_BUDGET;
    let walked = blocking(&state, move |s| {
        retention::purge_walk(s, &cutoffs, now, &walk, &|| Instant::now() >= deadline)
    })
    .await?;
    state.metrics.purged(walked.purged);
    let next_cursor = walked
        .resume_after
        .map(|after| encode_tagged(CURSOR_TAG, after));
    Ok(HttpResponse::Ok().json(json!({
        "purged": walked.purged,
        "more": next_cursor.is_some(),
        "next_cursor": next_cursor,
    })))
}

/// The walk the body asks for; the times it gives go into `cutoffs`.
fn parse(fields: &Map<String, Value>, cutoffs: &mut PurgeCutoffs) -> Result<Walk, ApiError> {
    let mut walk = Walk {
        after: 0,
        limit: None,
        pause: PAUSE,
        settle: false,
    };
    for (key, value) in fields {
        match (key.as_str(), value) {
            ("limit", _) => {
                let limit = value
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        ApiError::InvalidRequest(format!(
                            "limit: must be a whole number of at least 1, not {value}"
                        ))
                    })?;
                walk.limit = Some(limit);
            }
            ("cursor", Value::String(text)) => {
                walk.after = decode_tagged(CURSOR_TAG, "cursor", text)?;
            }
            ("cursor", _) => {
                return Err(ApiError::InvalidRequest(format!(
                    "cursor: must be the `next_cursor` string of the previous answer, not {value}"
                )));
            }
            ("completed_before" | "failed_before", Value::String(text)) => {
                let time = parse_rfc3339(text).ok_or_else(|| {
                    ApiError::InvalidRequest(format!("{key}: `{text}` is not an RFC 3339 time"))
                })?;
                if key == "completed_before" {
                    cutoffs.completed_before = Some(time);
                } else {
                    cutoffs.failed_before = Some(time);
                }
            }
            ("completed_before" | "failed_before", _) => {
                return Err(ApiError::InvalidRequest(format!(
                    "{key}: must be an RFC 3339 time as a string, not {value}"
                )));
            }
            _ => {
                return Err(ApiError::InvalidRequest(format!(
                    "{key}: unknown field; purge takes {}",
                    FIELDS.join(", ")
                )));
            }
        }
    }
    Ok(walk)
}
