//! The retention purge (SPEC section 12), as on SQLite: terminal events past their age lose
//! their body and history and keep their row as a tombstone.
//!
//! Candidates are found a window of `seq` at a time in one short transaction; the write
//! transaction then checks each again (still terminal, not purged, still past its age), so a
//! retry or a redelivery that commits between the two is never lost. The space deleted rows
//! held comes back through autovacuum (reused by later rows; the files do not shrink).

use super::session::Db;
use crate::domain::RESERVED_SOURCE;
use crate::store::{LifecycleCounts, PurgeCutoffs, StoreResult};

/// Rows examined per read (one window of the `seq` walk).
const WINDOW: i64 = 2000;

/// When an event became terminal: a completed event's `completed_at`; a failed one's last
/// attempt end; the last delivery as a floor should an event have failed with no attempt row.
const FINISHED_AT: &str = "CASE WHEN e.status = 'completed' THEN e.completed_at
      WHEN e.status = 'failed' THEN coalesce(
          (SELECT max(finished_at) FROM event_attempts WHERE event_seq = e.seq),
          e.last_delivered_at)
  END";

/// The purge condition, with `c` and `f` the cutoffs (NULL: that kind is kept).
fn due_condition(c: &str, f: &str) -> String {
    format!(
        "e.purged_at IS NULL AND (
           (e.status = 'completed' AND {c}::bigint IS NOT NULL AND e.completed_at < {c})
        OR (e.status = 'failed' AND {f}::bigint IS NOT NULL AND ({FINISHED_AT}) < {f}))
        AND NOT EXISTS (SELECT 1 FROM event_state x WHERE x.seq = e.seq
                         AND x.status IN ('pending', 'claimed'))"
    )
}

/// Candidates among the `WINDOW` events after `after`, at most `limit`; and the last `seq`
/// examined (`None`: the window reached the newest event).
pub(super) fn candidates(
    db: &mut Db<'_>,
    cutoffs: &PurgeCutoffs,
    after: i64,
    limit: usize,
) -> StoreResult<(Vec<i64>, Option<i64>)> {
    let window = db.query_one(
        "SELECT max(seq), count(*), min(received_at) FROM (
           SELECT seq, received_at FROM event_log WHERE seq > $1 ORDER BY seq LIMIT $2) w",
        &[&after, &WINDOW],
    )?;
    let (last, count): (Option<i64>, i64) = (window.try_get(0)?, window.try_get(1)?);
    if cutoffs.after_every_cutoff(window.try_get(2)?) {
        return Ok((Vec::new(), None));
    }
    let window_end = last.filter(|_| count == WINDOW);
    let sql = format!(
        "SELECT e.seq FROM events e
          WHERE e.seq > $1 AND e.seq <= coalesce($2, 9223372036854775807)
            AND {} ORDER BY e.seq LIMIT $5",
        due_condition("$3", "$4")
    );
    let limit_i = i64::try_from(limit).unwrap_or(i64::MAX);
    let seqs = db
        .query(
            &sql,
            &[
                &after,
                &window_end,
                &cutoffs.completed_before,
                &cutoffs.failed_before,
                &limit_i,
            ],
        )?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<Vec<i64>, _>>()?;
    // A full batch may leave candidates in the window: the next batch starts after it.
    let next = if seqs.len() == limit {
        seqs.last().copied()
    } else {
        window_end
    };
    Ok((seqs, next))
}

/// See `Store::tombstones_through`. A `seq` is taken before its insert commits, so one below
/// the newest committed can still appear: only up to the fan-out's cursor is every `seq`
/// committed or given up (see `fan_out::fan_out_limit`).
pub(super) fn tombstones_through(db: &mut Db<'_>, after: i64, through: i64) -> StoreResult<bool> {
    Ok(db
        .query_one(
            "SELECT $2 <= (SELECT after_seq FROM queue_cursor WHERE id = 0)
                AND NOT EXISTS (SELECT 1 FROM event_payloads WHERE seq > $1 AND seq <= $2)",
            &[&after, &through],
        )?
        .try_get(0)?)
}

/// Make tombstones of `seqs`, each checked again in this transaction; returns how many.
pub(super) fn purge(
    db: &mut Db<'_>,
    cutoffs: &PurgeCutoffs,
    seqs: &[i64],
    now: i64,
) -> StoreResult<usize> {
    // Every state of these events locked first: a retry of one subscription's state cannot
    // commit between the check below and the purge (a read in this transaction's next
    // statement sees every commit before the locks).
    // The log rows too: a backfill that hands one of these events to a subscription holds it
    // `FOR KEY SHARE` until it commits.
    db.execute(
        "SELECT 1 FROM event_log WHERE seq = ANY($1) ORDER BY seq FOR UPDATE",
        &[&seqs],
    )?;
    db.execute(
        "SELECT 1 FROM event_state WHERE seq = ANY($1) ORDER BY seq, sub FOR UPDATE",
        &[&seqs],
    )?;
    let sql = format!(
        "WITH due AS (
            SELECT e.seq, e.source, e.event_id, {FINISHED_AT} AS finished FROM events e
             WHERE e.seq = ANY($1) AND {}
         ), marked AS (
            UPDATE event_state AS s SET purged_at = $4, finished_at = due.finished
              FROM due WHERE s.seq = due.seq AND s.status IN ('completed', 'failed')
            RETURNING s.seq
         ), bodies AS (
            DELETE FROM event_payloads WHERE seq IN (SELECT seq FROM due)
         ), history AS (
            DELETE FROM event_attempts WHERE event_seq IN (SELECT seq FROM due)
         ), documents AS (
            -- A submission's body is its request's documents: they go with it (the request
            -- row stays, as its event stays as a tombstone).
            DELETE FROM request_documents WHERE request_id IN
                (SELECT event_id FROM due WHERE source = '{RESERVED_SOURCE}')
         )
         SELECT count(*) FROM due",
        due_condition("$2", "$3")
    );
    let purged: i64 = db
        .query_one(
            &sql,
            &[
                &seqs,
                &cutoffs.completed_before,
                &cutoffs.failed_before,
                &now,
            ],
        )?
        .try_get(0)?;
    Ok(purged as usize)
}

/// Tombstones, and the database's size on disk. PostgreSQL does not report reusable space
/// cheaply (that takes `pgstattuple`), so `free_bytes` is 0.
pub(super) fn counts(db: &mut Db<'_>) -> StoreResult<LifecycleCounts> {
    let r = db.query_one(
        "SELECT (SELECT count(DISTINCT seq) FROM event_state WHERE purged_at IS NOT NULL),
                pg_database_size(current_database())",
        &[],
    )?;
    Ok(LifecycleCounts {
        tombstones: r.try_get(0)?,
        database_bytes: r.try_get(1)?,
        free_bytes: 0,
    })
}
