//! Reading request bodies under a limit, and JSON bodies into typed values, so that every bad
//! body gets the error shape (actix's own extractors answer in plain text).

use std::future::Future as _;
use std::task::Poll;
use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::error::PayloadError;
use actix_web::http::header::CONTENT_LENGTH;
use actix_web::web::{self, Bytes, BytesMut};
use futures_util::{Stream, StreamExt as _};
use serde::de::DeserializeOwned;

use super::{ApiError, AppState};
use crate::config::ConnectionSettings;

fn too_large(limit: usize) -> ApiError {
    ApiError::PayloadTooLarge(format!("the body is larger than {limit} bytes"))
}

/// Read the body, refusing it from `Content-Length` when declared, and otherwise as soon as the
/// stream passes `limit`: an oversized body is never buffered whole. A body that takes longer
/// than `connections.body_timeout_ms` to arrive is refused (408): a client sending a byte at a
/// time holds a connection for that long at most, and nothing of its request is stored.
/// `payload` is the request's [`web::Payload`] or a `&mut` of it: a handler whose future must stay
/// small passes it by reference through its helpers (see `webhooks::receive`).
pub async fn read_limited<P>(
    req: &HttpRequest,
    mut payload: P,
    limit: usize,
) -> Result<BytesMut, ApiError>
where
    P: Stream<Item = Result<Bytes, PayloadError>> + Unpin,
{
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
    let timeout_ms = req
        .app_data::<web::Data<AppState>>()
        .map_or(ConnectionSettings::default().body_timeout_ms, |state| {
            state.settings.connections.body_timeout_ms
        });
    let read = async move {
        while let Some(chunk) = payload.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::InvalidJson(format!("reading the body: {e}")))?;
            if body.len() + chunk.len() > limit {
                return Err(too_large(limit));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    // A webhook's body usually comes in the same read as its head, but the dispatcher polls a
    // handler once before it feeds that body in: the first poll waits, and the next one (the
    // dispatcher's own, in the same turn; the wake below makes sure of it) finds the body
    // whole. The timer is armed only for a body still incomplete then: its registration and
    // removal cost about 1,000 instructions a delivery (docs/performance.md, issue 60, sixth
    // look).
    let mut read = std::pin::pin!(read);
    let mut waited = false;
    let early = std::future::poll_fn(|cx| match read.as_mut().poll(cx) {
        Poll::Ready(read) => Poll::Ready(Some(read)),
        Poll::Pending if !waited => {
            waited = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        Poll::Pending => Poll::Ready(None),
    })
    .await;
    if let Some(read) = early {
        return read;
    }
    match tokio::time::timeout(Duration::from_millis(timeout_ms), read).await {
        Ok(read) => read,
        Err(_) => Err(ApiError::RequestTimeout(format!(
            "the body did not arrive within {timeout_ms} ms (connections.body_timeout_ms)"
        ))),
    }
}

/// Syntax errors are `invalid_json` (400); JSON of the wrong shape is `invalid_request` (422)
/// with serde's message, after the field's path (`results[2].outcome: …`). An empty body reads as `{}`.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::InvalidJson(format!("the body is not JSON: {e}")))?
    };
    // Every body is an object of named fields (serde would also read a struct from an array,
    // by position, with a message that names no field).
    if !value.is_object() {
        return Err(ApiError::InvalidRequest(
            "the body must be a JSON object".into(),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        ApiError::InvalidRequest(if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        })
    })
}
