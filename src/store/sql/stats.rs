//! The counts `/metrics` reads, and the overview's (`GET /events/stats`), written once for
//! both stores: the subscriptions' states by status, the events by summary status and the
//! events received per minute.

use super::{Conn, Dialect, Value};
use crate::store::{StatusCounts, StoreResult};

const MINUTE_MS: i64 = 60_000;
const MINUTES_AT_MOST: usize = 24 * 60;

/// The counts `/metrics` reports, as subscription states (an event taken by two subscriptions
/// counts in each), from the store's [`Dialect::STATUS_COUNTS`] (one statement: one snapshot).
/// The events not fanned out yet are pending in every subscription that will take them,
/// counted once; `completed` is the rest of every state; a `listen` session's pending states
/// are its own, not the node's backlog.
pub fn status_counts<C: Conn>(conn: &mut C) -> StoreResult<StatusCounts> {
    let r = conn.query_one(C::Dialect::STATUS_COUNTS, &[])?;
    let (states, pending, waiting) = (r.int(0)?, r.int(1)?, r.int(2)?);
    let (claimed, failed, session_pending) = (r.int(3)?, r.int(4)?, r.int(6)?);
    Ok(StatusCounts {
        pending: pending - session_pending + waiting,
        claimed,
        completed: states - pending - claimed - failed,
        failed,
        oldest_due_at: r.opt_int(5)?,
        fan_out_waiting: waiting,
    })
}

/// Events by summary status, the same SQL on both stores: an event counts once, as failed if
/// any live subscription's state of it failed, else claimed if any is claimed, else pending if
/// any is pending, else completed (the `events` view's rule). Failures, claims and pending
/// states are read where their partial indexes hold them; `completed` is the rest of the
/// events that have a live state, one ordered walk of the state table's key (what
/// `status_counts` pays already for its `count(*)`), which looks a state's subscription up only
/// while some subscription is removed. A state pending for a `listen` session (origin
/// `session`) makes no event pending here: it is pending for that session only (the
/// subscription is joined already; its claims and failures count as any other's).
///
/// The dialect names an index for SQLite (`INDEXED BY …`; nothing for PostgreSQL): for a
/// `count(DISTINCT s.seq)` SQLite's planner preferred the state table's key, already in `seq`
/// order, to the small partial index of claimed or pending states, and looked every state up
/// in the table to test its status: 485 ms of the 551 this statement took at 800,000 completed
/// states (82 ms with the indexes named; issue 60, docs/performance.md).
pub fn event_counts_sql<D: Dialect>() -> String {
    let (leases, due) = (D::indexed_by("events_leases"), D::indexed_by("events_due"));
    format!(
        "SELECT
    (CASE WHEN EXISTS (SELECT 1 FROM subscriptions WHERE removed_at IS NOT NULL)
          THEN (SELECT count(DISTINCT seq) FROM event_state
                 WHERE sub IN (SELECT id FROM subscriptions WHERE removed_at IS NULL))
          ELSE (SELECT count(DISTINCT seq) FROM event_state) END),
    (SELECT count(DISTINCT s.seq) FROM event_state s JOIN subscriptions u ON u.id = s.sub
      WHERE s.status = 'failed' AND u.removed_at IS NULL),
    (SELECT count(DISTINCT s.seq) FROM event_state s {leases} JOIN subscriptions u ON u.id = s.sub
      WHERE s.status = 'claimed' AND u.removed_at IS NULL
        AND NOT EXISTS (SELECT 1 FROM event_state f JOIN subscriptions v ON v.id = f.sub
                         WHERE f.seq = s.seq AND f.status = 'failed' AND v.removed_at IS NULL)),
    (SELECT count(DISTINCT s.seq) FROM event_state s {due} JOIN subscriptions u ON u.id = s.sub
      WHERE s.status = 'pending' AND u.removed_at IS NULL AND u.origin <> 'session'
        AND NOT EXISTS (SELECT 1 FROM event_state f JOIN subscriptions v ON v.id = f.sub
                         WHERE f.seq = s.seq AND f.status IN ('failed', 'claimed')
                           AND v.removed_at IS NULL))"
    )
}

/// The four numbers of [`event_counts_sql`] as counts.
pub fn event_counts_of(taken: i64, failed: i64, claimed: i64, pending: i64) -> StatusCounts {
    StatusCounts {
        pending,
        claimed,
        completed: taken - failed - claimed - pending,
        failed,
        oldest_due_at: None,
        fan_out_waiting: 0,
    }
}

/// Events received per minute from `since` (a minute's start), oldest first, minutes with
/// none left out.
///
/// `seq` is assigned in the transaction that stamps `received_at`, so the two orders agree
/// (unless the server's clock stepped back: then a chart is a little off at the step). Each
/// minute's first event is found by a binary search on `seq`, and each minute is counted by
/// one range count inside the store. Walking the window's events one row at a time cost about
/// a second per poll with 800,000 events received in the last hour (a bench's backlog), held a
/// read open that long, and slowed a drain watched through this route to two thirds
/// (docs/performance.md, issue 60).
pub fn received_per_minute(conn: &mut impl Conn, since: i64) -> StoreResult<Vec<(i64, i64)>> {
    let range = conn.query("SELECT min(seq), max(seq) FROM event_log", &[])?;
    let (Some(low), Some(high)) = (range[0].opt_int(0)?, range[0].opt_int(1)?) else {
        return Ok(Vec::new());
    };
    let last = conn.query(
        "SELECT received_at FROM event_log WHERE seq = ?1",
        &[Value::Int(high)],
    )?;
    let newest = last.first().map(|r| r.int(0)).transpose()?.unwrap_or(since);
    let mut minutes = Vec::new();
    let mut start = first_received_from(conn, since, low, high)?;
    let mut minute = since;
    // A day of minutes at most: the overview asks for an hour.
    for _ in 0..MINUTES_AT_MOST {
        if minute > newest || start > high {
            break;
        }
        let end = first_received_from(conn, minute + MINUTE_MS, start, high)?;
        if end > start {
            let count = conn.query(
                "SELECT count(*) FROM event_log WHERE seq >= ?1 AND seq < ?2",
                &[Value::Int(start), Value::Int(end)],
            )?;
            let count = count[0].int(0)?;
            if count > 0 {
                minutes.push((minute, count));
            }
        }
        start = end;
        minute += MINUTE_MS;
    }
    Ok(minutes)
}

/// The position of the first event received at or after `at` among the events of `seq` in
/// `low..=high`: a `seq` to count from (`high + 1` when none is). `seq` may have gaps (purged
/// events), so each probe reads the first event at or after it.
fn first_received_from(conn: &mut impl Conn, at: i64, low: i64, high: i64) -> StoreResult<i64> {
    let (mut from, mut to) = (low, high + 1);
    // At most 64 halvings of an i64 range: the bound only guards against a loop.
    for _ in 0..64 {
        if from >= to {
            break;
        }
        let middle = from + (to - from) / 2;
        let found = conn.query(
            "SELECT seq, received_at FROM event_log WHERE seq >= ?1 ORDER BY seq LIMIT 1",
            &[Value::Int(middle)],
        )?;
        match found.first() {
            Some(row) if row.int(1)? < at => from = row.int(0)? + 1,
            _ => to = middle,
        }
    }
    Ok(from)
}
