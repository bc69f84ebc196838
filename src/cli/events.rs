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
use super::show::{self, names_with, said, state_of};
use super::table::{clip, render, text};
use super::when::parse_when;

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List events, newest first.
    #[command(after_help = RESOLUTION_HELP)]
    List(ListArgs),
    /// One event with its payload (as received) and attempt history.
    #[command(after_help = RESOLUTION_HELP)]
    Show(show::ShowArgs),
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
        EventsCommand::Show(args) => show::show(api, args),
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
