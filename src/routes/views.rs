//! JSON shapes of SPEC section 6a. Each is a type that both serialises the answer and describes
//! it in `GET /openapi.json`, so the document cannot drift from what the routes send.

use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::payload::payload_json;
use crate::domain::time::rfc3339;
use crate::store::{
    AttemptRecord, DocumentSummary, EventDetail, EventRecord, RequestRecord, RequestStatus, Status,
};

/// Where an event is in its lifecycle.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    Pending,
    Claimed,
    Completed,
    Failed,
    /// No subscription's route matched it (an event's summary only).
    Stored,
}

impl From<Status> for EventStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Pending => EventStatus::Pending,
            Status::Claimed => EventStatus::Claimed,
            Status::Completed => EventStatus::Completed,
            Status::Failed => EventStatus::Failed,
            Status::Stored => EventStatus::Stored,
        }
    }
}

/// An event, as every route returns it. Times are RFC 3339 UTC.
#[derive(Debug, Serialize, ToSchema)]
pub struct Event {
    source: String,
    event_id: String,
    #[serde(rename = "type")]
    event_type: String,
    status: EventStatus,
    /// Claims so far (a worker that died used one up too).
    attempts: i64,
    /// How often the provider delivered it.
    deliveries: i64,
    /// Redeliveries whose body differed from the first.
    payload_mismatches: i64,
    #[schema(format = DateTime)]
    received_at: String,
    #[schema(format = DateTime)]
    last_delivered_at: String,
    #[schema(format = DateTime, required = true)]
    next_attempt_at: Option<String>,
    #[schema(format = DateTime, required = true)]
    completed_at: Option<String>,
    /// On completed events: `credited`, `duplicate_order`, `delivered` or `logged`.
    #[schema(required = true)]
    outcome: Option<String>,
    #[schema(required = true)]
    last_error: Option<String>,
    /// An at-most-once event whose downstream call may have acted: only a forced retry runs it.
    abandoned: bool,
    /// A tombstone: its body and history were removed by retention (SPEC section 12); its key
    /// still answers redeliveries as duplicates.
    purged: bool,
    /// Its state in each subscription that takes it (SPEC section 13); `status` above is their
    /// summary, and the fields above are the state that decides it.
    subscriptions: Vec<SubscriptionStatus>,
}

/// One subscription's state of an event.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionStatus {
    name: String,
    status: EventStatus,
    attempts: i64,
    #[schema(required = true)]
    outcome: Option<String>,
    #[schema(required = true)]
    last_error: Option<String>,
    abandoned: bool,
    #[schema(format = DateTime, required = true)]
    next_attempt_at: Option<String>,
    #[schema(format = DateTime, required = true)]
    completed_at: Option<String>,
}

pub fn event(e: &EventRecord) -> Event {
    Event {
        source: e.source.clone(),
        event_id: e.event_id.clone(),
        event_type: e.event_type.clone(),
        status: e.status.into(),
        attempts: e.attempts,
        deliveries: e.deliveries,
        payload_mismatches: e.payload_mismatches,
        received_at: rfc3339(e.received_at),
        last_delivered_at: rfc3339(e.last_delivered_at),
        next_attempt_at: e.next_attempt_at.map(rfc3339),
        completed_at: e.completed_at.map(rfc3339),
        outcome: e.outcome.clone(),
        last_error: e.last_error.clone(),
        abandoned: e.abandoned,
        purged: e.purged_at.is_some(),
        subscriptions: e
            .subscriptions
            .iter()
            .map(|s| SubscriptionStatus {
                name: s.name.clone(),
                status: s.status.into(),
                attempts: s.attempts,
                outcome: s.outcome.clone(),
                last_error: s.last_error.clone(),
                abandoned: s.abandoned,
                next_attempt_at: s.next_attempt_at.map(rfc3339),
                completed_at: s.completed_at.map(rfc3339),
            })
            .collect(),
    }
}

