//! The submission API (SPEC section 6): build a request up, then submit it once.

use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::json;

use super::auth::Submitter;
use super::body::{parse_json, read_limited};
use super::openapi::ErrorBody;
use super::{ApiError, AppState, blocking, views};
use crate::domain::time::now_ms;
use crate::store::{AddDocument, NewDocument, SubmitOutcome};

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("no request `{id}`"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {}

/// A new draft request.
#[utoipa::path(post, path = "/requests",
    operation_id = "createRequest", tag = "requests", security(("bearer" = [])),
    request_body(content = Option<super::openapi::schemas::NewRequest>, description = "Optional; empty or `{}`"),
    responses(
        (status = 201, description = "The draft", body = super::views::Request),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: the body has fields", body = ErrorBody),
    ))]
pub async fn create(
    _: Submitter,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = read_limited(&req, payload, 64 * 1024).await?;
    let CreateRequest {} = parse_json(&body)?;
    let id = format!("req_{}", uuid::Uuid::new_v4().simple());
    let record = blocking(&state, move |s| s.create_request(&id, now_ms())).await?;
    Ok(HttpResponse::Created().json(views::request(&record)))
}

/// A request; once submitted, with its event's state.
#[utoipa::path(get, path = "/requests/{id}",
    operation_id = "getRequest", tag = "requests", security(("bearer" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "The request", body = super::views::Request),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub async fn get(
    _: Submitter,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let record = {
        let id = id.clone();
        blocking(&state, move |s| s.request(&id)).await?
    };
    record
        .map(|r| HttpResponse::Ok().json(views::request(&r)))
        .ok_or_else(|| not_found(&id))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DocumentBody {
    name: String,
    content_type: String,
    content: String,
    encoding: Option<String>,
}

impl DocumentBody {
    fn into_document(self) -> Result<NewDocument, ApiError> {
        if self.name.trim().is_empty() || self.name.len() > 255 {
            return Err(ApiError::InvalidRequest(
                "name: must be 1 to 255 characters".into(),
            ));
        }
        if self.content_type.trim().is_empty() {
            return Err(ApiError::InvalidRequest(
                "content_type: must not be empty".into(),
            ));
        }
        let content = match self.encoding.as_deref() {
            None | Some("utf-8") | Some("text") => self.content.into_bytes(),
            Some("base64") => STANDARD.decode(self.content.trim()).map_err(|e| {
                ApiError::InvalidRequest(format!("content: not valid base64 ({e})"))
            })?,
            Some(other) => {
                return Err(ApiError::InvalidRequest(format!(
                    "encoding: `{other}` is not supported; use base64 or leave it out"
                )));
            }
        };
        Ok(NewDocument {
            id: format!("doc_{}", uuid::Uuid::new_v4().simple()),
            name: self.name,
            content_type: self.content_type,
            content,
        })
    }
}

/// Add a document to a draft.
#[utoipa::path(post, path = "/requests/{id}/documents",
    operation_id = "addRequestDocument", tag = "requests", security(("bearer" = [])),
    params(("id" = String, Path)),
    request_body(content = super::openapi::schemas::NewDocument),
    responses(
        (status = 200, description = "The request with the document", body = super::views::Request),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`conflict`: already submitted", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: a missing or bad field, named in `message`", body = ErrorBody),
    ))]
pub async fn add_document(
    _: Submitter,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    // base64 inflates by 4/3; the decoded document stays within the body limit.
    let limit = state.settings.body_limit_bytes.saturating_mul(4) / 3 + 1024;
    let body = read_limited(&req, payload, limit).await?;
    let doc = parse_json::<DocumentBody>(&body)?.into_document()?;
    let result = {
        let id = id.clone();
        blocking(&state, move |s| s.add_document(&id, &doc, now_ms())).await?
    };
    match result {
        AddDocument::Added(r) => Ok(HttpResponse::Ok().json(views::request(&r))),
        AddDocument::NotFound => Err(not_found(&id)),
        AddDocument::Submitted => Err(ApiError::Conflict(format!(
            "request `{id}` is already submitted; documents can only be added to a draft"
        ))),
    }
}

/// Submit a request: one transaction turns it `submitted` and queues its event.
#[utoipa::path(post, path = "/requests/{id}/submit",
    operation_id = "submitRequest", tag = "requests", security(("bearer" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "`queued` the first time, `duplicate` after", body = super::openapi::schemas::Submitted),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub async fn submit(
    _: Submitter,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let outcome = {
        let id = id.clone();
        blocking(&state, move |s| s.submit_request(&id, now_ms())).await?
    };
    match outcome {
        SubmitOutcome::NotFound => Err(not_found(&id)),
        SubmitOutcome::Queued => {
            state.queued.notify_waiters();
            Ok(HttpResponse::Ok().json(json!({"queued": true, "status": "queued"})))
        }
        SubmitOutcome::Duplicate => {
            Ok(HttpResponse::Ok().json(json!({"queued": false, "status": "duplicate"})))
        }
    }
}
