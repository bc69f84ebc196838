//! `webhook-inbox subscriptions list|pause|resume|backfill|recover|create|update|delete|secret|
//! rotate-secret`: the user's consumers (SPEC section 13), through the HTTP API.

use clap::{Args, Subcommand};
use serde_json::Value;

use super::client::{Api, ApiClient, RESOLUTION_HELP, Remote, segment};
use super::table::{render, text};
use super::when::parse_when;

#[derive(Debug, Subcommand)]
pub enum SubscriptionsCommand {
    /// Each subscription: kind, route, state, counts by status and lag.
    #[command(after_help = RESOLUTION_HELP)]
    List(ListArgs),
    /// Claim nothing for a subscription until it is resumed (its events wait).
    #[command(after_help = RESOLUTION_HELP)]
    Pause(NameArgs),
    /// Claim a paused subscription's events again.
    #[command(after_help = RESOLUTION_HELP)]
    Resume(NameArgs),
    /// Hand a subscription the events stored before it was added (since a time).
    #[command(after_help = RESOLUTION_HELP)]
    Backfill(SinceArgs),
    /// After an endpoint's outage: retry every failed state of a subscription whose last
    /// attempt ended since a time.
    #[command(after_help = RESOLUTION_HELP)]
    Recover(SinceArgs),
    /// Add a subscription (origin `api`): the fields of a config's table, as flags.
    #[command(after_help = RESOLUTION_HELP)]
    Create(super::subscription_changes::CreateArgs),
    /// Change the fields given of a subscription (not its name or kind).
    #[command(after_help = RESOLUTION_HELP)]
    Update(super::subscription_changes::UpdateArgs),
    /// Remove a subscription: its unfinished states are finished, its history kept.
    #[command(after_help = RESOLUTION_HELP)]
    Delete(super::subscription_changes::DeleteArgs),
    /// Whether a subscription's filter takes a stored event, and what it would deliver
    /// (nothing changes).
    #[command(after_help = RESOLUTION_HELP)]
    Preview(super::subscription_changes::PreviewArgs),
    /// The signing secrets of an `http` subscription, current first (for its receiver).
    #[command(after_help = RESOLUTION_HELP)]
    Secret(super::secrets::SecretArgs),
    /// A new secret for a subscription (a signing secret, or a pull token shown once); the
    /// old one keeps working beside it for the grace.
    #[command(after_help = RESOLUTION_HELP)]
    RotateSecret(super::secrets::RotateArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    name: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Debug, Args)]
pub struct SinceArgs {
    name: String,
    /// An RFC 3339 time or an age back from now (`7d`): for backfill, events first received
    /// since then; for recover, states whose last attempt ended since then.
    #[arg(long, value_parser = parse_when, value_name = "TIME|AGE")]
    since: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

pub fn run(api: &Api, command: SubscriptionsCommand) -> anyhow::Result<()> {
    match command {
        SubscriptionsCommand::List(args) => {
            let client = ApiClient::new(api, &args.remote)?;
            let answer = client.get("/subscriptions", &[])?;
            if args.json {
                println!("{answer}");
            } else {
                let subs = answer["subscriptions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                print_table(&subs);
            }
            Ok(())
        }
        SubscriptionsCommand::Pause(args) => change(api, args, "pause"),
        SubscriptionsCommand::Resume(args) => change(api, args, "resume"),
        SubscriptionsCommand::Backfill(args) => since_route(
            api,
            &args,
            "backfill",
            "backfilled",
            "handed {} event(s) received since",
        ),
        SubscriptionsCommand::Recover(args) => since_route(
            api,
            &args,
            "recover",
            "retried",
            "retried {} failed state(s) that failed since",
        ),
        SubscriptionsCommand::Create(args) => super::subscription_changes::create(api, args),
        SubscriptionsCommand::Update(args) => super::subscription_changes::update(api, args),
        SubscriptionsCommand::Delete(args) => super::subscription_changes::delete(api, args),
        SubscriptionsCommand::Preview(args) => super::subscription_changes::preview(api, args),
        SubscriptionsCommand::Secret(args) => super::secrets::show(api, args),
        SubscriptionsCommand::RotateSecret(args) => super::secrets::rotate(api, args),
    }
}

fn change(api: &Api, args: NameArgs, action: &str) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let path = format!("/subscriptions/{}/{action}", segment(&args.name));
    let answer = client.post(&path, &[], None)?;
    if args.json {
        println!("{answer}");
    } else {
        print_table(std::slice::from_ref(&answer));
    }
    Ok(())
}

/// A route as one short text: `stripe: invoice.*, charge.refunded`.
fn route(r: &Value) -> String {
    let list = |v: &Value, all: &str| match v.as_array() {
        Some(items) => items.iter().map(text).collect::<Vec<_>>().join(", "),
        None => all.to_string(),
    };
    let mut out = format!("{}: {}", list(&r["sources"], "*"), list(&r["types"], "*"));
    if let Some(except) = r["except_types"].as_array() {
        let except: Vec<String> = except.iter().map(text).collect();
        out.push_str(&format!(" except {}", except.join(", ")));
    }
    out
}

fn print_table(subs: &[Value]) {
    let rows: Vec<Vec<String>> = subs
        .iter()
        .map(|s| {
            let c = &s["counts"];
            vec![
                text(&s["name"]),
                text(&s["kind"]),
                text(&s["state"]),
                text(&c["pending"]),
                text(&c["claimed"]),
                text(&c["completed"]),
                text(&c["failed"]),
                text(&s["lag"]),
                route(&s["route"]),
            ]
        })
        .collect();
    print!(
        "{}",
        render(
            &[
                "NAME",
                "KIND",
                "STATE",
                "PENDING",
                "CLAIMED",
                "COMPLETED",
                "FAILED",
                "LAG",
                "ROUTE"
            ],
            &rows
        )
    );
}

/// `POST /subscriptions/NAME/ROUTE?since=…` (backfill, recover), and its count said with
/// `said` (whose `{}` is the answer's `field`).
fn since_route(
    api: &Api,
    args: &SinceArgs,
    route: &str,
    field: &str,
    said: &str,
) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let path = format!("/subscriptions/{}/{route}", segment(&args.name));
    let answer = client.post(&path, &[("since", args.since.clone())], None)?;
    if args.json {
        println!("{answer}");
    } else {
        let said = said.replacen("{}", &text(&answer[field]), 1);
        println!("{}: {said} {}", args.name, args.since);
    }
    Ok(())
}
