//! Times are unix milliseconds in the store and RFC 3339 UTC at the edges.

use ::time::OffsetDateTime;
use ::time::format_description::well_known::Rfc3339;

/// Read from the clock as a duration since the epoch: `OffsetDateTime::now_utc` would work out
/// the calendar date only for it to be turned back into a number (twice per delivery).
fn since_epoch() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

pub fn now_ms() -> i64 {
    i64::try_from(since_epoch().as_millis()).unwrap_or(i64::MAX)
}

pub fn now_secs() -> i64 {
    i64::try_from(since_epoch().as_secs()).unwrap_or(i64::MAX)
}

/// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-30T05:00:00.123Z`.
pub fn rfc3339(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let t = t
        .replace_nanosecond((ms.rem_euclid(1000) as u32) * 1_000_000)
        .unwrap_or(t);
    t.format(&Rfc3339).unwrap_or_else(|_| ms.to_string())
}

/// Parse an RFC 3339 time (a filter value) to unix milliseconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    Some((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_reads_as_unix_time_in_both_units() {
        let before = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
        let (ms, secs) = (now_ms(), now_secs());
        let after = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
        assert!(
            (before..=after).contains(&i128::from(ms)),
            "{before} {ms} {after}"
        );
        assert!((ms / 1000..=ms / 1000 + 1).contains(&secs), "{ms} {secs}");
        assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms));
    }
}
