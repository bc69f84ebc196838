//! Schemas of answers that their handlers build with `json!` (small, or owned by another
//! part), of request bodies read by hand, and of the error body. The typed event and request
//! shapes live in `views.rs`, where they also serialise the answers. These are never built:
//! they only describe; the schemathesis test (tests/api/apidoc_fuzz.rs) holds them to the server.
#![allow(dead_code)]

use serde::Deserialize;
use utoipa::ToSchema;

/// Every error on every route.
#[derive(ToSchema)]
pub struct ErrorBody {
    error: ErrorCode,
    /// For people; never parse it.
    message: String,
}

/// Stable machine codes (SPEC section 6a).
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ErrorCode {
    Unauthorized,
    NotFound,
    UnknownSource,
    InvalidSignature,
    MissingSignature,
    TimestampOutOfTolerance,
    MissingEventId,
    InvalidEventId,
    InvalidEventType,
    InvalidJson,
    InvalidRequest,
    PayloadMismatch,
    Conflict,
    PayloadTooLarge,
    ForbiddenSender,
    MethodNotAllowed,
    Unavailable,
    Internal,
}

/// What `POST /webhooks/{source}` answers once the delivery is committed.
#[derive(ToSchema)]
pub struct IngestAnswer {
    event_id: String,
    status: IngestStatus,
    /// True only for the first delivery of the event.
    queued: bool,
    /// Present (and true) when the event was already received with a different body.
    payload_mismatch: Option<bool>,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum IngestStatus {
    Queued,
    Duplicate,
}

/// The form encoding GitHub may use: the JSON is in `payload`, the signature covers the raw
/// form body.
#[derive(ToSchema)]
pub struct GithubForm {
    payload: String,
}

/// A page of events, newest first.
#[derive(ToSchema)]
pub struct EventPage {
    events: Vec<super::super::views::Event>,
    /// Pass as `cursor` for the next page; null at the end.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// The `status` filter of `GET /events` and `GET /events/export`: an event state, or `purged`
/// for tombstones (a tombstone is a completed or failed event; lists leave them out otherwise).
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum StatusFilter {
    Pending,
    Claimed,
    Completed,
    Failed,
    Stored,
    Purged,
}

/// Which failed events a bulk retry takes; every field optional, no other field allowed.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRetry {
    source: Option<String>,
    /// Only failed states of this subscription.
    subscription: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    #[schema(format = DateTime)]
    received_after: Option<String>,
    #[schema(format = DateTime)]
    received_before: Option<String>,
}

/// Purge on demand: each time optional; a time given wins over `[retention]` for that kind.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// Completed events that completed before this time (RFC 3339).
    #[schema(format = DateTime)]
    completed_before: Option<String>,
    /// Failed events that failed before this time (RFC 3339).
    #[schema(format = DateTime)]
    failed_before: Option<String>,
    /// At most this many tombstones in this call (default: as many as about 5 s allow).
    #[schema(minimum = 1)]
    limit: Option<u64>,
    /// `next_cursor` of the previous answer, to go on where it stopped (send the same times).
    cursor: Option<String>,
}

/// One call's work: a call stops after about 5 s (or `limit` tombstones) and says where to go on.
#[derive(ToSchema)]
pub struct Purged {
    /// Events that became tombstones in this call.
    purged: u64,
    /// True when the walk stopped before the newest event: call again with `next_cursor`.
    more: bool,
    /// Send as `cursor` to go on; null once the walk is complete.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct Retried {
    retried: u64,
}

#[derive(ToSchema)]
pub struct Claimed {
    claimed: u64,
}

#[derive(ToSchema)]
pub struct Loyalty {
    customer_id: String,
    /// The whole balance, on every page.
    balance: i64,
    /// Newest first, one page.
    credits: Vec<Credit>,
    /// The `cursor` of the next page; `null` on the last.
    next_cursor: Option<String>,
}

/// One credited order, and the event that credited it.
#[derive(ToSchema)]
pub struct Credit {
    order_id: String,
    points: i64,
    source: String,
    event_id: String,
}

/// `POST /requests` takes no fields (an empty body or `{}`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRequest {}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewDocument {
    #[schema(min_length = 1, max_length = 255)]
    name: String,
    #[schema(min_length = 1)]
    content_type: String,
    /// Text, or base64 with `"encoding": "base64"`.
    content: String,
    encoding: Option<Encoding>,
}

#[derive(Deserialize, ToSchema)]
pub enum Encoding {
    #[serde(rename = "base64")]
    Base64,
    #[serde(rename = "utf-8")]
    Utf8,
    #[serde(rename = "text")]
    Text,
}

#[derive(ToSchema)]
pub struct Submitted {
    /// True the first time only.
    queued: bool,
    status: IngestStatus,
}

/// The dashboard's overview.
#[derive(ToSchema)]
pub struct Stats {
    /// Events by status, each once by its summary over its subscriptions (as `GET /events`
    /// lists them), not subscription states.
    counts: StatusCounts,
    /// Age of the oldest due pending event; null when there is none.
    #[schema(required = true)]
    oldest_pending_seconds: Option<f64>,
    /// The current minute and the 59 before it, oldest first, zeros included.
    received_per_minute: Vec<MinuteCount>,
}

#[derive(ToSchema)]
pub struct StatusCounts {
    pending: u64,
    claimed: u64,
    completed: u64,
    failed: u64,
}

#[derive(ToSchema)]
pub struct MinuteCount {
    #[schema(format = DateTime)]
    minute: String,
    count: u64,
}

#[derive(ToSchema)]
pub struct Health {
    status: HealthStatus,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum HealthStatus {
    Ok,
}

#[derive(ToSchema)]
pub struct Ready {
    status: ReadyStatus,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ReadyStatus {
    Ready,
}
