//! `webhook-inbox rejections list`: deliveries refused at the edge, through `GET /rejections`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Api, ApiClient, RESOLUTION_HELP, Remote, pages};
use super::table::{clip, render, text};
use super::when::parse_when;

#[derive(Debug, Subcommand)]
pub enum RejectionsCommand {
    /// Refused deliveries, newest first: when, which source, why, from where.
    #[command(after_help = RESOLUTION_HELP)]
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only refusals for this source name.
    #[arg(long)]
    source: Option<String>,
    /// Only this reason (an error code, e.g. invalid_signature, unknown_source).
    #[arg(long)]
    reason: Option<String>,
    /// An RFC 3339 time or an age back from now (`1h`, `7d`).
    #[arg(long, value_parser = parse_when, value_name = "TIME|AGE")]
    received_after: Option<String>,
    #[arg(long, value_parser = parse_when, value_name = "TIME|AGE")]
    received_before: Option<String>,
    /// Refusals per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    limit: u32,
    /// Start after the page that printed this cursor.
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

pub fn run(api: &Api, command: RejectionsCommand) -> anyhow::Result<()> {
    match command {
        RejectionsCommand::List(args) => list(api, args),
    }
}

fn list(api: &Api, args: ListArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let mut query: Vec<(&str, String)> = [
        ("source", &args.source),
        ("reason", &args.reason),
        ("received_after", &args.received_after),
        ("received_before", &args.received_before),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
    .collect();
    query.push(("limit", args.limit.to_string()));
    let (rows, next) = pages(
        &client,
        "/rejections",
        &query,
        "rejections",
        args.cursor.clone(),
        args.all,
    )?;
    if args.json {
        println!("{}", json!({"rejections": rows, "next_cursor": next}));
        return Ok(());
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                text(&r["received_at"]),
                text(&r["source"]),
                text(&r["reason"]),
                text(&r["status"]),
                text(&r["peer"]),
                text(&r["body_bytes"]),
                clip(&text(&r["message"]), 60),
            ]
        })
        .collect();
    print!(
        "{}",
        render(
            &[
                "RECEIVED", "SOURCE", "REASON", "STATUS", "PEER", "BYTES", "MESSAGE"
            ],
            &table
        )
    );
    if let Value::String(cursor) = &next {
        eprintln!("more refusals: add --cursor {cursor} for the next page, or --all");
    }
    Ok(())
}
