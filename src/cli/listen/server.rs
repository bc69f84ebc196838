//! The subscription's pull routes as `listen` calls them. A claim's answer is read into typed
//! claims straight from its bytes: each `body` stays the raw JSON text the server embedded, so
//! that the local endpoint gets the bytes the sender sent (a `serde_json::Value` would round
//! `1.50`, `1e3` and big integers, and re-escape strings). A long poll cut mid-answer (a node
//! killed, a connection dropped) is a connection failure to retry, not a malformed answer.

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::{TOKEN_ENV, TokenOrigin};
use crate::cli::client::{CliError, segment, unreachable_message};

/// One claimed event, as the claim route shows it.
#[derive(Debug, Deserialize)]
pub(super) struct Claim {
    pub token: String,
    pub source: String,
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub attempt: i64,
    pub content_type: Option<String>,
    pub body: Option<Box<RawValue>>,
    pub body_base64: Option<String>,
}

#[derive(Deserialize)]
struct Claims {
    claims: Vec<Claim>,
}

#[derive(Deserialize)]
struct Extended {
    results: Vec<ExtendResult>,
}

#[derive(Deserialize)]
struct ExtendResult {
    token: String,
    extended: bool,
}

pub(super) struct Server {
    http: reqwest::Client,
    base: String,
    routes: String,
    name: String,
    token: String,
    origin: TokenOrigin,
}

impl Server {
    pub fn new(
        http: reqwest::Client,
        base: &str,
        name: &str,
        token: String,
        origin: TokenOrigin,
    ) -> Server {
        let base = base.trim_end_matches('/').to_string();
        Server {
            http,
            routes: format!("{base}/subscriptions/{}", segment(name)),
            base,
            name: name.to_string(),
            token,
            origin,
        }
    }

    /// Up to `max` claims leased for `lease`, waiting up to `wait` for work.
    pub async fn claim(
        &self,
        max: u64,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Claim>, CliError> {
        let asked = json!({"max": max, "lease_ms": millis(lease), "wait_ms": millis(wait)});
        let answer = self.call("claim", &asked, wait).await?;
        match serde_json::from_slice::<Claims>(&answer) {
            Ok(c) => Ok(c.claims),
            // A waiting claim streams spaces until its answer: a cut shows as a short body.
            Err(e) if e.is_eof() => Err(CliError::Unreachable(format!(
                "the long poll to {} was cut before its answer",
                self.base
            ))),
            Err(e) => Err(CliError::Refused(format!(
                "the server's claims are not what this client reads: {e}"
            ))),
        }
    }

    /// Wait (up to `within`) until the server serves this subscription's routes: each node
    /// serves a subscription within a second of its creation, so a session's token refused
    /// before then is not a wrong one. An empty ack asks (refused as empty once the token
    /// is taken); an unreachable server is left to the claims' own backoff.
    pub async fn served(&self, within: Duration) -> Result<(), CliError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self
                .call("ack", &json!({ "results": [] }), Duration::ZERO)
                .await
            {
                Err(CliError::Refused(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(refused @ CliError::Refused(_)) => return Err(refused),
                _ => return Ok(()),
            }
        }
    }

    /// Acks; the tokens whose lease had already ended (the event comes again).
    pub async fn ack(&self, results: Vec<Value>) -> Result<HashSet<String>, CliError> {
        let asked = json!({ "results": results });
        let answer = self.call("ack", &asked, Duration::ZERO).await?;
        let answer: Value = serde_json::from_slice(&answer)
            .map_err(|e| CliError::Unreachable(format!("unreadable ack answer: {e}")))?;
        Ok(answer["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["applied"] == json!(false))
            .filter_map(|r| r["token"].as_str().map(str::to_string))
            .collect())
    }

    /// Leases `tokens` for `lease` from now; the tokens no longer held.
    pub async fn extend(
        &self,
        tokens: Vec<&str>,
        lease: Duration,
    ) -> Result<HashSet<String>, CliError> {
        let asked = json!({"tokens": tokens, "lease_ms": millis(lease)});
        let answer = self.call("extend", &asked, Duration::ZERO).await?;
        let answer: Extended = serde_json::from_slice(&answer)
            .map_err(|e| CliError::Unreachable(format!("unreadable extend answer: {e}")))?;
        Ok(answer
            .results
            .into_iter()
            .filter(|r| !r.extended)
            .map(|r| r.token)
            .collect())
    }

    /// One route; the answer's bytes on a 2xx.
    async fn call(&self, route: &str, body: &Value, wait: Duration) -> Result<Vec<u8>, CliError> {
        let answer = self
            .http
            .post(format!("{}/{route}", self.routes))
            .bearer_auth(&self.token)
            .timeout(wait + Duration::from_secs(30))
            .json(body)
            .send()
            .await
            .map_err(|e| CliError::Unreachable(unreachable_message(&e, &self.base)))?;
        let status = answer.status();
        let bytes = answer.bytes().await.map_err(|e| {
            CliError::Unreachable(format!("the answer from {} was cut: {e}", self.base))
        })?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        let error: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let code = error["error"].as_str().unwrap_or("error").to_string();
        let message = error["message"].as_str().unwrap_or("").to_string();
        Err(match status.as_u16() {
            401 => CliError::Refused(format!(
                "the server at {} refused the token of subscription `{}` read from {} \
                 ({message}); pass the subscription's own token (not the admin token) with \
                 --token or {TOKEN_ENV}, or point --config at the server's config",
                self.base, self.name, self.origin
            )),
            400..=499 => CliError::Api { code, message },
            _ => CliError::Unreachable(format!("the server failed with {status}: {message}")),
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
