//! Submitted requests go to the downstream system: the seam to the outside world.
//!
//! At-most-once by default: the downstream may not honour idempotency keys, so an attempt
//! whose outcome is unknown (a timeout, a connection lost after sending, a 5xx, the worker
//! died or its lease expired mid-call) is failed as abandoned for ops rather than repeated.
//! Only a failure that proves nothing was sent (connection refused, 408, 429) is retried.
//! `downstream.mode = "at-least-once"` retries unknown outcomes with backoff too; use it only
//! for a downstream that deduplicates on the `Idempotency-Key` header, which is the event key.
//! No transaction is open during the call.
//!
//! A circuit breaker per subscription, kept in the store as a forwarder's is: after
//! [`FAILURES_TO_OPEN`] calls in a row that reached no answer (not sent, or outcome unknown),
//! its events are not claimed until a probe is due; the probe is one event, whose answer
//! closes the breaker or opens it again for twice as long (from [`BREAKER_FIRST_MS`] to
//! [`BREAKER_MAX_MS`]). An answer, even a refusal, says the downstream is there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::{Handled, Handler};
use crate::domain::time::now_ms;
use crate::domain::{DeliveryMode, error_chain};
use crate::store::{Claimed, Outcome, Store};

/// Calls in a row without an answer that open a subscription's breaker (as a forwarder's).
pub const FAILURES_TO_OPEN: u32 = 5;
/// The wait before the first probe; each failed probe doubles it, up to [`BREAKER_MAX_MS`].
pub const BREAKER_FIRST_MS: i64 = 1_000;
pub const BREAKER_MAX_MS: i64 = 300_000;

/// What a failed call proves about the downstream's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure {
    /// Nothing reached the downstream (connection refused, no such host, a 408 or 429 that
    /// says it was not processed): safe to call again, in either mode.
    NotSent,
    /// The downstream answered that it did not process the request (any other 4xx or 3xx), or
    /// there is nothing to call (no URL): calling again with the same request cannot help.
    Rejected,
    /// The request may have been acted on (a timeout, a connection lost after sending, a 5xx):
    /// an at-most-once event is abandoned for ops to decide.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DownstreamError {
    pub kind: CallFailure,
    /// For `last_error` and logs: never the downstream URL, which may hold credentials.
    pub message: String,
}

impl DownstreamError {
    pub fn new(kind: CallFailure, message: impl Into<String>) -> DownstreamError {
        DownstreamError {
            kind,
            message: message.into(),
        }
    }
}

/// The external system. Tests use a recording fake; production uses [`HttpDownstream`].
pub trait DownstreamSystem: Send + Sync {
    /// Deliver `body`; the same `idempotency_key` names the same submission on every attempt.
    /// Returns a short receipt for the logs.
    fn submit(&self, idempotency_key: &str, body: &[u8]) -> Result<String, DownstreamError>;
}

/// POSTs JSON to `downstream.url` with an `Idempotency-Key` header, bounded by `timeout_ms`.
/// Redirects are not followed (a redirected POST would become another request); errors never
/// name the URL.
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

    /// What a transport error proves: a failed connect sent nothing; anything later may have.
    fn failure(&self, e: reqwest::Error) -> DownstreamError {
        let kind = if e.is_connect() {
            CallFailure::NotSent
        } else {
            CallFailure::Unknown
        };
        let what = if e.is_connect() {
            "could not connect to the downstream (nothing was sent)".to_string()
        } else if e.is_timeout() {
            format!(
                "no answer from the downstream within {} ms (it may have acted)",
                self.timeout.as_millis()
            )
        } else {
            "the downstream call failed after the request may have been sent".to_string()
        };
        DownstreamError::new(kind, format!("{what}: {}", error_chain(&e.without_url())))
    }
}

impl DownstreamSystem for HttpDownstream {
    fn submit(&self, idempotency_key: &str, body: &[u8]) -> Result<String, DownstreamError> {
        if self.url.is_empty() {
            return Err(DownstreamError::new(
                CallFailure::Rejected,
                "downstream.url is not configured: set it to deliver submitted requests",
            ));
        }
        let client = self
            .client
            .get_or_init(|| {
                reqwest::blocking::Client::builder()
                    .timeout(self.timeout)
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| {
                        format!(
                            "building the HTTP client: {}",
                            error_chain(&e.without_url())
                        )
                    })
            })
            .as_ref()
            .map_err(|e| DownstreamError::new(CallFailure::NotSent, e.clone()))?;
        let response = client
            .post(&self.url)
            .header("Idempotency-Key", idempotency_key)
            .header("Content-Type", "application/json")
            .body(body.to_vec())
            .send()
            .map_err(|e| self.failure(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(format!("HTTP {status}"));
        }
        let kind = match status.as_u16() {
            408 | 429 => CallFailure::NotSent,
            300..=499 => CallFailure::Rejected,
            _ => CallFailure::Unknown,
        };
        let text: String = response
            .text()
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect();
        Err(DownstreamError::new(
            kind,
            format!("the downstream answered {status}: {text}"),
        ))
    }
}

