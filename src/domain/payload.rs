//! The JSON view of a stored body.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("form body has no `payload` field")]
    NoPayloadField,
    #[error("unsupported content type {0}: send JSON")]
    UnsupportedContentType(String),
}

fn media_type(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

pub fn is_form(content_type: Option<&str>) -> bool {
    media_type(content_type) == "application/x-www-form-urlencoded"
}

/// Parse a body as JSON. A form-encoded body (GitHub's other delivery format) carries its JSON
/// in the `payload` field; multipart is refused. Other types are tried as JSON, since providers
/// label JSON in many ways (`text/plain`, vendor `+json` types).
pub fn payload_json(raw: &[u8], content_type: Option<&str>) -> Result<Value, PayloadError> {
    let media = media_type(content_type);
    if media.starts_with("multipart/") {
        return Err(PayloadError::UnsupportedContentType(media));
    }
    if is_form(content_type) {
        let json = form_urlencoded::parse(raw)
            .find(|(k, _)| k == "payload")
            .map(|(_, v)| v.into_owned())
            .ok_or(PayloadError::NoPayloadField)?;
        return serde_json::from_str(&json).map_err(|e| PayloadError::NotJson(e.to_string()));
    }
    serde_json::from_slice(raw).map_err(|e| PayloadError::NotJson(e.to_string()))
}
