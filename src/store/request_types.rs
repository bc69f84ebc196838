//! The values of the submission API (SPEC section 6) that cross the store boundary.

use serde::Serialize;

use sha2::{Digest, Sha256};

use super::{EventOrigin, EventRecord, NewDelivery};
use crate::domain::{REQUEST_SUBMITTED, RESERVED_SOURCE};

/// The event a submission stores: `request.submitted` of the reserved source, keyed by the
/// request's id (so that a second submit is a duplicate), for the `downstream` lane.
pub fn submitted(id: &str, now: i64) -> NewDelivery {
    let payload = serde_json::to_vec(&serde_json::json!({
        "type": REQUEST_SUBMITTED,
        "request_id": id,
    }))
    .expect("a JSON object serialises");
    NewDelivery {
        source: RESERVED_SOURCE.to_string(),
        event_id: id.to_string(),
        event_type: REQUEST_SUBMITTED.to_string(),
        sha256: Sha256::digest(&payload).into(),
        payload,
        content_type: Some("application/json".into()),
        received_at: now,
        reject_mismatch: false,
        origin: EventOrigin::Submission,
        traceparent: None,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DocumentSummary {
    pub id: String,
    pub name: String,
    pub content_type: String,
    pub size: i64,
}

#[derive(Debug, Clone)]
pub struct DocumentContent {
    pub summary: DocumentSummary,
    pub content: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct NewDocument {
    pub id: String,
    pub name: String,
    pub content_type: String,
    pub content: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    Draft,
    Submitted,
}

#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub id: String,
    pub status: RequestStatus,
    pub documents: Vec<DocumentSummary>,
    /// The event of a submitted request.
    pub event: Option<EventRecord>,
}

#[derive(Debug, Clone)]
pub enum AddDocument {
    NotFound,
    Submitted,
    Added(Box<RequestRecord>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitOutcome {
    NotFound,
    Queued,
    Duplicate,
}
