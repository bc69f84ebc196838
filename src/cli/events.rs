//! `webhook-inbox events list|show|retry|export`: ops from a terminal or a script, over the
//! HTTP API. `--json` prints the API's answer for scripts.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{ApiClient, CliError, RESOLUTION_HELP, Remote, pages, segment};
use super::purge;
use super::table::{clip, render, text};
use super::when::parse_when;

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List events, newest first.
    #[command(after_help = RESOLUTION_HELP)]
    List(ListArgs),
    /// One event with its payload (as received) and attempt history.
    #[command(after_help = RESOLUTION_HELP)]
    Show(ShowArgs),
    /// Retry one event, or every failed event matching a filter (`--failed`).
    #[command(after_help = RESOLUTION_HELP)]
    Retry(RetryArgs),
    /// Write matching events as a replay file (JSON lines) for `webhook-inbox replay`.
    #[command(after_help = RESOLUTION_HELP)]
    Export(ExportArgs),
    /// Purge terminal events past an age now (bodies and history go, tombstones stay).
    Purge(purge::PurgeArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct FilterArgs {
    /// `purged`: tombstones only (otherwise they are left out).
    #[arg(long, value_parser = ["pending", "claimed", "completed", "failed", "purged"])]
    status: Option<String>,
    #[arg(long)]
    source: Option<String>,
    #[arg(long = "type")]
    event_type: Option<String>,
    /// An RFC 3339 time (2026-11-30T00:00:00Z) or an age back from now (`1h`, `7d`).
    #[arg(long, value_parser = parse_when, value_name = "TIME|AGE")]
    received_after: Option<String>,
    #[arg(long, value_parser = parse_when, value_name = "TIME|AGE")]
    received_before: Option<String>,
}

impl FilterArgs {
    fn query(&self) -> Vec<(&'static str, String)> {
        [
            ("status", &self.status),
            ("source", &self.source),
            ("type", &self.event_type),
            ("received_after", &self.received_after),
            ("received_before", &self.received_before),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Events per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    limit: u32,
    /// Start after the page that printed this cursor (`next_cursor` in --json).
    #[arg(long, conflicts_with = "all")]
    cursor: Option<String>,
    /// Follow the cursor to the last page.
    #[arg(long)]
    all: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    source: String,
    event_id: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

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

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Write here instead of stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
    #[command(flatten)]
    remote: Remote,
}

pub fn run(config: Option<&Path>, command: EventsCommand) -> anyhow::Result<()> {
    match command {
        EventsCommand::List(args) => list(config, args),
        EventsCommand::Show(args) => show(config, args),
        EventsCommand::Retry(args) => retry(config, args),
        EventsCommand::Export(args) => export(config, args),
        EventsCommand::Purge(args) => purge::run(config, args),
    }
}

fn list(config: Option<&Path>, args: ListArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.remote, config)?;
    let mut query = args.filter.query();
    query.push(("limit", args.limit.to_string()));
    let (events, next) = pages(
        &client,
        "/events",
        &query,
        "events",
        args.cursor.clone(),
        args.all,
    )?;
    if args.json {
        println!("{}", json!({"events": events, "next_cursor": next}));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                text(&e["source"]),
                text(&e["event_id"]),
                text(&e["type"]),
                text(&e["status"]),
                text(&e["attempts"]),
                text(&e["received_at"]),
                clip(
                    &text(if e["status"] == "failed" {
                        &e["last_error"]
                    } else {
                        &e["outcome"]
                    }),
                    60,
                ),
            ]
        })
        .collect();
    print!(
        "{}",
        render(
            &[
                "SOURCE",
                "EVENT_ID",
                "TYPE",
                "STATUS",
                "ATTEMPTS",
                "RECEIVED",
                "OUTCOME/ERROR"
            ],
            &rows
        )
    );
    if let Value::String(cursor) = &next {
        eprintln!("more events: add --cursor {cursor} for the next page, or --all");
    }
    Ok(())
}

fn show(config: Option<&Path>, args: ShowArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.remote, config)?;
    let e = client.get(
        &format!(
            "/events/{}/{}",
            segment(&args.source),
            segment(&args.event_id)
        ),
        &[],
    )?;
    if args.json {
        println!("{e}");
        return Ok(());
    }
    if e["purged"] == true {
        // A tombstone: no body and no history any more, and the answer says so.
        for key in [
            "source",
            "event_id",
            "type",
            "status",
            "outcome",
            "received_at",
            "completed_at",
            "purged_at",
            "payload_sha256",
        ] {
            println!("{key:<19} {}", text(&e[key]));
        }
        println!(
            "\npurged by retention: its body and attempt history are gone; the tombstone keeps \
             its key (a redelivery is still a duplicate) and its body's SHA-256 above"
        );
        return Ok(());
    }
    for key in [
        "source",
        "event_id",
        "type",
        "status",
        "outcome",
        "last_error",
        "attempts",
        "deliveries",
        "payload_mismatches",
        "received_at",
        "last_delivered_at",
        "next_attempt_at",
        "completed_at",
        "abandoned",
    ] {
        println!("{key:<19} {}", text(&e[key]));
    }
    println!(
        "\npayload:\n{}",
        serde_json::to_string_pretty(&e["payload"])?
    );
    let history: Vec<Vec<String>> = e["history"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            [
                "attempt",
                "worker",
                "started_at",
                "finished_at",
                "result",
                "error",
            ]
            .iter()
            .map(|k| text(&a[*k]))
            .collect()
        })
        .collect();
    println!(
        "\nhistory:\n{}",
        render(
            &["#", "WORKER", "STARTED", "FINISHED", "RESULT", "ERROR"],
            &history
        )
    );
    Ok(())
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

fn retry(config: Option<&Path>, args: RetryArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.remote, config)?;
    if args.failed {
        let filter: serde_json::Map<String, Value> = [
            ("source", &args.source_filter),
            ("type", &args.event_type),
            ("received_after", &args.received_after),
            ("received_before", &args.received_before),
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
    let query = if args.force {
        vec![("force", "true".to_string())]
    } else {
        vec![]
    };
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

fn export(config: Option<&Path>, args: ExportArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.remote, config)?;
    let mut response = client.get_stream("/events/export", &args.filter.query())?;
    let out: Box<dyn std::io::Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = LineCounter {
        inner: out,
        lines: 0,
    };
    std::io::copy(&mut response, &mut out)?;
    out.flush()?;
    if let Some(path) = &args.output {
        eprintln!("exported {} event(s) to {}", out.lines, path.display());
    }
    Ok(())
}

/// Counts the lines (one event each) of the replay file as it is written.
struct LineCounter<W> {
    inner: W,
    lines: usize,
}

impl<W: std::io::Write> std::io::Write for LineCounter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.lines += buf[..n].iter().filter(|b| **b == b'\n').count();
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
