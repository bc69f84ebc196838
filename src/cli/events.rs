//! `webhook-inbox events list|show|retry|export`: ops from a terminal or a script, over the
//! HTTP API. `--json` prints the API's answer for scripts.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Api, ApiClient, RESOLUTION_HELP, Remote, pages, segment};
use super::purge;
use super::retry::{self, RetryArgs};
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
    /// Skip one subscription's state of an event (the failed event that holds its key in an
    /// ordered subscription): completed as `skipped`, and the key goes on.
    #[command(after_help = RESOLUTION_HELP)]
    Skip(SkipArgs),
    /// Write matching events as a replay file (JSON lines) for `webhook-inbox replay`.
    #[command(after_help = RESOLUTION_HELP)]
    Export(ExportArgs),
    /// Purge terminal events past an age now (bodies and history go, tombstones stay).
    Purge(purge::PurgeArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct FilterArgs {
    /// `purged`: tombstones only (otherwise they are left out).
    #[arg(long, value_parser = ["pending", "claimed", "completed", "failed", "stored", "purged"])]
    status: Option<String>,
    /// Only events this subscription takes; `--status` is then its state of each.
    #[arg(long)]
    subscription: Option<String>,
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
            ("subscription", &self.subscription),
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
    /// Show this subscription's state of the event (status, outcome, last error, its
    /// attempts) instead of the event's summary.
    #[arg(long)]
    subscription: Option<String>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Debug, Args)]
pub struct SkipArgs {
    source: String,
    event_id: String,
    /// The ordered subscription whose state is skipped.
    #[arg(long)]
    subscription: String,
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

pub fn run(api: &Api, command: EventsCommand) -> anyhow::Result<()> {
    match command {
        EventsCommand::List(args) => list(api, args),
        EventsCommand::Show(args) => show(api, args),
        EventsCommand::Retry(args) => retry::run(api, args),
        EventsCommand::Skip(args) => skip(api, args),
        EventsCommand::Export(args) => export(api, args),
        EventsCommand::Purge(args) => purge::run(api, args),
    }
}

fn list(api: &Api, args: ListArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
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
    // With a subscription, each row is its state of the event, not the event's summary.
    let subscription = args.filter.subscription.as_deref();
    // Failed events without one: which subscriptions failed them.
    let failed_in = subscription.is_none() && args.filter.status.as_deref() == Some("failed");
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let state = subscription.map_or(e, |name| state_of(e, name));
            let mut row = vec![
                text(&e["source"]),
                text(&e["event_id"]),
                text(&e["type"]),
                text(&state["status"]),
                text(&state["attempts"]),
                text(&e["received_at"]),
            ];
            if failed_in {
                row.push(names_with(e, "failed"));
            }
            row.push(clip(&said(state), 60));
            row
        })
        .collect();
    let mut heads = vec![
        "SOURCE", "EVENT_ID", "TYPE", "STATUS", "ATTEMPTS", "RECEIVED",
    ];
    if failed_in {
        heads.push("SUBSCRIPTIONS");
    }
    heads.push("OUTCOME/ERROR");
    if let Some(name) = subscription {
        println!("subscription {name}: its state of each event");
    }
    print!("{}", render(&heads, &rows));
    if let Value::String(cursor) = &next {
        eprintln!("more events: add --cursor {cursor} for the next page, or --all");
    }
    Ok(())
}

/// An event's state in one subscription (null fields when it has none).
fn state_of<'a>(event: &'a Value, name: &str) -> &'a Value {
    static NONE: Value = Value::Null;
    event["subscriptions"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["name"] == name))
        .unwrap_or(&NONE)
}

/// The subscriptions whose state of the event has this status, comma-separated.
fn names_with(event: &Value, status: &str) -> String {
    event["subscriptions"]
        .as_array()
        .map(|subs| {
            subs.iter()
                .filter(|s| s["status"] == status)
                .map(|s| text(&s["name"]))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// What a state says: its outcome once completed, else its last error (a pending state that
/// is retrying has one too), else its outcome.
fn said(state: &Value) -> String {
    if state["status"] != "completed" && !state["last_error"].is_null() {
        text(&state["last_error"])
    } else {
        text(&state["outcome"])
    }
}

fn skip(api: &Api, args: SkipArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let path = format!(
        "/events/{}/{}/skip",
        segment(&args.source),
        segment(&args.event_id)
    );
    client.post(&path, &[("subscription", args.subscription.clone())], None)?;
    println!(
        "{}/{} skipped in {}: the later events of its key go on",
        args.source, args.event_id, args.subscription
    );
    Ok(())
}

fn show(api: &Api, args: ShowArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
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
    if let Some(name) = &args.subscription {
        return show_in(&e, name);
    }
    if e["purged"] == true {
        // A tombstone: no body and no history any more, and the answer says so.
        print_fields(
            &e,
            &[
                "source",
                "event_id",
                "type",
                "status",
                "outcome",
                "received_at",
                "completed_at",
                "purged_at",
                "payload_sha256",
            ],
        );
        println!(
            "\npurged by retention: its body and attempt history are gone; the tombstone keeps \
             its key (a redelivery is still a duplicate) and its body's SHA-256 above"
        );
        return Ok(());
    }
    print_fields(
        &e,
        &[
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
        ],
    );
    let subscriptions: Vec<Vec<String>> = e["subscriptions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            vec![
                text(&s["name"]),
                text(&s["status"]),
                text(&s["attempts"]),
                clip(&said(s), 60),
            ]
        })
        .collect();
    println!(
        "\nsubscriptions:\n{}",
        render(
            &["SUBSCRIPTION", "STATUS", "ATTEMPTS", "OUTCOME/ERROR"],
            &subscriptions
        )
    );
    println!(
        "\npayload:\n{}",
        serde_json::to_string_pretty(&e["payload"])?
    );
    print_history(&e, None);
    Ok(())
}

/// `events show --subscription NAME`: that subscription's state of the event, and its attempts.
fn show_in(e: &Value, name: &str) -> anyhow::Result<()> {
    let state = state_of(e, name);
    if state.is_null() {
        return Err(super::client::CliError::Refused(format!(
            "{}/{} has no state in subscription `{name}` (its route does not take it, or no such \
             subscription); its subscriptions: {}",
            text(&e["source"]),
            text(&e["event_id"]),
            e["subscriptions"]
                .as_array()
                .map(|s| s
                    .iter()
                    .map(|s| text(&s["name"]))
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ))
        .into());
    }
    print_fields(e, &["source", "event_id", "type"]);
    println!("{:<19} {name}", "subscription");
    print_fields(
        state,
        &[
            "status",
            "outcome",
            "last_error",
            "attempts",
            "next_attempt_at",
            "completed_at",
            "abandoned",
        ],
    );
    print_history(e, Some(name));
    Ok(())
}

/// The attempt history, of one subscription or of all.
fn print_history(e: &Value, only: Option<&str>) {
    let history: Vec<Vec<String>> = e["history"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|a| only.is_none_or(|name| a["subscription"] == name))
        .map(|a| {
            [
                "subscription",
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
            &[
                "SUBSCRIPTION",
                "#",
                "WORKER",
                "STARTED",
                "FINISHED",
                "RESULT",
                "ERROR"
            ],
            &history
        )
    );
}

fn export(api: &Api, args: ExportArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
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

/// `key  value` lines, the keys aligned.
fn print_fields(e: &Value, keys: &[&str]) {
    for key in keys {
        println!("{key:<19} {}", text(&e[*key]));
    }
}
