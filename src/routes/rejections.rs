//! `GET /rejections`: deliveries refused at the edge, newest first (see `crate::rejections`).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::auth::Admin;
use super::events::{query, time_param};
use super::openapi::ErrorBody;
use super::paging::Paging;
use super::{ApiError, AppState, blocking};
use crate::domain::time::rfc3339;
use crate::store::{RejectionFilter, RejectionRecord};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    source: Option<String>,
    reason: Option<String>,
    received_after: Option<String>,
    received_before: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// A delivery refused at the edge.
#[derive(Debug, Serialize, ToSchema)]
pub struct Rejection {
    id: i64,
    #[schema(format = DateTime)]
    received_at: String,
    /// The source named in the path (it may be no configured source).
    source: String,
    /// The sender's address (behind trusted proxies, the forwarded one).
    #[schema(required = true)]
    peer: Option<String>,
    /// The error code of the answer: `invalid_signature`, `unknown_source`, …
    reason: String,
    /// The HTTP status of the answer.
    status: u16,
    message: String,
    /// Every header's name; its value, or `null` where it may hold a secret (signatures,
    /// authorization, tokens, keys).
    #[schema(value_type = Object)]
    headers: serde_json::Value,
    /// The body's size (or the declared `Content-Length` when the body was not read).
    #[schema(required = true)]
    body_bytes: Option<i64>,
    /// The body's SHA-256, hex, when it was read.
    #[schema(required = true)]
    body_sha256: Option<String>,
}

/// A page of refusals.
#[derive(Debug, Serialize, ToSchema)]
pub struct RejectionPage {
    rejections: Vec<Rejection>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

fn view(r: &RejectionRecord) -> Rejection {
    let d = &r.rejection;
    Rejection {
        id: r.id,
        received_at: rfc3339(d.received_at),
        source: d.source.clone(),
        peer: d.peer.clone(),
        reason: d.reason.clone(),
        status: d.status,
        message: d.message.clone(),
        headers: serde_json::from_str(&d.headers).unwrap_or_else(|_| json!({})),
        body_bytes: d.body_bytes,
        body_sha256: d.body_sha256.clone(),
    }
}

/// Deliveries refused at the edge (unknown source, bad signature, stale timestamp, oversize,
/// bad body, forbidden sender), newest first: the last `[rejections] keep_count`, none older
/// than `keep_days`. The answer to "why does the provider say our endpoint fails?".
#[utoipa::path(get, path = "/rejections",
    operation_id = "listRejections", tag = "ops", security(("bearer" = [])),
    params(
        ("source" = Option<String>, Query, description = "Only refusals for this source name"),
        ("reason" = Option<String>, Query, description = "Only this error code, e.g. `invalid_signature`"),
        ("received_after" = Option<String>, Query, format = DateTime, description = "RFC 3339"),
        ("received_before" = Option<String>, Query, format = DateTime, description = "RFC 3339"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "Page size (default 50)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of refusals", body = RejectionPage),
        (status = 422, description = "`invalid_request`: a bad or unknown query parameter, named in `message`", body = ErrorBody),
    ))]
pub async fn list(
    _: Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let params: Params = query(&req)?;
    let filter = RejectionFilter {
        source: params.source,
        reason: params.reason,
        received_after: time_param("received_after", &params.received_after)?,
        received_before: time_param("received_before", &params.received_before)?,
    };
    let paging = Paging::parse(params.limit.as_deref(), params.cursor.as_deref())?;
    let page = paging.page();
    let mut rows = blocking(&state, move |s| s.rejections(&filter, page)).await?;
    let next_cursor = paging.finish(&mut rows, |r| r.id);
    Ok(HttpResponse::Ok().json(RejectionPage {
        rejections: rows.iter().map(view).collect(),
        next_cursor,
    }))
}
