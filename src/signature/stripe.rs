//! Stripe: `Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>…]` over `{t}.{body}`, keyed by the whole
//! secret string, `whsec_` included (unlike Standard Webhooks: a frequent confusion).

use super::{Headers, SignatureError, Verified, any_match, hmac_hex, keyed, malformed, required};
use crate::signature::Secret;

const HEADER: &str = "Stripe-Signature";

pub(super) fn verify(
    headers: &dyn Headers,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let value = required(headers, HEADER)?;
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for item in value.split(',') {
        let (k, v) = item
            .trim()
            .split_once('=')
            .ok_or_else(|| malformed(HEADER, "expected t=<ts>,v1=<hex>"))?;
        match k {
            "t" => {
                let ts: i64 = v
                    .parse()
                    .map_err(|_| malformed(HEADER, "t is not unix seconds"))?;
                timestamp = Some((ts, v));
            }
            "v1" => {
                candidates.push(hex::decode(v).map_err(|_| malformed(HEADER, "v1 is not hex"))?)
            }
            // v0 (test mode) and future schemes are ignored, as Stripe's libraries do.
            _ => {}
        }
    }
    let (ts, ts_raw) = timestamp.ok_or_else(|| malformed(HEADER, "no t= timestamp"))?;
    if candidates.is_empty() {
        return Err(malformed(HEADER, "no v1 signature"));
    }
    let parts: [&[u8]; 3] = [ts_raw.as_bytes(), b".", body];
    if !any_match(keyed(secrets), &parts, &candidates) {
        return Err(SignatureError::NoMatch);
    }
    Ok(Verified {
        event_id: None,
        event_type: None,
        timestamp: Some(ts),
    })
}

pub(super) fn sign(secret: &Secret, body: &[u8], now: i64) -> Vec<(String, String)> {
    let ts = now.to_string();
    let sig = hmac_hex(secret.keyed(), &[ts.as_bytes(), b".", body]);
    vec![(HEADER.into(), format!("t={ts},v1={sig}"))]
}
