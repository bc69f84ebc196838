//! `webhook-inbox events retry`: one event, or every failed event of a filter, counted and
//! confirmed first.

use std::io::Write as _;

use anyhow::Context as _;
use clap::Args;
use serde_json::{Value, json};

use super::client::{Api, ApiClient, CliError, Remote, segment};
use super::table::text;
use super::when::parse_when;

#[derive(Debug, Args)]
pub struct RetryArgs {
    /// With EVENT_ID: the event to retry.
    #[arg(required_unless_present = "failed")]
    source: Option<String>,
    #[arg(requires = "source")]
    event_id: Option<String>,
    /// Run a completed (or abandoned at-most-once) event again.
    #[arg(long, requires = "event_id")]
    force: bool,
    /// Only this subscription's state of the event (default: each failed one); with
    /// --failed, only failures of this subscription.
    #[arg(long)]
    subscription: Option<String>,
    /// Retry every failed event matching --source/--type/--received-* (abandoned ones excluded).
    #[arg(long, conflicts_with_all = ["source", "event_id", "force"])]
    failed: bool,
    #[arg(long = "source", requires = "failed")]
    source_filter: Option<String>,
    #[arg(long = "type", requires = "failed")]
    event_type: Option<String>,
    /// An RFC 3339 time or an age back from now (`1h`, `7d`).
    #[arg(long, requires = "failed", value_parser = parse_when, value_name = "TIME|AGE")]
    received_after: Option<String>,
    #[arg(long, requires = "failed", value_parser = parse_when, value_name = "TIME|AGE")]
    received_before: Option<String>,
    /// With --failed: retry without asking first (for scripts).
    #[arg(long, requires = "failed")]
    yes: bool,
    /// With --failed: only count the events that would be retried.
    #[arg(long, requires = "failed", conflicts_with = "yes")]
    dry_run: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// The failed events a bulk retry with `filter` would take: those of the filter that are not
/// abandoned (the route leaves those out), counted over `GET /events` pages.
fn count_retryable(
    client: &ApiClient,
    filter: &serde_json::Map<String, Value>,
) -> anyhow::Result<u64> {
    let mut query: Vec<(&str, String)> = vec![("status", "failed".into()), ("limit", "500".into())];
    for (k, v) in filter {
        let key = match k.as_str() {
            "source" => "source",
            "type" => "type",
            "received_after" => "received_after",
            "subscription" => "subscription",
            _ => "received_before",
        };
        query.push((key, text(v)));
    }
    let mut count = 0;
    let mut cursor: Option<String> = None;
    // Bounded: 10,000 pages of 500.
    for _ in 0..10_000 {
        let mut q = query.clone();
        if let Some(c) = &cursor {
            q.push(("cursor", c.clone()));
        }
        let page = client.get("/events", &q)?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        count += events.iter().filter(|e| e["abandoned"] != true).count() as u64;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    Ok(count)
}

/// Ask on the terminal; false when the answer is not yes, or when there is no terminal to ask.
fn confirmed(question: &str) -> anyhow::Result<bool> {
    use std::io::IsTerminal as _;
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().context("writing the question")?;
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("reading the answer")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

pub fn run(api: &Api, args: RetryArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    if args.failed {
        let filter: serde_json::Map<String, Value> = [
            ("source", &args.source_filter),
            ("type", &args.event_type),
            ("received_after", &args.received_after),
            ("received_before", &args.received_before),
            ("subscription", &args.subscription),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), Value::String(v))))
        .collect();
        let count = count_retryable(&client, &filter)?;
        let scope = if filter.is_empty() {
            "of every source".to_string()
        } else {
            let terms: Vec<String> = filter
                .iter()
                .map(|(k, v)| format!("{k}={}", text(v)))
                .collect();
            format!("matching {}", terms.join(", "))
        };
        if args.dry_run {
            if args.json {
                println!("{}", json!({"would_retry": count}));
            } else {
                println!("{count} failed event(s) {scope} would be retried");
            }
            return Ok(());
        }
        if count > 0 && !args.yes && !confirmed(&format!("Retry {count} failed event(s) {scope}?"))?
        {
            return Err(CliError::Refused(format!(
                "nothing retried: {count} failed event(s) {scope}; confirm at the prompt, or \
                 pass --yes (--dry-run only counts)"
            ))
            .into());
        }
        let answer = client.post("/events/retry", &[], Some(&Value::Object(filter)))?;
        if args.json {
            println!("{answer}");
        } else {
            println!("retried {} failed event(s)", text(&answer["retried"]));
        }
        return Ok(());
    }
    let (source, event_id) = (
        args.source.expect("clap requires it"),
        args.event_id
            .ok_or_else(|| anyhow::anyhow!("give SOURCE EVENT_ID, or --failed for a bulk retry"))?,
    );
    let mut query = if args.force {
        vec![("force", "true".to_string())]
    } else {
        vec![]
    };
    if let Some(name) = &args.subscription {
        query.push(("subscription", name.clone()));
    }
    let e = client
        .post(
            &format!("/events/{}/{}/retry", segment(&source), segment(&event_id)),
            &query,
            None,
        )
        .map_err(|e| match e {
            // The API's message names its query parameter; a CLI user needs the flag.
            CliError::Api { code, message } if code == "conflict" => CliError::Api {
                message: message.replace(
                    "retry with ?force=true",
                    "run `events retry` again with --force",
                ),
                code,
            },
            other => other,
        })?;
    if args.json {
        println!("{e}");
    } else {
        println!(
            "{source}/{event_id}: {} (attempts so far: {})",
            text(&e["status"]),
            text(&e["attempts"])
        );
    }
    Ok(())
}
