//! Reads for the ops dashboard's overview.

use rusqlite::Connection;

use crate::store::StoreResult;

const MINUTE_MS: i64 = 60_000;

/// Walks the events newest first by `seq` (the rowid, so no index is needed) and stops at the
/// first one received before `since`: the cost is the number of events of the window, not of
/// the table. `seq` is assigned in the same transaction that stamps `received_at`, so the two
/// orders agree unless the server's clock stepped back; then the count is cut short at the
/// step, which only shortens a chart.
pub(super) fn received_per_minute(conn: &Connection, since: i64) -> StoreResult<Vec<(i64, i64)>> {
    let mut stmt = conn.prepare_cached("SELECT received_at FROM event_log ORDER BY seq DESC")?;
    let mut rows = stmt.query([])?;
    let mut minutes: Vec<(i64, i64)> = Vec::new();
    while let Some(row) = rows.next()? {
        let received_at: i64 = row.get(0)?;
        if received_at < since {
            break;
        }
        let minute = received_at - received_at.rem_euclid(MINUTE_MS);
        match minutes.iter_mut().rev().find(|(m, _)| *m == minute) {
            Some((_, n)) => *n += 1,
            None => minutes.push((minute, 1)),
        }
    }
    minutes.sort_unstable();
    Ok(minutes)
}
