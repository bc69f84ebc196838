//! `webhook-inbox events purge`: the retention purge on demand, through `POST /events/purge`.

use std::path::Path;

use clap::Args;
use serde_json::{Map, Value, json};

use super::client::{ApiClient, CliError, Remote};
use crate::domain::time::{now_ms, rfc3339};

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Purge completed events that completed more than this long ago: `7d`, `12h`, `30m`,
    /// `90s` (`0s`: every completed event). Default: `[retention] completed_days`.
    #[arg(long, value_parser = parse_age, value_name = "AGE")]
    completed_before: Option<i64>,
    /// The same for failed events. Default: `[retention] failed_days`.
    #[arg(long, value_parser = parse_age, value_name = "AGE")]
    failed_before: Option<i64>,
    /// At most this many events per request (default: what the server purges in about 5 s).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    per_call: Option<u64>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// An age in milliseconds: a whole number and a unit (s, m, h, d).
fn parse_age(text: &str) -> Result<i64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` needs a unit: s, m, h or d (e.g. 7d)"))?;
    let (number, unit) = text.split_at(split);
    let n: i64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a whole number"))?;
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("`{unit}` is not a unit: s, m, h or d")),
    };
    n.checked_mul(unit_ms)
        .filter(|ms| *ms <= 100 * 365 * 86_400_000)
        .ok_or_else(|| format!("`{text}` is more than a century"))
}

/// Calls the route until the walk is complete: one call stops after a few seconds (or
/// `--per-call` events) and names where to go on, with the same times, so a large first purge
/// never meets the client's timeout. Progress goes to stderr after each call that left more.
pub fn run(config: Option<&Path>, args: PurgeArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.remote, config)?;
    let now = now_ms();
    let mut body = Map::new();
    for (key, age) in [
        ("completed_before", args.completed_before),
        ("failed_before", args.failed_before),
    ] {
        if let Some(age) = age {
            body.insert(key.into(), Value::String(rfc3339(now - age)));
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

#[cfg(test)]
mod tests {
    use super::parse_age;

    #[test]
    fn ages_take_a_whole_number_and_a_unit() {
        assert_eq!(parse_age("0s"), Ok(0));
        assert_eq!(parse_age("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_age("12h"), Ok(12 * 3_600_000));
        for bad in ["7", "d", "7w", "-1d", "1.5d", "99999999999d", ""] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
