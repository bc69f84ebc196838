//! The bodies of the pull routes, as the API document shows them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::pull::AckOutcome;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// At most this many events (1 to 1,000; default 100).
    pub(super) max: Option<u64>,
    /// The lease, in ms (1,000 to 43,200,000; default the service's `consumers.lease_seconds`,
    /// at most 43,200,000).
    pub(super) lease_ms: Option<i64>,
    /// Wait up to this long for work (0 to 60,000 ms; default 0: answer at once).
    pub(super) wait_ms: Option<u64>,
}

/// One claimed event.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimView {
    /// Names this claim in `ack` and `extend`.
    pub(super) token: String,
    pub(super) source: String,
    pub(super) event_id: String,
    #[serde(rename = "type")]
    pub(super) event_type: String,
    /// Claims of this event by this subscription so far, this one included.
    pub(super) attempt: i64,
    #[schema(format = DateTime)]
    pub(super) received_at: String,
    /// Ack before this time, or the event is claimed again (at-most-once: abandoned).
    #[schema(format = DateTime)]
    pub(super) lease_until: String,
    #[schema(required = true)]
    pub(super) content_type: Option<String>,
    /// A body whose content type says JSON: the JSON value itself, byte for byte; any other
    /// UTF-8 body: a string. Absent when `body_base64` is set.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) body: Option<Box<serde_json::value::RawValue>>,
    /// The bytes, for a body that is not UTF-8, or declared JSON but not exactly one JSON
    /// value (invalid, or with whitespace around it, which an embedded value would lose).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) body_base64: Option<String>,
    /// The W3C trace context of this claim (`00-<trace id>-<span id>-<flags>`), in the trace
    /// of the event's delivery: a client's spans of its handling belong under it. Absent when
    /// the event has none (tracing off and no `traceparent` from the provider).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    pub(super) traceparent: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Claims {
    pub(super) claims: Vec<ClaimView>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    /// 1 to 1,000 results.
    pub(super) results: Vec<AckItem>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckItem {
    pub(super) token: String,
    pub(super) outcome: AckOutcome,
    /// Why, for `retry` and `fail`: kept in the event's history (at most 4,096 characters).
    pub(super) error: Option<String>,
    /// For `retry`: not before this many ms (0 to 30 days); the backoff when it is longer.
    pub(super) retry_after_ms: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AckResult {
    pub(super) token: String,
    /// `false`: the claim was no longer held (its lease ran out, or it was acked already);
    /// nothing changed for this event, and the rest of the batch was applied.
    pub(super) applied: bool,
    /// Where the event went: `completed`, `pending` (a retry or release), `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) status: Option<&'static str>,
    /// `lease_lost` when not applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reason: Option<&'static str>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AckResults {
    pub(super) results: Vec<AckResult>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    /// 1 to 1,000 claim tokens.
    pub(super) tokens: Vec<String>,
    /// The new lease, from now, in ms (1,000 to 43,200,000).
    pub(super) lease_ms: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExtendResult {
    pub(super) token: String,
    pub(super) extended: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub(super) lease_until: Option<String>,
    /// `lease_lost` when not extended: the claim was acked, or its lease ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reason: Option<&'static str>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExtendResults {
    pub(super) results: Vec<ExtendResult>,
}
