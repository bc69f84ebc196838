//! A request id on every answer, the answers' common headers, and the log line of an error
//! answer.
//!
//! A middleware of its own rather than `middleware::from_fn`: `from_fn` boxes its future and
//! the next service's at every request, two allocations per delivery on the hot path (issue
//! 60, sixth look in docs/performance.md). This one wraps the next service's future as it is.

use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::header::{CACHE_CONTROL, HeaderName, HeaderValue, X_CONTENT_TYPE_OPTIONS};

use super::ApiError;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Whether a given request id may be logged and echoed as it is: 1 to 128 letters, digits, `-`,
/// `_` or `.` (a UUID, nginx's hex `$request_id`, a load balancer's trace id). Anything else
/// (spaces, `=`, quotes) could pose as another field of a log line, so a new id is made.
fn token_like(id: &[u8]) -> bool {
    (1..=128).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A request id per request, taken from `x-request-id` when it is sane, else generated, and
/// echoed in the response. Headers are never logged: they carry secrets.
///
/// Nothing is logged for an answered request (at the default level), so no span is opened up
/// front: a span's fields are formatted and stored for every request, logged or not (measured:
/// about 5,000 instructions per delivery, 4% of ingest). An error answer gets its line here,
/// with the request id, method, path and status, and the cause of a 5xx beside them.
pub struct RequestId;

impl<S, B> Transform<S, ServiceRequest> for RequestId
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    S::Future: Unpin,
    B: MessageBody,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Transform = RequestIdService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RequestIdService { service }))
    }
}

pub struct RequestIdService<S> {
    service: S,
}

impl<S, B> Service<ServiceRequest> for RequestIdService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    S::Future: Unpin,
    B: MessageBody,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Future = Answered<S::Future>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        // Kept as a header value: echoing it costs no allocation (the common case).
        let header = req
            .headers()
            .get(&REQUEST_ID)
            .filter(|v| token_like(v.as_bytes()))
            .cloned()
            .unwrap_or_else(|| {
                let mut buf = uuid::Uuid::encode_buffer();
                let id = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
                HeaderValue::from_str(id).expect("a uuid is a header value")
            });
        Answered {
            inner: self.service.call(req),
            header: Some(header),
        }
    }
}

/// The next service's answer, finished by [`finish`] once it is ready.
pub struct Answered<F> {
    inner: F,
    /// Taken when the answer is ready.
    header: Option<HeaderValue>,
}

impl<F, B> Future for Answered<F>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = std::task::ready!(Pin::new(&mut self.inner).poll(cx))?;
        let header = self
            .header
            .take()
            .expect("an answered request is not polled again");
        finish(&mut response, header);
        Poll::Ready(Ok(response))
    }
}

/// Log an error answer, and set the headers every answer carries.
fn finish<B>(response: &mut ServiceResponse<B>, header: HeaderValue) {
    let id = header.to_str().unwrap_or_default();
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        let (method, path) = (response.request().method(), response.request().path());
        let code = status.as_u16();
        match response
            .response()
            .error()
            .and_then(|e| e.as_error::<ApiError>())
        {
            Some(ApiError::Internal(e)) => {
                tracing::error!(request_id = %id, %method, %path, status = code, error = ?e, "internal error");
            }
            Some(ApiError::Unavailable(cause)) => {
                tracing::warn!(request_id = %id, %method, %path, status = code, %cause, "answering 503");
            }
            Some(ApiError::NotReady(why)) => {
                tracing::warn!(request_id = %id, %method, %path, status = code, reason = why, "not ready");
            }
            _ => tracing::info!(request_id = %id, %method, %path, status = code, "refused"),
        }
    } else {
        tracing::debug!(request_id = %id, method = %response.request().method(),
            path = %response.request().path(), status = status.as_u16(), "answered");
    }
    let headers = response.headers_mut();
    headers.insert(REQUEST_ID, header);
    // Answers carry events, bodies, refusals and settings: no cache keeps them, and no
    // browser reads one as anything but what it says it is. A route that allows caching (the
    // dashboard's files) says so itself.
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
}
