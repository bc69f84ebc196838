//! `webhook-inbox listen`: a pull client for a developer's laptop. It claims the events of a
//! `pull` subscription with long polls, posts each to a local URL signed as an `http`
//! subscription signs (Standard Webhooks), and acks by the answer: a 2xx is done, anything
//! else is retried with the subscription's backoff. No port is opened anywhere.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use clap::Args;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::Sha256;

use super::client::{CliError, resolve_url, unreachable_message};
use crate::config::{self, Settings};
use crate::domain::time::now_ms;
use crate::forward::call::{signed_headers, webhook_id};
use crate::signature::Secret;

#[derive(Debug, Args)]
pub struct ListenArgs {
    /// The `pull` subscription to take events from.
    #[arg(long, value_name = "NAME")]
    subscription: String,
    /// Where to POST each event, e.g. http://127.0.0.1:3000/hooks.
    #[arg(long, value_name = "URL")]
    forward_to: String,
    /// Base URL of the server [default: from the config's `listen`, else http://127.0.0.1:8080].
    #[arg(long, env = "WEBHOOK_INBOX_URL", value_name = "URL")]
    url: Option<String>,
    /// The subscription's token [default: its `token` in the config, else the generated one
    /// in data/subscription-NAME-token].
    #[arg(
        long,
        env = "WEBHOOK_INBOX_PULL_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    /// The Standard Webhooks secret (whsec_…) to sign with [default: one derived from the
    /// token, the same at every run, printed at start].
    #[arg(long, value_name = "SECRET")]
    signing_secret: Option<String>,
    /// Events claimed at once (1 to 1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    batch: u64,
    /// How long the local endpoint may take to answer, in ms.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    timeout_ms: u64,
}

/// How long a long poll waits for work.
const WAIT_MS: u64 = 20_000;

#[derive(Debug, Deserialize)]
struct Claim {
    token: String,
    source: String,
    event_id: String,
    #[serde(rename = "type")]
    event_type: String,
    attempt: i64,
    content_type: Option<String>,
    body: Option<Box<serde_json::value::RawValue>>,
    body_base64: Option<String>,
}

struct Listener {
    http: reqwest::Client,
    claims_url: String,
    token: String,
    target: reqwest::Url,
    secret: Secret,
    batch: u64,
    lease_ms: u64,
}

pub fn run(config: Option<&Path>, args: ListenArgs) -> anyhow::Result<()> {
    let settings = Settings::load(config, std::env::vars())?;
    let base = resolve_url(args.url.as_deref(), config)?;
    let token = match &args.token {
        Some(t) => t.clone(),
        None => token_from(settings.as_ref(), &args.subscription)?,
    };
    let target = reqwest::Url::parse(&args.forward_to)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .context("--forward-to must be an http:// or https:// URL")?;
    let secret = match &args.signing_secret {
        Some(s) => {
            crate::signature::Scheme::StandardWebhooks
                .check_secret(s)
                .map_err(|m| anyhow::anyhow!("--signing-secret: {m}"))?;
            Secret::new(s.clone())
        }
        None => derived_secret(&token),
    };
    let listener = Listener {
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?,
        claims_url: format!(
            "{}/subscriptions/{}",
            base.trim_end_matches('/'),
            super::client::segment(&args.subscription)
        ),
        token,
        target,
        secret,
        batch: args.batch,
        lease_ms: (args.timeout_ms * 2 + 5_000).max(30_000),
    };
    let timeout = Duration::from_millis(args.timeout_ms);
    eprintln!(
        "Forwarding events of subscription `{}` from {base} to {}\nSigned with {} (Standard \
         Webhooks; --signing-secret to choose). Ctrl-C stops.",
        args.subscription,
        args.forward_to,
        listener.secret.expose()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(listener.run(timeout, crate::startup::shutdown_signal()))
}

/// The subscription's token as the server on this machine knows it.
fn token_from(settings: Option<&Settings>, name: &str) -> anyhow::Result<String> {
    if let Some(s) = settings.and_then(|s| s.subscriptions.iter().find(|s| s.name == name))
        && let Some(t) = &s.token
    {
        return Ok(t.clone());
    }
    let dir = match settings {
        Some(s) => config::data_dir(s),
        None => std::path::PathBuf::from("data"),
    };
    let file = crate::subscriptions::token_file(&dir, name);
    std::fs::read_to_string(&file)
        .map(|t| t.trim().to_string())
        .with_context(|| {
            format!(
                "no --token given and none in {} (pass --token or WEBHOOK_INBOX_PULL_TOKEN)",
                file.display()
            )
        })
}

/// A signing secret derived from the token: the same at every run, so that the local
/// receiver's configuration holds across restarts.
fn derived_secret(token: &str) -> Secret {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    mac.update(b"webhook-inbox listen signing secret");
    let key = mac.finalize().into_bytes();
    Secret::new(format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(&key[..24])
    ))
}

