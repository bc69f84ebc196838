//! `webhook-inbox events show`: one event with its payload and attempt history, or one
//! subscription's state of it (`--subscription`).

use clap::Args;
use serde_json::Value;

use super::client::{Api, ApiClient, CliError, Remote, segment};
use super::table::{clip, render, text};

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

/// An event's state in one subscription (null fields when it has none).
pub(super) fn state_of<'a>(event: &'a Value, name: &str) -> &'a Value {
    static NONE: Value = Value::Null;
    event["subscriptions"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["name"] == name))
        .unwrap_or(&NONE)
}

/// The subscriptions whose state of the event has this status, comma-separated.
pub(super) fn names_with(event: &Value, status: &str) -> String {
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
pub(super) fn said(state: &Value) -> String {
    if state["status"] != "completed" && !state["last_error"].is_null() {
        text(&state["last_error"])
    } else {
        text(&state["outcome"])
    }
}

pub(super) fn show(api: &Api, args: ShowArgs) -> anyhow::Result<()> {
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
        return Err(CliError::Refused(format!(
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

/// `key  value` lines, the keys aligned.
fn print_fields(e: &Value, keys: &[&str]) {
    for key in keys {
        println!("{key:<19} {}", text(&e[*key]));
    }
}
