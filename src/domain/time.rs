//! Times are unix milliseconds in the store and RFC 3339 UTC at the edges.

use ::time::OffsetDateTime;
use ::time::format_description::well_known::Rfc3339;

pub fn now_ms() -> i64 {
    let now = OffsetDateTime::now_utc();
    (now.unix_timestamp_nanos() / 1_000_000) as i64
}

pub fn now_secs() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
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
