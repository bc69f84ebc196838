//! Standard Webhooks (and Svix, its origin): `webhook-signature: v1,<base64> [v1,<base64> …]`
//! over `{id}.{timestamp}.{body}`, keyed by the base64 after `whsec_`.

use base64::Engine;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose::STANDARD};

use super::{Headers, SignatureError, Verified, any_match, hmac_bytes, malformed, required};
use crate::signature::Secret;

/// Secrets and signatures are accepted padded or not: senders differ.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The HMAC key: the base64 after `whsec_` (the prefix is optional, as in Svix's libraries).
pub(super) fn key(secret: &Secret) -> Result<Vec<u8>, String> {
    let raw = secret.expose();
    let b64 = raw.strip_prefix("whsec_").unwrap_or(raw);
    LENIENT
        .decode(b64)
        .map_err(|_| "a standard-webhooks secret is `whsec_` followed by base64".to_string())
}

/// Each header under its Standard Webhooks name, else its Svix name.
fn header<'a>(
    headers: &'a dyn Headers,
    names: [&'static str; 2],
) -> Result<&'a str, SignatureError> {
    match required(headers, names[0]) {
        Err(SignatureError::MissingHeader(_)) => required(headers, names[1]).map_err(|e| match e {
            SignatureError::MissingHeader(_) => SignatureError::MissingHeader(names[0]),
            other => other,
        }),
        other => other,
    }
}

pub(super) fn verify(
    headers: &dyn Headers,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let id = header(headers, ["webhook-id", "svix-id"])?;
    let ts_raw = header(headers, ["webhook-timestamp", "svix-timestamp"])?;
    let sig_header = header(headers, ["webhook-signature", "svix-signature"])?;
    let timestamp: i64 = ts_raw
        .parse()
        .map_err(|_| malformed("webhook-timestamp", "not unix seconds"))?;
    let mut candidates = Vec::new();
    for part in sig_header.split_whitespace() {
        let (version, sig) = part
            .split_once(',')
            .ok_or_else(|| malformed("webhook-signature", "expected v1,<base64>"))?;
        // Other versions (v1a, asymmetric) are skipped, not errors: a sender may send several.
        if version == "v1" {
            let bytes = LENIENT
                .decode(sig)
                .map_err(|_| malformed("webhook-signature", "signature is not base64"))?;
            candidates.push(bytes);
        }
    }
    if candidates.is_empty() {
        return Err(malformed("webhook-signature", "no v1 signature"));
    }
    let keys = secrets.iter().filter_map(|s| s.standard_keyed().ok());
    let parts: [&[u8]; 5] = [id.as_bytes(), b".", ts_raw.as_bytes(), b".", body];
    if !any_match(keys, &parts, &candidates) {
        return Err(SignatureError::NoMatch);
    }
    Ok(Verified {
        event_id: Some(id.to_string()),
        event_type: None,
        timestamp: Some(timestamp),
    })
}

pub(super) fn sign(
    secret: &Secret,
    event_id: &str,
    body: &[u8],
    now: i64,
) -> Result<Vec<(String, String)>, String> {
    let keyed = secret.standard_keyed()?;
    let ts = now.to_string();
    let sig = hmac_bytes(
        keyed,
        &[event_id.as_bytes(), b".", ts.as_bytes(), b".", body],
    );
    Ok(vec![
        ("webhook-id".into(), event_id.into()),
        ("webhook-timestamp".into(), ts),
        (
            "webhook-signature".into(),
            format!("v1,{}", STANDARD.encode(sig)),
        ),
    ])
}