impl Listener {
    async fn call(&self, route: &str, body: &Value, wait: Duration) -> Result<Value, CliError> {
        let answer = self
            .http
            .post(format!("{}/{route}", self.claims_url))
            .bearer_auth(&self.token)
            .timeout(wait + Duration::from_secs(30))
            .json(body)
            .send()
            .await
            .map_err(|e| CliError::Unreachable(unreachable_message(&e, &self.claims_url)))?;
        let status = answer.status();
        let value: Value = answer.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let (code, message) = (
            value["error"].as_str().unwrap_or("error").to_string(),
            value["message"].as_str().unwrap_or("").to_string(),
        );
        Err(match status.as_u16() {
            400..=499 => CliError::Api { code, message },
            _ => CliError::Unreachable(format!("the server failed with {status}: {message}")),
        })
    }

    async fn run(
        self,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        tokio::pin!(stop);
        let mut backoff = Duration::from_millis(200);
        loop {
            let asked = json!({"max": self.batch, "lease_ms": self.lease_ms, "wait_ms": WAIT_MS});
            let claimed = tokio::select! {
                c = self.call("claim", &asked, Duration::from_millis(WAIT_MS)) => c,
                () = &mut stop => return Ok(()),
            };
            let claims: Vec<Claim> = match claimed {
                Ok(v) => serde_json::from_value(v["claims"].clone())
                    .context("the server's claims are not what this client reads")?,
                Err(CliError::Unreachable(e)) => {
                    eprintln!("{e}; trying again in {backoff:?}");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut stop => return Ok(()),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            backoff = Duration::from_millis(200);
            let mut results = Vec::with_capacity(claims.len());
            let mut stopped = false;
            for claim in &claims {
                if stopped {
                    results.push(json!({"token": claim.token, "outcome": "release"}));
                    continue;
                }
                tokio::select! {
                    r = self.forward(claim, timeout) => results.push(r),
                    () = &mut stop => {
                        stopped = true;
                        results.push(json!({"token": claim.token, "outcome": "release"}));
                    }
                }
            }
            if !results.is_empty() {
                let acked = self
                    .call("ack", &json!({ "results": results }), Duration::ZERO)
                    .await;
                if let Err(e) = acked {
                    eprintln!("could not ack ({e}): the events come again when their leases end");
                }
            }
            if stopped {
                eprintln!("stopped: unforwarded claims given back");
                return Ok(());
            }
        }
    }

    /// One event to the local URL, signed; its ack, and its line on stdout.
    async fn forward(&self, claim: &Claim, timeout: Duration) -> Value {
        let started = Instant::now();
        // (the answer on the line, the error of a retry)
        let (answer, error) = match self.post(claim, timeout).await {
            Ok(status) if status.is_success() => (status.as_u16().to_string(), None),
            Ok(status) => (
                status.as_u16().to_string(),
                Some(format!("the endpoint answered {status}")),
            ),
            Err((word, error)) => (word.to_string(), Some(error)),
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
        match error {
            None => json!({"token": claim.token, "outcome": "done"}),
            Some(error) => json!({"token": claim.token, "outcome": "retry", "error": error}),
        }
    }

    /// The call; an error is a word for the line and the reason for the retry.
    async fn post(
        &self,
        claim: &Claim,
        timeout: Duration,
    ) -> Result<reqwest::StatusCode, (&'static str, String)> {
        let ct = claim.content_type.as_deref();
        let body =
            crate::pull::body::decode(ct, claim.body.as_deref(), claim.body_base64.as_deref())
                .map_err(|e| ("unreadable", e))?;
        let id = webhook_id(&claim.source, &claim.event_id);
        let headers = signed_headers(
            std::slice::from_ref(&self.secret),
            &id,
            &body,
            now_ms() / 1000,
        )
        .map_err(|e| ("unsigned", e))?;
        let mut req = self
            .http
            .post(self.target.clone())
            .timeout(timeout)
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
                if e.is_timeout() {
                    ("timeout", "the endpoint did not answer in time".to_string())
                } else {
                    ("unreachable", format!("{}", e.without_url()))
                }
            })
    }
}
