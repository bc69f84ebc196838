//! `webhook-inbox events purge`: the retention purge on demand, through `POST /events/purge`.

use clap::Args;
use serde_json::{Map, Value, json};

use super::client::{Api, ApiClient, CliError, Remote};
use super::when::parse_when;

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Purge completed events that completed before this: an age (`7d`, `12h`, `30m`, `90s`;
    /// `0s`: every completed event) or an RFC 3339 time. Default: `[retention] completed_days`.
    #[arg(long, value_parser = parse_when, value_name = "AGE|TIME")]
    completed_before: Option<String>,
    /// The same for failed events. Default: `[retention] failed_days`.
    #[arg(long, value_parser = parse_when, value_name = "AGE|TIME")]
    failed_before: Option<String>,
    /// At most this many events per request (default: what the server purges in about 5 s).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    per_call: Option<u64>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// Calls the route until the walk is complete: one call stops after a few seconds (or
/// `--per-call` events) and names where to go on, with the same times, so a large first purge
/// never meets the client's timeout. Progress goes to stderr after each call that left more.
pub fn run(api: &Api, args: PurgeArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let mut body = Map::new();
    for (key, time) in [
        ("completed_before", args.completed_before),
        ("failed_before", args.failed_before),
    ] {
        if let Some(time) = time {
            body.insert(key.into(), Value::String(time));
        }
    }
    if let Some(n) = args.per_call {
        body.insert("limit".into(), n.into());
    }
    let (mut total, mut calls) = (0, 0);
    loop {
        let answer = client.post("/events/purge", &[], Some(&Value::Object(body.clone())))?;
        calls += 1;
        total += answer["purged"].as_u64().unwrap_or(0);
        let next = match &answer["next_cursor"] {
            Value::String(next) if answer["more"] == true => next.clone(),
            _ => break,
        };
        // The server's cursor always moves on; one that did not would loop forever.
        if body.get("cursor").and_then(Value::as_str) == Some(next.as_str()) {
            return Err(
                CliError::Unreachable("the server repeated its purge cursor".into()).into(),
            );
        }
        eprintln!("purged {total} events so far ({calls} calls), going on");
        body.insert("cursor".into(), Value::String(next));
    }
    if args.json {
        println!("{}", json!({"purged": total, "calls": calls}));
    } else {
        println!("purged {total} events");
    }
    Ok(())
}
