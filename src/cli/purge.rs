//! `webhook-inbox events purge`: the retention purge on demand, through `POST /events/purge`.

use std::path::Path;

use clap::Args;
use serde_json::{Map, Value};

use super::client::{ApiClient, Remote};
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
    let answer = client.post("/events/purge", &[], Some(&Value::Object(body)))?;
    if args.json {
        println!("{answer}");
    } else {
        println!("purged {} events", answer["purged"]);
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
