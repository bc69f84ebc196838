//! `webhook-inbox sign`: the headers a provider would send for a body, so that a user can curl
//! a signed webhook. Secrets come from the config (`--source`) or the flags.

use std::io::Read as _;
use std::path::Path;

use anyhow::{Context, bail};
use clap::Args;

use crate::domain::payload::peek;
use crate::domain::time::now_secs;
use crate::signature::Scheme;
use crate::signature::Secret;

#[derive(Debug, Args)]
pub struct SignArgs {
    /// A source of the config (or `demo` on the embedded default).
    #[arg(long, conflicts_with_all = ["scheme", "secret"])]
    source: Option<String>,
    /// Scheme, with --secret, when not using a configured source.
    #[arg(long, value_parser = parse_scheme, requires = "secret")]
    scheme: Option<Scheme>,
    #[arg(long, requires = "scheme")]
    secret: Option<String>,
    /// Event id for schemes that carry it in a header (default: generated; for hmac-sha256,
    /// the body's `event_id` when it has one, else generated).
    #[arg(long)]
    event_id: Option<String>,
    /// Event type for schemes that carry it in a header (github, shopify).
    #[arg(long, default_value = "order.completed")]
    event_type: String,
    /// Unix seconds to sign with (default: now).
    #[arg(long)]
    timestamp: Option<i64>,
}

pub fn parse_scheme(s: &str) -> Result<Scheme, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        format!("unknown scheme `{s}`: standard-webhooks, stripe, github, shopify, hmac-sha256")
    })
}

pub fn run(config: Option<&Path>, args: SignArgs) -> anyhow::Result<()> {
    let (scheme, secret) = match (args.source, args.scheme, args.secret) {
        (Some(name), _, _) => {
            let loaded = super::load_settings(config)?;
            let source = loaded
                .settings
                .source(&name)
                .with_context(|| format!("no source named `{name}` in the config"))?;
            (source.scheme, source.secrets[0].clone())
        }
        (None, Some(scheme), Some(secret)) => (scheme, Secret::new(secret)),
        _ => bail!("give --source NAME, or --scheme and --secret"),
    };
    let mut body = Vec::new();
    std::io::stdin()
        .read_to_end(&mut body)
        .context("reading the body from stdin")?;
    // hmac-sha256 takes the id from the body's `event_id`, else `X-Event-Id` (the header is not
    // signed): a header is added only when asked for, or when the body has no id (the delivery
    // would be refused).
    let body_has_id = scheme == Scheme::HmacSha256
        && peek(&body, Some("application/json")).is_ok_and(|p| p.event_id().is_some());
    if body_has_id && args.event_id.is_some() {
        eprintln!("note: the body has an `event_id`: the server takes that, not X-Event-Id");
    }
    let id_header = !(scheme == Scheme::HmacSha256 && args.event_id.is_none() && body_has_id);
    let event_id = args.event_id.unwrap_or_else(|| scheme.new_event_id());
    let mut headers = scheme
        .sign(
            &secret,
            &event_id,
            &args.event_type,
            &body,
            args.timestamp.unwrap_or_else(now_secs),
        )
        .map_err(anyhow::Error::msg)?;
    if !id_header {
        headers.retain(|(name, _)| name != "X-Event-Id");
    }
    println!("Content-Type: application/json");
    for (name, value) in headers {
        println!("{name}: {value}");
    }
    Ok(())
}
