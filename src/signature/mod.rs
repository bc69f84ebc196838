//! Signature verification, one file per scheme, always on the raw body bytes and before any
//! parsing: a body that is not authentic is never deserialised.
//!
//! Comparison goes through `hmac`'s `verify_slice`, which is constant time, and every scheme
//! accepts several secrets so that a secret can be rotated without downtime.

mod github;
mod hmac_sha256;
mod secret;
mod shopify;
mod standard;
mod stripe;

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

pub use secret::Secret;

type HmacSha256 = Hmac<Sha256>;

/// The signature schemes of SPEC section 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    StandardWebhooks,
    Stripe,
    Github,
    Shopify,
    HmacSha256,
}

/// Why a delivery is not authentic. Each maps to one stable error code at the HTTP edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("malformed header {header}: {reason}")]
    Malformed {
        header: &'static str,
        reason: String,
    },
    #[error("no signature matches any configured secret")]
    NoMatch,
    /// Age and tolerance, in seconds.
    #[error(
        "timestamp is {0} s old, beyond the tolerance of {1} s: check the sender's clock, or \
         re-sign an old delivery with a fresh timestamp (`webhook-inbox replay` does)"
    )]
    TooOld(i64, i64),
    /// How far ahead, and the tolerance, in seconds.
    #[error(
        "timestamp is {0} s in the future, beyond the tolerance of {1} s: check the sender's \
         clock"
    )]
    TooNew(i64, i64),
}

/// A header value that is not visible ASCII.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAscii;

/// Header lookup, so that verification does not depend on the HTTP framework.
pub trait Headers {
    /// The header's value; `Err` when it is present but not visible ASCII.
    fn get(&self, name: &str) -> Result<Option<&str>, NotAscii>;
}

impl Headers for Vec<(String, String)> {
    fn get(&self, name: &str) -> Result<Option<&str>, NotAscii> {
        Ok(self
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str()))
    }
}

/// What the headers told us about an authentic delivery. The body supplies the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    pub timestamp: Option<i64>,
}

/// Which body field carries the event id when no header does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyField {
    None,
    Id,
    EventId,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::Shopify => "shopify",
            Scheme::HmacSha256 => "hmac-sha256",
        }
    }

    /// Verify `body` under any of `secrets`. `now` and `tolerance` bound a signed timestamp in
    /// both directions; schemes without one ignore them.
    pub fn verify(
        self,
        headers: &dyn Headers,
        body: &[u8],
        secrets: &[Secret],
        now: i64,
        tolerance: u64,
    ) -> Result<Verified, SignatureError> {
        let verified = match self {
            Scheme::StandardWebhooks => standard::verify(headers, body, secrets)?,
            Scheme::Stripe => stripe::verify(headers, body, secrets)?,
            Scheme::Github => github::verify(headers, body, secrets)?,
            Scheme::Shopify => shopify::verify(headers, body, secrets)?,
            Scheme::HmacSha256 => hmac_sha256::verify(headers, body, secrets)?,
        };
        if let Some(ts) = verified.timestamp {
            let tolerance = i64::try_from(tolerance).unwrap_or(i64::MAX);
            let age = now.saturating_sub(ts);
            if age > tolerance {
                return Err(SignatureError::TooOld(age, tolerance));
            }
            if -age > tolerance {
                return Err(SignatureError::TooNew(-age, tolerance));
            }
        }
        Ok(verified)
    }

    /// The headers a sender of this scheme would attach to `body`; used by `sign`, `replay` and
    /// the load generator, and by tests as a second, round-trip check of the verifier.
    pub fn sign(
        self,
        secret: &Secret,
        event_id: &str,
        event_type: &str,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<(String, String)>, String> {
        // What goes into a header must arrive as it was signed: the verifier reads visible
        // ASCII and trims, so anything else would be refused or would not verify. Standard
        // Webhooks signs the id, so it must be there; the others only carry it beside the
        // signature, and an empty one is simply a missing header.
        if self == Scheme::StandardWebhooks && event_id.is_empty() {
            return Err("a standard-webhooks event id must not be empty".into());
        }
        if self != Scheme::Stripe {
            header_value("event id", event_id)?;
        }
        if matches!(self, Scheme::Github | Scheme::Shopify) {
            header_value("event type", event_type)?;
        }
        match self {
            Scheme::StandardWebhooks => standard::sign(secret, event_id, body, now),
            Scheme::Stripe => Ok(stripe::sign(secret, body, now)),
            Scheme::Github => Ok(github::sign(secret, event_id, event_type, body)),
            Scheme::Shopify => Ok(shopify::sign(secret, event_id, event_type, body)),
            Scheme::HmacSha256 => Ok(hmac_sha256::sign(secret, event_id, body)),
        }
    }

    /// Where the event id comes from when no header carries it.
    pub fn body_id_field(self) -> BodyField {
        match self {
            Scheme::Stripe => BodyField::Id,
            Scheme::HmacSha256 => BodyField::EventId,
            _ => BodyField::None,
        }
    }

    /// Where this scheme reads the event id, in the words of an error message.
    pub fn event_id_source(self) -> &'static str {
        match self {
            Scheme::StandardWebhooks => "the `webhook-id` header (or `svix-id`)",
            Scheme::Stripe => "the body's `id` field",
            Scheme::Github => "the `X-GitHub-Delivery` header",
            Scheme::Shopify => "the `X-Shopify-Webhook-Id` header",
            Scheme::HmacSha256 => "the body's `event_id` field, else the `X-Event-Id` header",
        }
    }

    /// A new event id shaped as this scheme's senders shape theirs (for `sign`): GitHub and
    /// Shopify send GUIDs, Stripe `evt_…`, Standard Webhooks senders `msg_…`.
    pub fn new_event_id(self) -> String {
        let id = uuid::Uuid::new_v4();
        match self {
            Scheme::Github | Scheme::Shopify => id.hyphenated().to_string(),
            Scheme::Stripe => format!("evt_{}", id.simple()),
            Scheme::StandardWebhooks | Scheme::HmacSha256 => format!("msg_{}", id.simple()),
        }
    }

    /// Whether the event type comes from the body (`type`) rather than a header.
    pub fn type_from_body(self) -> bool {
        matches!(
            self,
            Scheme::StandardWebhooks | Scheme::Stripe | Scheme::HmacSha256
        )
    }

    /// Refuse a secret this scheme cannot use, at config time rather than at the first delivery.
    pub fn check_secret(self, secret: &str) -> Result<(), String> {
        if secret.is_empty() {
            return Err("a secret must not be empty".into());
        }
        if self == Scheme::StandardWebhooks {
            standard::key(&Secret::new(secret)).map(|_| ())?;
        }
        Ok(())
    }
}

