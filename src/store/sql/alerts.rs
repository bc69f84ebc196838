//! The alerts' reads, on either store (their writes, where several nodes meet, stay per
//! store): what is active, what each subscription looks like to the rules, and the counts by
//! window.

use super::{Conn, Dialect, Value};
use crate::store::StoreResult;
use crate::store::alerts::{ActiveAlert, AlertSubject, FAILED_SINCE, SUBJECTS};

pub fn active_alerts<C: Conn>(conn: &mut C) -> StoreResult<Vec<ActiveAlert>> {
    conn.query(
        &format!(
            "SELECT alert, episode, started_at, coalesce(figure, '') FROM alert_state
              WHERE active <> {} ORDER BY alert",
            C::Dialect::NONE
        ),
        &[],
    )?
    .iter()
    .map(|r| {
        Ok(ActiveAlert {
            alert: r.text(0)?,
            episode: r.int(1)?,
            since: r.int(2)?,
            figure: r.text(3)?,
        })
    })
    .collect()
}

pub fn subjects<C: Conn>(conn: &mut C) -> StoreResult<Vec<AlertSubject>> {
    // The first event not fanned out yet: a range of the log's key from the cursor.
    let unrouted = conn
        .query_opt(
            &format!(
                "SELECT received_at FROM event_log WHERE lane = 0 AND seq > {}
                  ORDER BY seq LIMIT 1",
                super::CURSOR
            ),
            &[],
        )?
        .map(|r| r.int(0))
        .transpose()?;
    conn.query(SUBJECTS, &[])?
        .iter()
        .map(|r| {
            Ok(AlertSubject {
                name: r.text(0)?,
                kind: r.text(1)?,
                origin: r.text(2)?,
                paused: r.bool(3)?,
                probe_at: r.opt_int(4)?,
                oldest_due_at: r.opt_int(5)?,
            }
            .with_unrouted(unrouted))
        })
        .collect()
}

pub fn failed_since(conn: &mut impl Conn, since: i64) -> StoreResult<Vec<(String, i64)>> {
    counts(conn, FAILED_SINCE, since)
}

pub fn rejected_since(conn: &mut impl Conn, since: i64) -> StoreResult<Vec<(String, i64)>> {
    counts(
        conn,
        "SELECT source, count(*) FROM rejections WHERE received_at >= ?1
          GROUP BY source ORDER BY source",
        since,
    )
}

fn counts(conn: &mut impl Conn, sql: &str, since: i64) -> StoreResult<Vec<(String, i64)>> {
    conn.query(sql, &[Value::Int(since)])?
        .iter()
        .map(|r| Ok((r.text(0)?, r.int(1)?)))
        .collect()
}
