//! The local endpoint: one signed POST per event, and what its failure means. A connection that
//! was never made sent nothing, so its event was not delivered and is given back (`release`);
//! any other failure may have reached the endpoint, so it is retried under the subscription's
//! backoff, where the receiver's dedup on `webhook-id` makes a second call safe.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::server::Claim;
use crate::domain::time::now_ms;
use crate::forward::call::{signed_headers, webhook_id};
use crate::signature::Secret;

/// What a call came to.
pub(super) enum Called {
    /// The endpoint answered, or may have got the call: the ack to send.
    Ack(Value),
    /// Nothing was sent: the connection was not made (the cause).
    NotSent(String),
}

pub(super) struct Endpoint {
    http: reqwest::Client,
    target: reqwest::Url,
    secret: Secret,
    /// How long the endpoint may take to answer: what a lease must cover.
    pub timeout: Duration,
}

impl Endpoint {
    pub fn new(
        http: reqwest::Client,
        target: reqwest::Url,
        secret: Secret,
        timeout: Duration,
    ) -> Endpoint {
        Endpoint {
            http,
            target,
            secret,
            timeout,
        }
    }

    pub fn url(&self) -> &reqwest::Url {
        &self.target
    }

    /// One event to the local URL, signed; its line on stdout.
    pub async fn forward(&self, claim: &Claim) -> Called {
        let started = Instant::now();
        // (the answer on the line, what to ack)
        let (answer, called) = match self.post(claim).await {
            Ok(status) if status.is_success() => (
                status.as_u16().to_string(),
                Called::Ack(json!({"token": claim.token, "outcome": "done"})),
            ),
            Ok(status) => (
                status.as_u16().to_string(),
                retry(claim, format!("the endpoint answered {status}")),
            ),
            Err(Failed::NotSent(cause)) => ("refused".to_string(), Called::NotSent(cause)),
            Err(Failed::Other(word, error)) => (word.to_string(), retry(claim, error)),
        };
        println!(
            "{}  {}  {}  {}  {}  {} ms",
            crate::domain::time::rfc3339(now_ms()),
            claim.source,
            claim.event_id,
            claim.event_type,
            answer,
            started.elapsed().as_millis()
        );
        called
    }

    /// Whether the endpoint accepts connections again: a TCP connect, no request, so that a
    /// probe is never taken for a delivery.
    pub async fn accepts(&self) -> bool {
        let (Some(host), Some(port)) =
            (self.target.host_str(), self.target.port_or_known_default())
        else {
            return false;
        };
        let connect = tokio::net::TcpStream::connect(format!("{host}:{port}"));
        matches!(tokio::time::timeout(self.timeout, connect).await, Ok(Ok(_)))
    }

    async fn post(&self, claim: &Claim) -> Result<reqwest::StatusCode, Failed> {
        let ct = claim.content_type.as_deref();
        let body =
            crate::pull::body::decode(ct, claim.body.as_deref(), claim.body_base64.as_deref())
                .map_err(|e| Failed::Other("unreadable", e))?;
        let id = webhook_id(&claim.source, &claim.event_id);
        let headers = signed_headers(
            std::slice::from_ref(&self.secret),
            &id,
            &body,
            now_ms() / 1000,
        )
        .map_err(|e| Failed::Other("unsigned", e))?;
        let mut req = self
            .http
            .post(self.target.clone())
            .timeout(self.timeout)
            .header("webhook-inbox-source", &claim.source)
            .header("webhook-inbox-event-id", &claim.event_id)
            .header("webhook-inbox-event-type", &claim.event_type)
            .header("webhook-inbox-attempt", claim.attempt.to_string());
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        for (name, value) in headers {
            req = req.header(name, value);
        }
        req.body(body)
            .send()
            .await
            .map(|r| r.status())
            .map_err(|e| {
                if e.is_connect() {
                    Failed::NotSent(causes(&e.without_url()))
                } else if e.is_timeout() {
                    Failed::Other("timeout", "the endpoint did not answer in time".into())
                } else {
                    Failed::Other("unreachable", causes(&e.without_url()))
                }
            })
    }
}

enum Failed {
    NotSent(String),
    /// A word for the line, the reason for the retry.
    Other(&'static str, String),
}

fn retry(claim: &Claim, error: String) -> Called {
    Called::Ack(json!({"token": claim.token, "outcome": "retry", "error": error}))
}

/// An error with its causes, e.g. `client error (Connect): tcp connect error: Connection
/// refused (os error 111)`.
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = e.source();
    }
    text
}
