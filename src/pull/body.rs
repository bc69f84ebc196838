//! A stored body as a claim shows it, byte for byte: a JSON body as the JSON value itself (its
//! exact bytes, embedded unparsed), any other UTF-8 body as a string, other bytes as base64.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::value::RawValue;

/// One body in a claim: exactly one of the two is set.
#[derive(Debug, serde::Serialize)]
pub struct ClaimBody {
    /// The JSON value (a JSON body, as received), or a string (text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<Box<RawValue>>,
    /// The bytes, for a body that is neither JSON nor UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

/// Whether a content type says JSON: `application/json` or any `+json` type.
fn is_json(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// How `payload` is shown. The form follows from the content type, so that a client can
/// always rebuild the exact bytes: a body declared JSON is its value embedded as received, or,
/// if it is not exactly one JSON value (invalid, or with whitespace around the value, which an
/// embedded value would lose), base64; any other body is a string when it is UTF-8, else
/// base64.
pub fn encode(content_type: Option<&str>, payload: &[u8]) -> ClaimBody {
    let base64 = || ClaimBody {
        body: None,
        body_base64: Some(STANDARD.encode(payload)),
    };
    let Ok(text) = std::str::from_utf8(payload) else {
        return base64();
    };
    let raw = if is_json(content_type) {
        match RawValue::from_string(text.to_string()) {
            Ok(raw) if raw.get().len() == text.len() => raw,
            _ => return base64(),
        }
    } else {
        RawValue::from_string(serde_json::to_string(text).expect("a str serializes"))
            .expect("a JSON string is JSON")
    };
    ClaimBody {
        body: Some(raw),
        body_base64: None,
    }
}

/// The bytes a claim's body stands for (what a client does with [`encode`]'s answer).
pub fn decode(
    content_type: Option<&str>,
    body: Option<&RawValue>,
    body_base64: Option<&str>,
) -> Result<Vec<u8>, String> {
    match (body, body_base64) {
        (_, Some(b64)) => STANDARD
            .decode(b64)
            .map_err(|e| format!("body_base64 is not base64: {e}")),
        (Some(raw), None) if is_json(content_type) => Ok(raw.get().as_bytes().to_vec()),
        (Some(raw), None) => serde_json::from_str::<String>(raw.get())
            .map(String::into_bytes)
            .map_err(|e| format!("a body that is not JSON must be a string: {e}")),
        (None, None) => Err("the claim has neither body nor body_base64".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(ct: Option<&str>, payload: &[u8]) -> String {
        serde_json::to_string(&encode(ct, payload)).unwrap()
    }

    #[test]
    fn a_json_body_is_embedded_byte_for_byte() {
        let body = b"{ \"b\":1.50,  \"a\" : [1e3] }";
        let shown = shown(Some("application/json; charset=utf-8"), body);
        assert_eq!(
            shown,
            format!("{{\"body\":{}}}", std::str::from_utf8(body).unwrap())
        );
        let typed = shown_with("application/vnd.api+json", b"[1]");
        assert_eq!(typed, "{\"body\":[1]}");
    }

    fn shown_with(ct: &str, payload: &[u8]) -> String {
        shown(Some(ct), payload)
    }

    #[test]
    fn text_is_a_string_and_json_looking_text_stays_text() {
        assert_eq!(shown(Some("text/plain"), b"123"), "{\"body\":\"123\"}");
        assert_eq!(shown(None, b"a \"q\"\n"), "{\"body\":\"a \\\"q\\\"\\n\"}");
        // Declared JSON, not exactly one value: base64, so that every byte stays.
        assert_eq!(
            shown(Some("application/json"), b"{oops"),
            "{\"body_base64\":\"e29vcHM=\"}"
        );
        assert_eq!(
            shown(Some("application/json"), b"[1]\n"),
            "{\"body_base64\":\"WzFdCg==\"}"
        );
    }

    /// Every form comes back as the bytes it stands for, whatever the content type.
    #[test]
    fn decode_rebuilds_every_form() {
        let cases: [(Option<&str>, &[u8]); 6] = [
            (Some("application/json"), b"{\"a\": [1, 2.50]}"),
            (Some("application/json"), b"\"a json string\""),
            (Some("text/plain"), b"\"quoted text\""),
            (None, b"plain"),
            (Some("application/json"), b" {}\n"),
            (Some("application/octet-stream"), &[0, 159, 146, 150]),
        ];
        for (ct, payload) in cases {
            let wire = serde_json::to_string(&encode(ct, payload)).unwrap();
            #[derive(serde::Deserialize)]
            struct Back {
                body: Option<Box<RawValue>>,
                body_base64: Option<String>,
            }
            let back: Back = serde_json::from_str(&wire).unwrap();
            let bytes = decode(ct, back.body.as_deref(), back.body_base64.as_deref()).unwrap();
            assert_eq!(bytes, payload, "{ct:?} {wire}");
        }
    }

    #[test]
    fn other_bytes_are_base64() {
        let bytes = [0u8, 0xff, 0xfe, b'a'];
        let value: serde_json::Value =
            serde_json::from_str(&shown(Some("application/octet-stream"), &bytes)).unwrap();
        assert_eq!(value.get("body"), None);
        let decoded = STANDARD
            .decode(value["body_base64"].as_str().unwrap())
            .unwrap();
        assert_eq!(decoded, bytes);
    }
}
