//! The replay file: JSON lines, one delivery a line, with the body exactly as received.
//! `events export` writes it; `replay` reads it and re-signs each line.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayLine {
    pub source: String,
    pub event_id: String,
    #[serde(rename = "type", default)]
    pub event_type: String,
    /// The body as received, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body as received, base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    /// The delivery's content type when it was not JSON (GitHub's form-encoded deliveries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

impl ReplayLine {
    pub fn new(
        source: &str,
        event_id: &str,
        event_type: &str,
        body: &[u8],
        content_type: Option<&str>,
    ) -> ReplayLine {
        let (body, body_base64) = match std::str::from_utf8(body) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(STANDARD.encode(body))),
        };
        ReplayLine {
            source: source.into(),
            event_id: event_id.into(),
            event_type: event_type.into(),
            body,
            body_base64,
            content_type: content_type
                .filter(|c| super::payload::is_form(Some(c)))
                .map(String::from),
        }
    }

    /// The body bytes, exactly as they were received.
    pub fn body_bytes(&self) -> Result<Vec<u8>, String> {
        match (&self.body, &self.body_base64) {
            (Some(text), None) => Ok(text.as_bytes().to_vec()),
            (None, Some(b64)) => STANDARD
                .decode(b64)
                .map_err(|e| format!("body_base64 is not base64: {e}")),
            _ => Err("a line needs exactly one of body and body_base64".into()),
        }
    }
}
