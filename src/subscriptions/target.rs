//! Where a call-out subscription (`http`, `nats`, `amqp`) delivers, checked: the part of
//! [`validate`](super::validate) that builds its [`HttpTarget`].

use super::settings::{FieldError, SubscriptionSettings, invalid};
use super::{HttpTarget, Kind};
use crate::domain::ConsumerSettings;
use crate::signature::Secret;

/// The bounds of `concurrency` and `timeout_ms` of an `http` subscription.
const MAX_CONCURRENCY: usize = 1024;
const DEFAULT_CONCURRENCY: usize = 8;
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// A CA bundle is a few kilobytes; the system's whole store is about 200 KB.
const MAX_CA_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The bytes of a file setting (`ca_file`, `creds_file`), on the disk of the node that reads
/// it: a regular file of at most `max` bytes.
pub(super) fn read_file(field: &str, file: &str, max: u64) -> Result<Vec<u8>, FieldError> {
    // Read from a body of the API too: a device or a huge file (`/dev/zero`) would hold the
    // request (and its memory) for ever.
    let meta = std::fs::metadata(file)
        .map_err(|e| invalid(field, format!("cannot read `{file}`: {e}")))?;
    if !meta.is_file() || meta.len() > max {
        return Err(invalid(
            field,
            format!("`{file}` is not a file of at most {max} bytes"),
        ));
    }
    std::fs::read(file).map_err(|e| invalid(field, format!("cannot read `{file}`: {e}")))
}

/// A `ca_file` is a PEM file of certificates, on the disk of the node that reads it.
pub fn check_ca_file(file: &str) -> Result<(), FieldError> {
    let pem = read_file("ca_file", file, MAX_CA_FILE_BYTES)?;
    reqwest::Certificate::from_pem_bundle(&pem)
        .ok()
        .filter(|certs| !certs.is_empty())
        .ok_or_else(|| invalid("ca_file", format!("`{file}` holds no PEM certificate")))?;
    Ok(())
}

/// The target of a call-out kind, checked: for `http` a URL to call and secrets that are
/// Standard Webhooks secrets, for a broker kind its URL and destination; for each a timeout that
/// ends before the lease does and a CA file that reads.
pub(super) fn http_target(
    s: &SubscriptionSettings,
    consumers: &ConsumerSettings,
) -> Result<HttpTarget, FieldError> {
    let url = s.url.as_deref().ok_or_else(|| match s.kind {
        Kind::Nats | Kind::Amqp => invalid(
            "url",
            format!(
                "a `{}` subscription needs the broker's URL",
                s.kind.as_str()
            ),
        ),
        _ => invalid("url", "an `http` subscription needs the URL to call"),
    })?;
    let (mut subject, mut stream, mut exchange, mut routing_key) = (None, None, None, None);
    match s.kind {
        Kind::Nats => {
            (subject, stream) =
                super::nats::destination(url, s.subject.as_deref(), s.stream.as_deref())?;
        }
        Kind::Amqp => {
            (exchange, routing_key) =
                super::amqp::destination(url, s.exchange.as_deref(), s.routing_key.as_deref())?;
        }
        // The URL is never echoed: it may hold credentials.
        _ => match reqwest::Url::parse(url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => {
                return Err(invalid(
                    "url",
                    "must be an absolute http:// or https:// URL with a host",
                ));
            }
        },
    };
    let signing_secrets = match &s.signing_secret {
        None => Vec::new(),
        Some(secrets) => {
            let list = secrets.list();
            if list.is_empty() {
                return Err(invalid("signing_secret", "an empty list signs nothing"));
            }
            for secret in &list {
                crate::signature::Scheme::StandardWebhooks
                    .check_secret(secret)
                    .map_err(|m| invalid("signing_secret", m))?;
            }
            list.into_iter().map(Secret::new).collect()
        }
    };
    let timeout_ms = s.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    let half_lease_ms = consumers.lease_ms() / 2;
    if timeout_ms == 0 || i64::try_from(timeout_ms).unwrap_or(i64::MAX) >= half_lease_ms {
        return Err(invalid(
            "timeout_ms",
            format!(
                "must be between 1 and half of consumers.lease_seconds ({half_lease_ms} ms), so \
                 that a call always ends before its lease does"
            ),
        ));
    }
    let concurrency = s.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
        return Err(invalid(
            "concurrency",
            format!("must be between 1 and {MAX_CONCURRENCY}"),
        ));
    }
    let ca_file = s.ca_file.clone().filter(|f| !f.is_empty());
    if let Some(file) = &ca_file {
        check_ca_file(file)?;
    }
    let creds_file = s.creds_file.clone().filter(|f| !f.is_empty());
    if let Some(file) = &creds_file {
        super::nats::check_creds_file(file)?;
    }
    Ok(HttpTarget {
        url: url.to_string(),
        subject,
        stream,
        creds_file,
        exchange,
        routing_key,
        signing_secrets,
        timeout_ms,
        ca_file,
        concurrency,
        rate_per_second: s.rate_per_second.unwrap_or(0),
    })
}
