//! Points in time on the command line: every flag that takes one (`--received-after`,
//! `--completed-before`, …) takes an RFC 3339 time or an age back from now, the same way.

use crate::domain::time::{now_ms, parse_rfc3339, rfc3339};

/// An RFC 3339 time (`2026-11-30T00:00:00Z`) or an age back from now (`7d`, `12h`, `30m`,
/// `90s`; `0s` is now), as the RFC 3339 time the API takes.
pub fn parse_when(text: &str) -> Result<String, String> {
    if parse_rfc3339(text).is_some() {
        return Ok(text.to_string());
    }
    if text.starts_with(|c: char| c.is_ascii_digit()) && !text.contains(['-', ':', 'T']) {
        return parse_age(text).map(|age| rfc3339(now_ms() - age));
    }
    Err(format!(
        "`{text}` is neither an RFC 3339 time (2026-11-30T00:00:00Z) nor an age (7d, 12h, 30m, \
         90s)"
    ))
}

/// An age in milliseconds: a whole number and a unit (s, m, h, d).
pub fn parse_age(text: &str) -> Result<i64, String> {
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

#[cfg(test)]
mod tests {
    use super::{parse_age, parse_when};
    use crate::domain::time::{now_ms, parse_rfc3339};

    #[test]
    fn ages_take_a_whole_number_and_a_unit() {
        assert_eq!(parse_age("0s"), Ok(0));
        assert_eq!(parse_age("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_age("12h"), Ok(12 * 3_600_000));
        for bad in ["7", "d", "7w", "-1d", "1.5d", "99999999999d", ""] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_take_rfc_3339_or_an_age() {
        assert_eq!(
            parse_when("2026-11-30T00:00:00Z").unwrap(),
            "2026-11-30T00:00:00Z"
        );
        let hour_ago = parse_rfc3339(&parse_when("1h").unwrap()).unwrap();
        assert!((now_ms() - 3_600_000 - hour_ago).abs() < 60_000);
        for bad in ["yesterday", "2026-13-01", "1w", ""] {
            assert!(parse_when(bad).is_err(), "{bad}");
        }
    }
}
