//! JSON shapes of SPEC section 6a.

use serde_json::{Value, json};

use crate::domain::payload::payload_json;
use crate::domain::time::rfc3339;
use crate::store::{EventDetail, EventRecord, RequestRecord, RequestStatus};

pub fn event(e: &EventRecord) -> Value {
    json!({
        "source": e.source,
        "event_id": e.event_id,
        "type": e.event_type,
        "status": e.status.as_str(),
        "attempts": e.attempts,
        "deliveries": e.deliveries,
        "payload_mismatches": e.payload_mismatches,
        "received_at": rfc3339(e.received_at),
        "last_delivered_at": rfc3339(e.last_delivered_at),
        "next_attempt_at": e.next_attempt_at.map(rfc3339),
        "completed_at": e.completed_at.map(rfc3339),
        "outcome": e.outcome,
        "last_error": e.last_error,
        "abandoned": e.abandoned,
        "purged": e.purged_at.is_some(),
    })
}

/// The event with its payload (as JSON when it parses, else as text) and attempt history; a
/// tombstone instead says when it finished and was purged, and keeps its body's digest.
pub fn event_detail(d: &EventDetail) -> Value {
    let mut v = event(&d.event);
    if let Some(purged_at) = d.event.purged_at {
        v["finished_at"] = json!(d.event.finished_at.map(rfc3339));
        v["purged_at"] = json!(rfc3339(purged_at));
        v["payload_sha256"] = json!(hex::encode(&d.payload_sha256));
        v["payload"] = Value::Null;
        v["history"] = json!([]);
        return v;
    }
    let payload = payload_json(&d.payload, d.content_type.as_deref())
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&d.payload).into_owned()));
    let history: Vec<Value> = d
        .history
        .iter()
        .map(|a| {
            json!({
                "attempt": a.attempt,
                "worker": a.worker,
                "started_at": rfc3339(a.started_at),
                "finished_at": a.finished_at.map(rfc3339),
                "result": a.result,
                "error": a.error,
            })
        })
        .collect();
    v["payload"] = payload;
    v["history"] = Value::Array(history);
    v
}

pub fn request(r: &RequestRecord) -> Value {
    json!({
        "id": r.id,
        "status": match r.status {
            RequestStatus::Draft => "draft",
            RequestStatus::Submitted => "submitted",
        },
        "documents": r.documents,
        "event": r.event.as_ref().map(|e| json!({
            "status": e.status.as_str(),
            "outcome": e.outcome,
            "last_error": e.last_error,
        })),
    })
}
