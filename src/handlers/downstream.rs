//! Submitted requests go to the downstream system: the seam to the outside world.
//!
//! At-most-once by default: the downstream may not honour idempotency keys, so the handler
//! makes one attempt, and an attempt whose outcome is unknown (the worker died, the lease
//! expired) is failed as abandoned for ops rather than repeated. `downstream.mode =
//! "at-least-once"` retries with backoff; use it only for a downstream that deduplicates on
//! the `Idempotency-Key` header, which is the event key. No transaction is open during the call.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::{Handled, Handler};
use crate::config::DeliveryMode;
use crate::store::{Claimed, Outcome, Store};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DownstreamError(pub String);

/// The external system. Tests use a recording fake; production uses [`HttpDownstream`].
pub trait DownstreamSystem: Send + Sync {
    /// Deliver `body`; the same `idempotency_key` names the same submission on every attempt.
    /// Returns a short receipt for the logs.
    fn submit(&self, idempotency_key: &str, body: &[u8]) -> Result<String, DownstreamError>;
}

/// POSTs JSON to `downstream.url` with an `Idempotency-Key` header, bounded by `timeout_ms`.
pub struct HttpDownstream {
    url: String,
    timeout: Duration,
    // Built on first use, inside the blocking worker thread: reqwest's blocking client must not
    // be created on an async runtime thread.
    client: OnceLock<Result<reqwest::blocking::Client, String>>,
}

impl HttpDownstream {
    pub fn new(url: &str, timeout: Duration) -> HttpDownstream {
        HttpDownstream {
            url: url.to_string(),
            timeout,
            client: OnceLock::new(),
        }
    }
}

impl DownstreamSystem for HttpDownstream {
    fn submit(&self, idempotency_key: &str, body: &[u8]) -> Result<String, DownstreamError> {
        if self.url.is_empty() {
            return Err(DownstreamError(
                "downstream.url is not configured: set it to deliver submitted requests".into(),
            ));
        }
        let client = self
            .client
            .get_or_init(|| {
                reqwest::blocking::Client::builder()
                    .timeout(self.timeout)
                    .build()
                    .map_err(|e| format!("building the HTTP client: {e}"))
            })
            .as_ref()
            .map_err(|e| DownstreamError(e.clone()))?;
        let response = client
            .post(&self.url)
            .header("Idempotency-Key", idempotency_key)
            .header("Content-Type", "application/json")
            .body(body.to_vec())
            .send()
            .map_err(|e| DownstreamError(format!("POST {}: {e}", self.url)))?;
        let status = response.status();
        if status.is_success() {
            Ok(format!("HTTP {status}"))
        } else {
            let text: String = response
                .text()
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect();
            Err(DownstreamError(format!(
                "POST {} answered {status}: {text}",
                self.url
            )))
        }
    }
}

pub struct SubmitRequest {
    store: Arc<dyn Store>,
    downstream: Arc<dyn DownstreamSystem>,
    mode: DeliveryMode,
}

impl SubmitRequest {
    pub fn new(
        store: Arc<dyn Store>,
        downstream: Arc<dyn DownstreamSystem>,
        mode: DeliveryMode,
    ) -> SubmitRequest {
        SubmitRequest {
            store,
            downstream,
            mode,
        }
    }

    fn body(&self, request_id: &str) -> Result<Vec<u8>, String> {
        let docs = self
            .store
            .request_documents(request_id)
            .map_err(|e| format!("reading the request's documents: {e}"))?;
        let documents: Vec<serde_json::Value> = docs
            .iter()
            .map(|d| {
                serde_json::json!({
                    "id": d.summary.id,
                    "name": d.summary.name,
                    "content_type": d.summary.content_type,
                    "size": d.summary.size,
                    "content_base64": STANDARD.encode(&d.content),
                })
            })
            .collect();
        Ok(serde_json::to_vec(&serde_json::json!({
            "request_id": request_id,
            "documents": documents,
        }))
        .expect("a JSON value serialises"))
    }
}

impl Handler for SubmitRequest {
    fn name(&self) -> &'static str {
        "downstream_submission"
    }

    fn mode(&self) -> DeliveryMode {
        self.mode
    }

    fn external(&self) -> bool {
        true
    }

    fn handle(&self, event: &Claimed) -> Handled {
        let body = match self.body(&event.claim.event_id) {
            Ok(b) => b,
            // Reading our own store failed before any call: safe to retry in either mode.
            Err(e) => return Handled::Retryable(e),
        };
        let key = format!("{}:{}", event.claim.source, event.claim.event_id);
        match self.downstream.submit(&key, &body) {
            Ok(receipt) => {
                tracing::info!(idempotency_key = %key, %receipt, "downstream accepted");
                Handled::Complete {
                    effect: None,
                    outcome: Outcome::Delivered,
                }
            }
            Err(e) => match self.mode {
                DeliveryMode::AtMostOnce => Handled::Permanent(format!(
                    "downstream call failed (at-most-once: not retried): {e}"
                )),
                DeliveryMode::AtLeastOnce => {
                    Handled::Retryable(format!("downstream call failed: {e}"))
                }
            },
        }
    }
}