/// One attempt of an event's history.
#[derive(Debug, Serialize, ToSchema)]
pub struct Attempt {
    /// The subscription the attempt was for.
    subscription: String,
    attempt: i64,
    worker: String,
    #[schema(format = DateTime)]
    started_at: String,
    /// Null while the attempt runs.
    #[schema(format = DateTime, required = true)]
    finished_at: Option<String>,
    /// `ok`, `already_processed`, `retryable_error`, `permanent_error` or `lease_expired`; null
    /// while the attempt runs.
    #[schema(required = true)]
    result: Option<String>,
    #[schema(required = true)]
    error: Option<String>,
}

/// An event with its body and attempt history.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventWithHistory {
    #[serde(flatten)]
    event: Event,
    /// The body as JSON when it parses (a form-encoded GitHub delivery: its `payload` field),
    /// else as text; null on a tombstone.
    payload: serde_json::Value,
    /// Empty on a tombstone.
    history: Vec<Attempt>,
    /// On a tombstone only: when the event ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    finished_at: Option<String>,
    /// On a tombstone only: when retention purged its body and history.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    purged_at: Option<String>,
    /// On a tombstone only: hex SHA-256 of the body as first received.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_sha256: Option<String>,
    /// The subscriptions whose route takes the event but whose `filter` left it out (no state
    /// of theirs: not pending, not delivered). Absent when none did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filtered_out: Vec<String>,
}

/// The event with its payload (as JSON when it parses, else as text) and attempt history; a
/// tombstone instead says when it finished and was purged, and keeps its body's digest.
pub fn event_detail(d: &EventDetail) -> EventWithHistory {
    if let Some(purged_at) = d.event.purged_at {
        return EventWithHistory {
            event: event(&d.event),
            payload: serde_json::Value::Null,
            history: Vec::new(),
            finished_at: d.event.finished_at.map(rfc3339),
            purged_at: Some(rfc3339(purged_at)),
            payload_sha256: Some(hex::encode(&d.payload_sha256)),
            filtered_out: Vec::new(),
        };
    }
    let payload = payload_json(&d.payload, d.content_type.as_deref()).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&d.payload).into_owned())
    });
    EventWithHistory {
        event: event(&d.event),
        payload,
        history: d.history.iter().map(attempt).collect(),
        finished_at: None,
        purged_at: None,
        payload_sha256: None,
        filtered_out: Vec::new(),
    }
}

fn attempt(a: &AttemptRecord) -> Attempt {
    Attempt {
        subscription: a.subscription.clone(),
        attempt: a.attempt,
        worker: a.worker.clone(),
        started_at: rfc3339(a.started_at),
        finished_at: a.finished_at.map(rfc3339),
        result: a.result.clone(),
        error: a.error.clone(),
    }
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    Draft,
    Submitted,
}

/// A document of a request, without its content.
#[derive(Debug, Serialize, ToSchema)]
pub struct Document {
    id: String,
    name: String,
    content_type: String,
    /// Bytes, after base64 decoding.
    size: i64,
}

/// Where a submitted request's event stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct RequestEvent {
    status: EventStatus,
    #[schema(required = true)]
    outcome: Option<String>,
    #[schema(required = true)]
    last_error: Option<String>,
}

/// A submission request (SPEC section 6).
#[derive(Debug, Serialize, ToSchema)]
pub struct Request {
    id: String,
    status: RequestState,
    documents: Vec<Document>,
    /// Null until the request is submitted.
    #[schema(required = true)]
    event: Option<RequestEvent>,
}

pub fn request(r: &RequestRecord) -> Request {
    Request {
        id: r.id.clone(),
        status: match r.status {
            RequestStatus::Draft => RequestState::Draft,
            RequestStatus::Submitted => RequestState::Submitted,
        },
        documents: r.documents.iter().map(document).collect(),
        event: r.event.as_ref().map(|e| RequestEvent {
            status: e.status.into(),
            outcome: e.outcome.clone(),
            last_error: e.last_error.clone(),
        }),
    }
}

fn document(d: &DocumentSummary) -> Document {
    Document {
        id: d.id.clone(),
        name: d.name.clone(),
        content_type: d.content_type.clone(),
        size: d.size,
    }
}
