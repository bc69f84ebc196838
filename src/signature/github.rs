//! GitHub: `X-Hub-Signature-256: sha256=<hex>` over the raw body. No signed timestamp or id:
//! a captured delivery can be replayed as-is, so the business-key guards protect the effects.

use super::{
    Headers, SignatureError, Verified, any_match, hmac_hex, keyed, malformed, optional, required,
};
use crate::signature::Secret;

const HEADER: &str = "X-Hub-Signature-256";

pub(super) fn verify(
    headers: &dyn Headers,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let value = required(headers, HEADER)?;
    let hex_sig = value
        .strip_prefix("sha256=")
        .ok_or_else(|| malformed(HEADER, "expected sha256=<hex>"))?;
    let candidate = hex::decode(hex_sig).map_err(|_| malformed(HEADER, "signature is not hex"))?;
    if !any_match(keyed(secrets), &[body], &[candidate]) {
        return Err(SignatureError::NoMatch);
    }
    Ok(Verified {
        event_id: optional(headers, "X-GitHub-Delivery")?,
        event_type: optional(headers, "X-GitHub-Event")?,
        timestamp: None,
    })
}

pub(super) fn sign(
    secret: &Secret,
    event_id: &str,
    event_type: &str,
    body: &[u8],
) -> Vec<(String, String)> {
    vec![
        (
            HEADER.into(),
            format!("sha256={}", hmac_hex(secret.keyed(), &[body])),
        ),
        ("X-GitHub-Delivery".into(), event_id.into()),
        ("X-GitHub-Event".into(), event_type.into()),
    ]
}
