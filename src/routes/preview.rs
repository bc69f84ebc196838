//! `POST /subscriptions/preview` (SPEC section 13, admin): what a filter makes of one event, a
//! stored one or a body given, without changing anything. The decision is the Rust evaluator
//! the corpus test holds both stores' fan-outs to (`Filter::matches`). A `transform` runs as at
//! delivery, in the node's transform workers, with the same budgets.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::auth::Admin;
use super::body::{parse_json, read_limited};
use super::openapi::ErrorBody;
use super::{ApiError, AppState, blocking};
use crate::subscriptions::filter::Filter;

/// A filter and an event; the body as large as a webhook's may be.
const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// What to preview: a `filter` (none: every event), and a stored `event` or a `body`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    /// As a subscription's `filter`.
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    /// As a subscription's `transform`: a jq program.
    #[schema(value_type = Option<String>)]
    transform: Option<Value>,
    /// A stored event.
    event: Option<EventRef>,
    /// A body, as JSON (instead of `event`).
    #[schema(value_type = serde_json::Value)]
    body: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRef {
    source: String,
    event_id: String,
}

/// The answer: whether the filter takes the event, and what would be delivered.
#[derive(Debug, Serialize, ToSchema)]
pub struct Preview {
    matches: bool,
    /// When it matches: what would be delivered: the transform's output, or without one the
    /// body as stored (its JSON value; text as a string). Null when it does not match, when the
    /// transform gives no output or fails.
    #[schema(value_type = serde_json::Value, required = true)]
    delivered: Option<Box<RawValue>>,
    /// A stored body that is neither JSON nor UTF-8, when it matches (then `delivered` is null).
    #[serde(skip_serializing_if = "Option::is_none")]
    delivered_base64: Option<String>,
    /// What running the transform failed with (the attempt would fail permanently with it).
    #[schema(value_type = Option<String>, required = true)]
    error: Option<String>,
    /// What a delivery would do: `delivered`, `filtered` (the transform gave no output: the
    /// state completes with outcome `filtered`), `failed` (see `error`), or `not_matched`.
    outcome: &'static str,
}

impl Preview {
    fn not_matched() -> Preview {
        Preview {
            matches: false,
            delivered: None,
            delivered_base64: None,
            error: None,
            outcome: "not_matched",
        }
    }

    /// What `transform` makes of a matching event's stored `payload`.
    async fn transformed(
        state: &AppState,
        transform: &crate::transform::Transform,
        payload: &[u8],
    ) -> Preview {
        let (delivered, error, outcome) = match state.transforms.run(transform, payload).await {
            crate::transform::Ran::One(json) => {
                let text = String::from_utf8(json).unwrap_or_default();
                (RawValue::from_string(text).ok(), None, "delivered")
            }
            crate::transform::Ran::Nothing => (None, None, "filtered"),
            crate::transform::Ran::Failed(message) => (None, Some(message), "failed"),
        };
        Preview {
            matches: true,
            delivered,
            delivered_base64: None,
            error,
            outcome,
        }
    }
}

fn refused(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::InvalidRequest(format!("{field}: {message}"))
}

/// Whether a filter takes an event (stored, or a body given), and what would be delivered;
/// nothing changes. A body that is not JSON matches no filter.
#[utoipa::path(post, path = "/subscriptions/preview",
    operation_id = "previewSubscription", tag = "ops", security(("bearer" = [])),
    request_body = PreviewRequest,
    responses(
        (status = 200, description = "The decision", body = Preview),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 404, description = "`not_found`: no such event", body = ErrorBody),
        (status = 409, description = "`conflict`: the event's body was purged", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`, naming the field (`filter` with its path and operator; `transform` with jaq's message and position)", body = ErrorBody),
    ))]
pub async fn preview(
    _: Admin,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = read_limited(&req, payload, BODY_LIMIT).await?;
    let object: serde_json::Map<String, Value> = parse_json(&body)?;
    let asked: PreviewRequest =
        serde_path_to_error::deserialize(Value::Object(object)).map_err(|e| {
            let field = crate::subscriptions::body_error(e);
            refused(&field.field, field.message)
        })?;
    let transform = match asked.transform.as_ref().filter(|t| !t.is_null()) {
        None => None,
        Some(Value::String(code)) => {
            Some(crate::transform::Transform::parse(code).map_err(|m| refused("transform", m))?)
        }
        Some(_) => return Err(refused("transform", "a jq program is a string")),
    };
    let filter = asked
        .filter
        .as_ref()
        .filter(|f| !f.is_null())
        .map(Filter::parse)
        .transpose()
        .map_err(|e| refused("filter", e))?;
    let answer = match (asked.event, asked.body) {
        (Some(_), Some(_)) => return Err(refused("body", "give `event` or `body`, not both")),
        (None, None) => {
            return Err(refused(
                "event",
                "give a stored `event` ({\"source\", \"event_id\"}) or a `body`",
            ));
        }
        (None, Some(body)) => match (filter.as_ref().is_none_or(|f| f.holds(&body)), &transform) {
            (false, _) => Preview::not_matched(),
            (true, Some(transform)) => {
                let bytes = serde_json::to_vec(&body).unwrap_or_default();
                Preview::transformed(&state, transform, &bytes).await
            }
            (true, None) => Preview {
                matches: true,
                delivered: serde_json::value::to_raw_value(&body).ok(),
                delivered_base64: None,
                error: None,
                outcome: "delivered",
            },
        },
        (Some(event), None) => {
            let (source, event_id) = (event.source.clone(), event.event_id.clone());
            let detail = blocking(&state, move |s| s.event(&source, &event_id))
                .await?
                .ok_or_else(|| {
                    ApiError::NotFound(format!(
                        "no event `{}` from source `{}`",
                        event.event_id, event.source
                    ))
                })?;
            if detail.event.purged_at.is_some() {
                return Err(ApiError::Conflict(
                    "the event's body was purged by retention: nothing to preview".into(),
                ));
            }
            let matches = filter.as_ref().is_none_or(|f| f.matches(&detail.payload));
            match (matches, &transform) {
                (false, _) => Preview::not_matched(),
                (true, Some(transform)) => {
                    Preview::transformed(&state, transform, &detail.payload).await
                }
                (true, None) => {
                    let shown =
                        crate::pull::body::encode(detail.content_type.as_deref(), &detail.payload);
                    Preview {
                        matches,
                        delivered_base64: shown.body_base64,
                        delivered: shown.body,
                        error: None,
                        outcome: "delivered",
                    }
                }
            }
        }
    };
    Ok(HttpResponse::Ok().json(answer))
}