/// Refuse a value the sender would put in a header that would not reach the verifier as it is:
/// surrounded by whitespace, or holding anything but visible ASCII and inner spaces.
fn header_value(what: &str, value: &str) -> Result<(), String> {
    let visible = value.bytes().all(|b| b == b' ' || b.is_ascii_graphic());
    if value.trim() != value || !visible {
        return Err(format!(
            "{what} {value:?} cannot be sent in a header: use visible ASCII, without leading \
             or trailing spaces"
        ));
    }
    Ok(())
}

/// A required header's value: missing or empty is `MissingHeader`, non-ASCII is `Malformed`.
fn required<'a>(headers: &'a dyn Headers, name: &'static str) -> Result<&'a str, SignatureError> {
    match headers.get(name) {
        Ok(Some(v)) if !v.trim().is_empty() => Ok(v.trim()),
        Ok(_) => Err(SignatureError::MissingHeader(name)),
        Err(NotAscii) => Err(malformed(name, "not visible ASCII")),
    }
}

/// An optional header (event ids and types): present and ASCII, or absent.
fn optional(headers: &dyn Headers, name: &'static str) -> Result<Option<String>, SignatureError> {
    match headers.get(name) {
        Ok(v) => Ok(v.map(str::trim).filter(|v| !v.is_empty()).map(String::from)),
        Err(NotAscii) => Err(malformed(name, "not visible ASCII")),
    }
}

fn malformed(header: &'static str, reason: impl Into<String>) -> SignatureError {
    SignatureError::Malformed {
        header,
        reason: reason.into(),
    }
}

/// A keyed HMAC ([`Secret::keyed`]) over `parts`, ready to finalize or compare.
fn mac(keyed: &HmacSha256, parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = keyed.clone();
    for p in parts {
        mac.update(p);
    }
    mac
}

/// True when any (key, candidate) pair matches, each compared in constant time. `keys` are
/// HMACs already keyed ([`Secret::keyed`]).
fn any_match<'k>(
    keys: impl IntoIterator<Item = &'k HmacSha256>,
    parts: &[&[u8]],
    candidates: &[Vec<u8>],
) -> bool {
    keys.into_iter().any(|keyed| {
        let base = mac(keyed, parts);
        candidates
            .iter()
            .any(|c| base.clone().verify_slice(c).is_ok())
    })
}

/// Every secret's HMAC keyed with its bytes as they are.
fn keyed(secrets: &[Secret]) -> impl Iterator<Item = &HmacSha256> {
    secrets.iter().map(Secret::keyed)
}

fn hmac_bytes(keyed: &HmacSha256, parts: &[&[u8]]) -> Vec<u8> {
    mac(keyed, parts).finalize().into_bytes().to_vec()
}

fn hmac_hex(keyed: &HmacSha256, parts: &[&[u8]]) -> String {
    hex::encode(hmac_bytes(keyed, parts))
}

#[cfg(test)]
mod tests;
