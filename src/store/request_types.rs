//! The values of the submission API (SPEC section 6) that cross the store boundary.

use serde::Serialize;

use super::EventRecord;

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