pub struct SubmitRequest {
    store: Arc<dyn Store>,
    downstream: Arc<dyn DownstreamSystem>,
    mode: DeliveryMode,
    /// `downstream.timeout_ms`: a call starts only while the lease covers all of it.
    timeout: Duration,
    /// Calls in a row without an answer on this node, per subscription.
    failures: Mutex<HashMap<i64, u32>>,
}

impl SubmitRequest {
    pub fn new(
        store: Arc<dyn Store>,
        downstream: Arc<dyn DownstreamSystem>,
        mode: DeliveryMode,
        timeout: Duration,
    ) -> SubmitRequest {
        SubmitRequest {
            store,
            downstream,
            mode,
            timeout,
            failures: Mutex::default(),
        }
    }

    /// What a call's result says of the downstream, for `event`'s subscription's breaker: a
    /// run of calls without an answer (or a failed probe) opens it, an answer to the probe
    /// closes it. A write only when the breaker moves; its failure is logged, the event's
    /// own state is what the caller commits.
    fn observe(&self, event: &Claimed, answered: bool) {
        let sub = event.claim.subscription;
        let run = {
            let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let run = failures.entry(sub).or_default();
            *run = if answered { 0 } else { run.saturating_add(1) };
            *run
        };
        // A downstream subscription's row keeps no settings (its target is the node's
        // `[downstream]`): nothing to fence its breaker's moves by.
        let written = match (answered, event.probe) {
            (true, true) => {
                tracing::info!(
                    subscription = sub,
                    "downstream probe answered: breaker closed"
                );
                self.store.close_breaker(sub, None)
            }
            (true, false) => return,
            (false, after_probe) if after_probe || run.is_multiple_of(FAILURES_TO_OPEN) => {
                tracing::warn!(
                    subscription = sub,
                    "{run} downstream calls in a row without an answer: breaker open, probing \
                     with one event"
                );
                let (first, max) = (BREAKER_FIRST_MS, BREAKER_MAX_MS);
                let now = now_ms();
                self.store
                    .open_breaker(sub, None, after_probe, first, max, now)
            }
            (false, _) => return,
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, subscription = sub, "cannot record the downstream's state");
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

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn handle(&self, event: &Claimed) -> Handled {
        let body = match self.body(&event.claim.event_id) {
            Ok(b) => b,
            // Reading our own store failed before any call: safe to retry in either mode.
            Err(e) => return Handled::Retryable(e),
        };
        // Checked right before the call: the sweeper must not be able to hand this event to
        // another worker while the call may still be running.
        let left_ms = event.claimed_until - now_ms();
        let timeout_ms = i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX);
        if left_ms <= timeout_ms {
            return Handled::NotStarted(format!(
                "not called: the lease had {left_ms} ms left, less than the call's timeout of \
                 {timeout_ms} ms"
            ));
        }
        let key = format!("{}:{}", event.claim.source, event.claim.event_id);
        let result = self.downstream.submit(&key, &body);
        let answered = match &result {
            Ok(_) => true,
            Err(e) => e.kind == CallFailure::Rejected,
        };
        self.observe(event, answered);
        match result {
            Ok(receipt) => {
                tracing::info!(idempotency_key = %key, %receipt, "downstream accepted");
                Handled::Complete {
                    effect: None,
                    outcome: Outcome::Delivered,
                }
            }
            Err(e) => match (e.kind, self.mode) {
                (CallFailure::NotSent, _) => {
                    Handled::Retryable(format!("downstream not reached: {e}"))
                }
                (CallFailure::Rejected, _) => {
                    Handled::Permanent(format!("downstream refused the submission: {e}"))
                }
                (CallFailure::Unknown, DeliveryMode::AtMostOnce) => Handled::Abandoned(format!(
                    "abandoned: {e}; at-most-once, so it is not retried without force"
                )),
                (CallFailure::Unknown, DeliveryMode::AtLeastOnce) => {
                    Handled::Retryable(format!("downstream call failed: {e}"))
                }
            },
        }
    }
}
