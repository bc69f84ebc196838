//! A subscription's circuit breaker opened and closed, on either store (its claim, which reads
//! the gate beside the hot path's claim, stays per store).

use super::{Conn, Dialect, Value};
use crate::store::StoreResult;

/// See [`crate::store::Store::open_breaker`]. A run of failures opens a closed breaker only (a
/// node that saw its own run after another node opened it changes nothing); a failed probe
/// doubles the wait, between `first_ms` and `max_ms`.
pub fn open<C: Conn>(
    conn: &mut C,
    sub: i64,
    after_probe: bool,
    first_ms: i64,
    max_ms: i64,
    now: i64,
) -> StoreResult<()> {
    if after_probe {
        let (least, greatest) = (C::Dialect::LEAST, C::Dialect::GREATEST);
        let wait = format!("{least}({greatest}(coalesce(probe_interval_ms, 0) * 2, ?2), ?3)");
        conn.execute(
            &format!(
                "UPDATE subscriptions SET probe_interval_ms = {wait}, probe_at = ?4 + {wait}
                  WHERE id = ?1"
            ),
            &[
                Value::Int(sub),
                Value::Int(first_ms),
                Value::Int(max_ms),
                Value::Int(now),
            ],
        )?;
    } else {
        let wait = first_ms.min(max_ms);
        conn.execute(
            "UPDATE subscriptions SET probe_interval_ms = ?2, probe_at = ?3
              WHERE id = ?1 AND probe_at IS NULL",
            &[
                Value::Int(sub),
                Value::Int(wait),
                Value::Int(now.saturating_add(wait)),
            ],
        )?;
    }
    Ok(())
}

pub fn close(conn: &mut impl Conn, sub: i64) -> StoreResult<()> {
    conn.execute(
        "UPDATE subscriptions SET probe_at = NULL, probe_interval_ms = NULL
          WHERE id = ?1 AND probe_at IS NOT NULL",
        &[Value::Int(sub)],
    )?;
    Ok(())
}
