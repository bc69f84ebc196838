//! The one error type of the HTTP edge. Status codes appear only here; every error body is
//! `{"error": code, "message": text}` with a stable code.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::ingest::IngestError;
use crate::signature::SignatureError;
use crate::store::StoreError;

/// Seconds a client is told to wait after a 503.
pub const RETRY_AFTER_SECONDS: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid bearer token")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    UnknownSource(String),
    #[error("{0}")]
    InvalidSignature(String),
    #[error("{0}")]
    MissingSignature(String),
    #[error("{0}")]
    TimestampOutOfTolerance(String),
    #[error("{0}")]
    MissingEventId(String),
    /// An event id that is there but unusable: too long, control characters, only dots.
    #[error("{0}")]
    InvalidEventId(String),
    /// An event type longer than the store keeps.
    #[error("{0}")]
    InvalidEventType(String),
    #[error("{0}")]
    InvalidJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    PayloadMismatch(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The body did not arrive within `connections.body_timeout_ms`.
    #[error("{0}")]
    RequestTimeout(String),
    /// A delivery from outside its source's `allow_from`.
    #[error("{0}")]
    ForbiddenSender(String),
    /// The store cannot answer in time (503). The sender may be unauthenticated, so the answer
    /// says only what to do; the cause (an error chain, perhaps a file path) goes to the log.
    /// "Not acknowledged" is all a 503 promises: a commit whose durability could not be
    /// confirmed may still be on disk, and the provider's retry of it is then a `duplicate`.
    #[error("temporarily unavailable: the request was not acknowledged; retry later")]
    Unavailable(String),
    /// 503 from `/readyz`, with a fixed reason that names no path.
    #[error("{0}")]
    NotReady(&'static str),
    /// A bug: the client sees an opaque message, the log gets the cause chain.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound(_) => "not_found",
            ApiError::UnknownSource(_) => "unknown_source",
            ApiError::InvalidSignature(_) => "invalid_signature",
            ApiError::MissingSignature(_) => "missing_signature",
            ApiError::TimestampOutOfTolerance(_) => "timestamp_out_of_tolerance",
            ApiError::MissingEventId(_) => "missing_event_id",
            ApiError::InvalidEventId(_) => "invalid_event_id",
            ApiError::InvalidEventType(_) => "invalid_event_type",
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::PayloadMismatch(_) => "payload_mismatch",
            ApiError::Conflict(_) => "conflict",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::ForbiddenSender(_) => "forbidden_sender",
            ApiError::Unavailable(_) | ApiError::NotReady(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized
            | ApiError::InvalidSignature(_)
            | ApiError::MissingSignature(_)
            | ApiError::TimestampOutOfTolerance(_) => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) | ApiError::UnknownSource(_) => StatusCode::NOT_FOUND,
            ApiError::MissingEventId(_)
            | ApiError::InvalidEventId(_)
            | ApiError::InvalidEventType(_)
            | ApiError::InvalidJson(_) => StatusCode::BAD_REQUEST,
            ApiError::InvalidRequest(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadMismatch(_) | ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::ForbiddenSender(_) => StatusCode::FORBIDDEN,
            ApiError::Unavailable(_) | ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        // Logged by the request-id middleware, with the request's id (routes/mod.rs).
        let mut response = HttpResponse::build(self.status_code());
        if self.status_code() == StatusCode::SERVICE_UNAVAILABLE {
            response.insert_header(("Retry-After", RETRY_AFTER_SECONDS.to_string()));
        }
        if let ApiError::Unauthorized = self {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        response.json(serde_json::json!({
            "error": self.code(),
            "message": self.to_string(),
        }))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(cause) => ApiError::Unavailable(cause.chain()),
            StoreError::Internal(e) => ApiError::Internal(e),
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        ApiError::Unavailable(format!("delivery not acknowledged: {e}"))
    }
}

impl From<SignatureError> for ApiError {
    fn from(e: SignatureError) -> Self {
        match e {
            SignatureError::MissingHeader(_) => ApiError::MissingSignature(e.to_string()),
            SignatureError::Malformed { .. } | SignatureError::NoMatch => {
                ApiError::InvalidSignature(e.to_string())
            }
            SignatureError::TooOld(..) | SignatureError::TooNew(..) => {
                ApiError::TimestampOutOfTolerance(e.to_string())
            }
        }
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        ApiError::Internal(anyhow::Error::new(e).context("blocking task failed"))
    }
}

#[cfg(test)]
mod tests {
    /// A busy store answers 503 with the whole chain of its error, SQLite's own cause included.
    #[test]
    fn an_unavailable_store_answers_with_its_cause() {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("database is locked".into()),
        );
        let api = super::ApiError::from(crate::store::StoreError::from(busy));
        assert!(
            matches!(&api, super::ApiError::Unavailable(c) if c.contains("database is locked")),
            "{api:?}"
        );
    }
}
