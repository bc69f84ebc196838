//! A subscription's circuit breaker opened and closed, on either store (its claim, which reads
//! the gate beside the hot path's claim, stays per store).

use super::{Conn, Dialect, Value};
use crate::store::StoreResult;
use crate::subscriptions::HttpSettings;

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

/// Whether subscription `sub` still delivers by `settings` (compared as settings, not as text:
/// a row written by an older build may spell the same settings otherwise), its row locked where
/// the store locks rows, so that a change cannot commit between this and the write. A row
/// without settings that parse says nothing against them.
pub fn delivers_by<C: Conn>(conn: &mut C, sub: i64, settings: &HttpSettings) -> StoreResult<bool> {
    let sql = format!(
        "SELECT settings FROM subscriptions WHERE id = ?1 {}",
        C::Dialect::lock("subscriptions")
    );
    let column = conn
        .query(&sql, &[Value::Int(sub)])?
        .into_iter()
        .next()
        .map(|row| row.opt_text(0))
        .transpose()?
        .flatten();
    Ok(HttpSettings::parse(column.as_deref()).is_none_or(|now| now == *settings))
}

/// A probe given back untried: the next one is due now (see
/// [`crate::store::Store::give_back_probe`]).
pub fn probe_now(conn: &mut impl Conn, sub: i64, now: i64) -> StoreResult<()> {
    conn.execute(
        "UPDATE subscriptions SET probe_at = ?2 WHERE id = ?1 AND probe_at > ?2",
        &[Value::Int(sub), Value::Int(now)],
    )?;
    Ok(())
}

/// A 410 from the endpoint at `settings`: pause subscription `sub`, only while it still
/// delivers there (a late answer of the target a change replaced pauses nothing). Whether it
/// paused it.
pub fn pause_gone<C: Conn>(conn: &mut C, sub: i64, settings: &HttpSettings) -> StoreResult<bool> {
    if !delivers_by(conn, sub, settings)? {
        return Ok(false);
    }
    Ok(conn.execute(
        "UPDATE subscriptions SET paused = ?2 WHERE id = ?1 AND removed_at IS NULL",
        &[Value::Int(sub), Value::Int(1)],
    )? == 1)
}
