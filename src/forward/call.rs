//! One call of an `http` subscription: the signed POST and what its answer means.

use sha2::{Digest, Sha256};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::client::{Endpoint, Failure};

use crate::signature::{Scheme, Secret};
use crate::store::Claimed;

/// What a call's answer (or its absence) means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A 2xx: done.
    Delivered(u16),
    /// Not called: the subscription's transform gave no output (completed `filtered`).
    Filtered,
    /// Not called: the transform failed (the message); failed permanently, the endpoint
    /// untouched.
    Unshaped(String),
    /// 410 Gone: the endpoint asked to stop. The subscription is paused; the event waits.
    Gone,
    /// Anything else: retried with backoff, not before `retry_after_ms` when the endpoint
    /// said so. `unknown`: the endpoint may have acted (a timeout, a connection lost after the
    /// request went out, a 5xx), which an at-most-once subscription does not repeat.
    Failed {
        error: String,
        unknown: bool,
        retry_after_ms: Option<i64>,
        /// For `webhook_inbox_forwards_total`.
        result: &'static str,
    },
}

/// The `webhook-id` of an event: the same for every attempt, redelivery, restart and node, and
/// the key the receiver deduplicates on. Derived from the event's key (which is unique), in
/// characters any header carries.
pub fn webhook_id(source: &str, event_id: &str) -> String {
    let digest = Sha256::new()
        .chain_update(source.as_bytes())
        .chain_update([0u8])
        .chain_update(event_id.as_bytes())
        .finalize();
    format!("msg_{}", hex::encode(&digest[..16]))
}

/// The Standard Webhooks headers of one call, every secret signing it (`v1,… v1,…`).
pub fn signed_headers(
    secrets: &[Secret],
    id: &str,
    body: &[u8],
    now_seconds: i64,
) -> Result<Vec<(String, String)>, String> {
    let mut signatures = Vec::with_capacity(secrets.len());
    let mut headers = Vec::new();
    for secret in secrets {
        let signed = Scheme::StandardWebhooks.sign(secret, id, "", body, now_seconds)?;
        for (name, value) in signed {
            if name == "webhook-signature" {
                signatures.push(value);
            } else if headers.iter().all(|(n, _)| *n != name) {
                headers.push((name, value));
            }
        }
    }
    headers.push(("webhook-signature".into(), signatures.join(" ")));
    Ok(headers)
}

const CONTENT_TYPE: HeaderName = reqwest::header::CONTENT_TYPE;
const SOURCE: HeaderName = HeaderName::from_static("webhook-inbox-source");
const EVENT_ID: HeaderName = HeaderName::from_static("webhook-inbox-event-id");
const EVENT_TYPE: HeaderName = HeaderName::from_static("webhook-inbox-event-type");
const ATTEMPT: HeaderName = HeaderName::from_static("webhook-inbox-attempt");
const TRACEPARENT: HeaderName = HeaderName::from_static(crate::telemetry::traces::TRACEPARENT);

/// A call not made (nothing to sign with): a failed attempt, retried.
pub fn not_sent(error: String) -> Answer {
    failed(error, false, None, "not_sent")
}

/// POST the event's body (`body`, taken from the claim) as it was received, signed with each
/// of `secrets`, with the W3C `traceparent` given beside the event, and read what the answer
/// means. Errors never name the URL, which may hold credentials.
pub async fn forward(
    endpoint: &Endpoint,
    secrets: &[Secret],
    (event, traceparent): (&Claimed, Option<&str>),
    body: Vec<u8>,
    now_ms: i64,
) -> Answer {
    let claim = &event.claim;
    let id = webhook_id(&claim.source, &claim.event_id);
    let signed = match signed_headers(secrets, &id, &body, now_ms / 1000) {
        Ok(h) => h,
        Err(e) => return not_sent(format!("cannot sign: {e}")),
    };
    let content_type = event
        .content_type
        .as_deref()
        .unwrap_or("application/octet-stream");
    let attempt = claim.attempt.to_string();
    let given = [
        (CONTENT_TYPE, content_type),
        (SOURCE, claim.source.as_str()),
        (EVENT_ID, claim.event_id.as_str()),
        (EVENT_TYPE, event.event_type.as_str()),
        (ATTEMPT, attempt.as_str()),
    ];
    let mut headers = HeaderMap::with_capacity(given.len() + signed.len() + 1);
    for (name, value) in given {
        match HeaderValue::from_str(value) {
            Ok(value) => headers.insert(name, value),
            Err(_) => return not_sent(format!("`{name}` cannot be sent as a header: {value:?}")),
        };
    }
    for (name, value) in &signed {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(value)) => headers.insert(name, value),
            _ => return not_sent(format!("`{name}` cannot be sent as a header")),
        };
    }
    if let Some(traceparent) = traceparent
        && let Ok(value) = HeaderValue::from_str(traceparent)
    {
        headers.insert(TRACEPARENT, value);
    }
    let reply = match endpoint.post(headers, body.into()).await {
        Ok(reply) => reply,
        Err(failure) => return unanswered(failure),
    };
    match reply.status {
        200..=299 => return Answer::Delivered(reply.status),
        410 => return Answer::Gone,
        _ => {}
    }
    let retry_after_ms = reply
        .retry_after
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after_ms(v, now_ms));
    let (unknown, result) = match reply.status {
        // Refused (408 and 429 say not processed): safe to send again in either mode.
        400..=499 => (false, "4xx"),
        300..=399 => (false, "3xx"),
        _ => (true, "5xx"),
    };
    let status = reqwest::StatusCode::from_u16(reply.status)
        .map_or_else(|_| reply.status.to_string(), |s| s.to_string());
    failed(
        format!("the endpoint answered {status}: {}", reply.text.trim()),
        unknown,
        retry_after_ms,
        result,
    )
}

