//! What is kept of a refused delivery (see `crate::rejections`): who sent it, why it was
//! refused, its header names and the values of headers that cannot hold a secret, and the
//! body's size and digest, never the body.

use actix_web::HttpRequest;
use actix_web::ResponseError as _;
use actix_web::http::header::CONTENT_LENGTH;
use sha2::{Digest, Sha256};

use super::{ApiError, sender};
use crate::config::Settings;
use crate::domain::time::now_ms;
use crate::store::NewRejection;

/// Headers kept per refusal, and characters per name or value: a refusal's record is bounded
/// whatever the request held.
const MAX_HEADERS: usize = 64;
const MAX_CHARS: usize = 256;

/// The size and digest of a body that was read.
pub struct BodyFacts {
    len: usize,
    sha256: String,
}

impl BodyFacts {
    pub fn of(body: &[u8]) -> BodyFacts {
        BodyFacts {
            len: body.len(),
            sha256: hex::encode(Sha256::digest(body)),
        }
    }
}

/// Whether a header's value may be a credential: an authorization or cookie header, or any
/// name that speaks of a signature, HMAC, secret, token, key, password or credential (every
/// scheme's signature header among them).
fn secret(name: &str) -> bool {
    const WORDS: [&str; 9] = [
        "authorization",
        "cookie",
        "signature",
        "hmac",
        "secret",
        "token",
        "key",
        "password",
        "credential",
    ];
    WORDS.iter().any(|w| name.contains(w))
}

fn clip(text: &str) -> String {
    text.chars().take(MAX_CHARS).collect()
}

/// The record of `error`, the answer to a delivery to `source` (as named in the path).
pub fn record(
    req: &HttpRequest,
    source: &str,
    error: &ApiError,
    body: Option<&BodyFacts>,
    settings: &Settings,
) -> NewRejection {
    let mut headers = serde_json::Map::new();
    for (name, value) in req.headers().iter() {
        let name = clip(name.as_str());
        if headers.len() >= MAX_HEADERS && !headers.contains_key(&name) {
            continue;
        }
        let value = if secret(&name) {
            serde_json::Value::Null
        } else {
            let text = clip(&String::from_utf8_lossy(value.as_bytes()));
            // A repeated header is one value, under the same cap as any other.
            match headers.get(&name).and_then(|v| v.as_str()) {
                Some(earlier) if earlier.chars().count() >= MAX_CHARS => earlier.into(),
                Some(earlier) => clip(&format!("{earlier}, {text}")).into(),
                None => text.into(),
            }
        };
        headers.insert(name, value);
    }
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
    NewRejection {
        received_at: now_ms(),
        source: clip(source),
        peer: sender::address(req, settings).map(|ip| ip.to_string()),
        reason: error.code().to_string(),
        status: error.status_code().as_u16(),
        message: clip(&error.to_string()),
        headers: serde_json::Value::Object(headers).to_string(),
        body_bytes: body.map(|b| b.len as i64).or(declared),
        body_sha256: body.map(|b| b.sha256.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::secret;

    #[test]
    fn every_schemes_signature_header_and_credentials_are_secret() {
        for name in [
            "webhook-signature",
            "svix-signature",
            "stripe-signature",
            "x-hub-signature-256",
            "x-hub-signature",
            "x-shopify-hmac-sha256",
            "x-signature",
            "authorization",
            "proxy-authorization",
            "cookie",
            "x-api-key",
            "x-auth-token",
        ] {
            assert!(secret(name), "{name}");
        }
        for name in ["webhook-id", "x-github-event", "user-agent", "content-type"] {
            assert!(!secret(name), "{name}");
        }
    }
}
