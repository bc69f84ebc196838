//! Any HMAC-SHA256 signer: `X-Signature: [sha256=]<hex>` over the raw body; the id comes from
//! the body's `event_id`, else `X-Event-Id` (the header is not signed: see routes/webhooks.rs).

use super::{
    Headers, SignatureError, Verified, any_match, hmac_hex, keyed, malformed, optional, required,
};
use crate::signature::Secret;

const HEADER: &str = "X-Signature";

pub(super) fn verify(
    headers: &dyn Headers,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let value = required(headers, HEADER)?;
    let hex_sig = value.strip_prefix("sha256=").unwrap_or(value);
    let candidate = hex::decode(hex_sig).map_err(|_| malformed(HEADER, "signature is not hex"))?;
    if !any_match(keyed(secrets), &[body], &[candidate]) {
        return Err(SignatureError::NoMatch);
    }
    Ok(Verified {
        event_id: optional(headers, "X-Event-Id")?,
        event_type: None,
        timestamp: None,
    })
}

pub(super) fn sign(secret: &Secret, event_id: &str, body: &[u8]) -> Vec<(String, String)> {
    vec![
        (
            HEADER.into(),
            format!("sha256={}", hmac_hex(secret.keyed(), &[body])),
        ),
        ("X-Event-Id".into(), event_id.into()),
    ]
}