fn failed(
    error: String,
    unknown: bool,
    retry_after_ms: Option<i64>,
    result: &'static str,
) -> Answer {
    Answer::Failed {
        error,
        unknown,
        retry_after_ms,
        result,
    }
}

/// What a call without an answer proves: a failed connect sent nothing; anything later may
/// have.
fn unanswered(failure: Failure) -> Answer {
    match failure {
        Failure::Connect(chain) => failed(
            format!("could not connect to the endpoint (nothing was sent): {chain}"),
            false,
            None,
            "connection",
        ),
        Failure::Timeout(timeout_ms) => failed(
            format!("no answer from the endpoint within {timeout_ms} ms (it may have acted)"),
            true,
            None,
            "timeout",
        ),
        Failure::AfterSent(chain) => failed(
            format!("the call failed after the request may have been sent: {chain}"),
            true,
            None,
            "connection",
        ),
    }
}

/// `Retry-After` in milliseconds from now: delay-seconds or an HTTP date; `None` when it is
/// neither. Bounded to a day, so that an endpoint cannot park an event for years.
pub fn retry_after_ms(value: &str, now_ms: i64) -> Option<i64> {
    const DAY_MS: i64 = 86_400_000;
    let value = value.trim();
    let ms = if let Ok(seconds) = value.parse::<u64>() {
        i64::try_from(seconds.min(86_400) * 1000).ok()?
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        let at_ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
        (i64::try_from(at_ms).ok()? - now_ms).max(0)
    };
    Some(ms.min(DAY_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        assert_eq!(retry_after_ms("120", 0), Some(120_000));
        assert_eq!(retry_after_ms(" 0 ", 0), Some(0));
        // 1994-11-06T08:49:37Z is 784111777 s.
        let now = 784_111_777_000 - 5_000;
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(5_000)
        );
        // A date already past means now; a huge delay is cut to a day.
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now + 60_000),
            Some(0)
        );
        assert_eq!(retry_after_ms("99999999999", 0), Some(86_400_000));
        assert_eq!(retry_after_ms("soon", 0), None);
        assert_eq!(retry_after_ms("-5", 0), None);
    }

    #[test]
    fn the_webhook_id_is_stable_and_tells_events_apart() {
        let a = webhook_id("stripe", "evt_1");
        assert_eq!(a, webhook_id("stripe", "evt_1"));
        assert_ne!(a, webhook_id("stripe", "evt_2"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(webhook_id("ab", "c"), webhook_id("a", "bc"));
        assert!(a.starts_with("msg_") && a.len() == 36);
    }

    /// Each secret signs: a receiver that knows any one of them verifies the call.
    #[test]
    fn every_secret_signs_and_each_signature_verifies() {
        let old = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let new = Secret::new("whsec_c2VjcmV0LWtleS1mb3Itcm90YXRpb24tdGVzdA==");
        let headers =
            signed_headers(&[old.clone(), new.clone()], "msg_1", b"{}", 1_700_000_000).unwrap();
        let signature = &headers
            .iter()
            .find(|(n, _)| n == "webhook-signature")
            .unwrap()
            .1;
        assert_eq!(signature.split(' ').count(), 2);
        for secret in [old, new] {
            let verified = Scheme::StandardWebhooks.verify(
                &headers,
                b"{}",
                std::slice::from_ref(&secret),
                1_700_000_000,
                300,
            );
            assert!(verified.is_ok(), "{verified:?}");
        }
    }
}
