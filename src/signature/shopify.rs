//! Shopify: `X-Shopify-Hmac-Sha256: <base64>` over the raw body. Like GitHub, nothing signed
//! binds a time or an id, so replays of a captured request are stopped only by dedup.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::{
    Headers, SignatureError, Verified, any_match, hmac_bytes, keyed, malformed, optional, required,
};
use crate::signature::Secret;

const HEADER: &str = "X-Shopify-Hmac-Sha256";

pub(super) fn verify(
    headers: &dyn Headers,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let value = required(headers, HEADER)?;
    let candidate = STANDARD
        .decode(value)
        .map_err(|_| malformed(HEADER, "signature is not base64"))?;
    if !any_match(keyed(secrets), &[body], &[candidate]) {
        return Err(SignatureError::NoMatch);
    }
    Ok(Verified {
        event_id: optional(headers, "X-Shopify-Webhook-Id")?,
        event_type: optional(headers, "X-Shopify-Topic")?,
        timestamp: None,
    })
}

pub(super) fn sign(
    secret: &Secret,
    event_id: &str,
    event_type: &str,
    body: &[u8],
) -> Vec<(String, String)> {
    let sig = hmac_bytes(secret.keyed(), &[body]);
    vec![
        (HEADER.into(), STANDARD.encode(sig)),
        ("X-Shopify-Webhook-Id".into(), event_id.into()),
        ("X-Shopify-Topic".into(), event_type.into()),
    ]
}
