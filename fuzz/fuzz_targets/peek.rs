//! The body peek that finds id and type in a JSON body (domain::payload::peek).
//!
//! Properties: no panic on any input; peek and serde_json agree: peek accepts exactly the
//! bodies serde_json reads as a JSON object, and finds the same `id`, `event_id` and `type`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use webhook_inbox::domain::payload::{PayloadError, peek};

/// What peek should find in a field: a string, or a number as text; nothing else.
fn scalar(value: &Value, name: &str) -> Option<String> {
    match value.get(name)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let peeked = peek(data, Some("application/json"));
    let whole = serde_json::from_slice::<Value>(data);
    match (&peeked, &whole) {
        (Ok(p), Ok(v)) if v.is_object() => {
            assert_eq!(p.id(), scalar(v, "id"), "id");
            assert_eq!(p.event_id(), scalar(v, "event_id"), "event_id");
            let event_type = scalar(v, "type").filter(|t| t.parse::<f64>().is_err());
            assert_eq!(p.event_type(), event_type, "type");
        }
        (Err(PayloadError::NotObject(_)), Ok(v)) if !v.is_object() => {}
        (Err(PayloadError::NotJson(_)), Err(_)) => {}
        _ => panic!("peek {peeked:?} disagrees with serde_json {whole:?}"),
    }
});
