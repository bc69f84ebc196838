//! The retention purge (SPEC section 12): terminal events past their age lose their body and
//! history and keep their row as a tombstone (see migration 0006).
//!
//! A batch is found by walking `seq` upwards a window at a time on a pooled read connection,
//! outside the write lock: finding candidates costs a window of rows whatever the table's
//! size, and never holds the writer. The write transaction then takes only the batch found,
//! and checks each event again inside it (still terminal, not purged, still past its age), so
//! a retry or a redelivery that commits between the read and the write is never lost. A
//! redelivery needs no check at all: it only counts itself on the row, which stays.

use rusqlite::{Connection, Transaction, params};

use super::SqliteStore;
use crate::store::sql::requests::REQUEST_SOURCE;
use crate::store::{LifecycleCounts, PurgeBatch, PurgeCutoffs, StoreResult};

/// Rows examined per read (one window of the `seq` walk).
const WINDOW: i64 = 2000;

/// When an event became terminal: a completed event's `completed_at`; a failed one's last
/// attempt end (a failure always ends a claimed attempt, in the same transaction); the last
/// delivery as a floor should an event have failed with no attempt row.
const FINISHED_AT: &str = "CASE WHEN e.status = 'completed' THEN e.completed_at
      WHEN e.status = 'failed' THEN coalesce(
          (SELECT max(finished_at) FROM event_attempts WHERE event_seq = e.seq),
          (SELECT last_delivered_at FROM event_log WHERE seq = e.seq))
  END";

/// The purge condition, with `?c` and `?f` the cutoffs (NULL: that kind is kept).
fn due_condition(c: &str, f: &str) -> String {
    format!(
        "e.purged_at IS NULL AND (
           (e.status = 'completed' AND {c} IS NOT NULL AND e.completed_at < {c})
        OR (e.status = 'failed' AND {f} IS NOT NULL AND ({FINISHED_AT}) < {f}))
        AND NOT EXISTS (SELECT 1 FROM event_state x WHERE x.seq = e.seq
                         AND (x.status = 'pending' OR x.status = 'claimed'))"
    )
}

pub(super) fn batch(
    store: &SqliteStore,
    cutoffs: &PurgeCutoffs,
    after: i64,
    limit: usize,
    now: i64,
) -> StoreResult<PurgeBatch> {
    let (seqs, next_after) = store.read(|c| candidates(c, cutoffs, after, limit))?;
    // Background work: it queues for the writer with the consumers, behind ingest.
    let purged = if seqs.is_empty() {
        0
    } else {
        store.consumer_write(|tx| purge(tx, cutoffs, &seqs, now))?
    };
    Ok(PurgeBatch { purged, next_after })
}

/// Candidates among the `WINDOW` events after `after`, at most `limit`; and the last `seq`
/// examined (`None`: the window reached the newest event).
fn candidates(
    conn: &Connection,
    cutoffs: &PurgeCutoffs,
    after: i64,
    limit: usize,
) -> StoreResult<(Vec<i64>, Option<i64>)> {
    let (window_end, oldest): (Option<i64>, Option<i64>) = conn
        .prepare_cached(
            "SELECT max(seq), count(*), min(received_at) FROM (
               SELECT seq, received_at FROM event_log WHERE seq > ?1 ORDER BY seq LIMIT ?2)",
        )?
        .query_row(params![after, WINDOW], |r| {
            let count: i64 = r.get(1)?;
            Ok((
                r.get::<_, Option<i64>>(0)?.filter(|_| count == WINDOW),
                r.get(2)?,
            ))
        })?;
    if cutoffs.after_every_cutoff(oldest) {
        return Ok((Vec::new(), None));
    }
    let sql = format!(
        "SELECT e.seq FROM events e WHERE e.seq > ?1 AND e.seq <= ifnull(?2, 9223372036854775807)
            AND {} ORDER BY e.seq LIMIT ?5",
        due_condition("?3", "?4")
    );
    let seqs: Vec<i64> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![
                after,
                window_end,
                cutoffs.completed_before,
                cutoffs.failed_before,
                limit as i64
            ],
            |r| r.get(0),
        )?
        .collect::<Result<_, _>>()?;
    // A full batch may leave candidates in the window: the next batch starts after it.
    let next = if seqs.len() == limit {
        seqs.last().copied()
    } else {
        window_end
    };
    Ok((seqs, next))
}

/// See `Store::tombstones_through`. One writer hands out every `seq`, in order: none can
/// appear below one already stored.
pub(super) fn tombstones_through(conn: &Connection, after: i64, through: i64) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT NOT EXISTS (SELECT 1 FROM event_log
                                 WHERE seq > ?1 AND seq <= ?2 AND payload IS NOT NULL)",
        )?
        .query_row(params![after, through], |r| r.get(0))?)
}

/// Make tombstones of `seqs`, each checked again in this transaction; returns how many. An
/// event is due when its summary is (every state of a live subscription terminal, past its
/// age): then each of its terminal states is marked.
fn purge(
    tx: &Transaction<'_>,
    cutoffs: &PurgeCutoffs,
    seqs: &[i64],
    now: i64,
) -> StoreResult<usize> {
    let sql = format!(
        "UPDATE event_state SET purged_at = ?4,
                finished_at = (SELECT {FINISHED_AT} FROM events e WHERE e.seq = ?1)
          WHERE seq = ?1 AND (status = 'completed' OR status = 'failed')
            AND EXISTS (SELECT 1 FROM events e WHERE e.seq = ?1 AND {})",
        due_condition("?2", "?3")
    );
    let mut mark = tx.prepare_cached(&sql)?;
    let mut body = tx.prepare_cached(
        "UPDATE event_log SET payload = NULL, content_type = NULL, traceparent = NULL
          WHERE seq = ?1",
    )?;
    let mut history = tx.prepare_cached("DELETE FROM event_attempts WHERE event_seq = ?1")?;
    // A submission's body is its request's documents (the event's own body only names the
    // request): they go with it. The request row stays, as its event stays as a tombstone.
    let mut documents = tx.prepare_cached(
        "DELETE FROM request_documents WHERE request_id =
           (SELECT event_id FROM event_log WHERE seq = ?1 AND source = ?2)",
    )?;
    let mut purged = 0;
    for &seq in seqs {
        let marked = mark.execute(params![
            seq,
            cutoffs.completed_before,
            cutoffs.failed_before,
            now
        ])?;
        if marked > 0 {
            body.execute([seq])?;
            history.execute([seq])?;
            documents.execute(params![seq, REQUEST_SOURCE])?;
            purged += 1;
        }
    }
    if purged > 0 {
        give_back_free_pages(tx)?;
    }
    Ok(purged)
}

/// With `auto_vacuum = INCREMENTAL` (set in the connection init, so on every database this
/// binary creates; SQLite ignores it once a table exists), the pages this
/// batch freed are moved to the end of the file and cut off at the next checkpoint; a batch
/// frees few pages, so this stays as short as the batch. A database created without it (before
/// this version) keeps its free pages on the freelist, reused before the file grows; a
/// `VACUUM` while the server is stopped switches it (docs/lifecycle.md).
pub(super) fn give_back_free_pages(tx: &Transaction<'_>) -> StoreResult<()> {
    let mode: i64 = tx.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    if mode == 2 {
        // Each step of this statement frees one page and yields a row: step it to the end
        // (run once, as `query_row` or `execute_batch` do, it freed nothing measurable).
        let mut stmt = tx.prepare_cached("PRAGMA incremental_vacuum")?;
        let mut pages = stmt.query([])?;
        while pages.next()?.is_some() {}
    }
    Ok(())
}

pub(super) fn counts(conn: &Connection) -> StoreResult<LifecycleCounts> {
    Ok(conn.query_row(
        "SELECT (SELECT count(DISTINCT seq) FROM event_state INDEXED BY events_purged
                  WHERE purged_at IS NOT NULL),
                (SELECT page_count FROM pragma_page_count) * (SELECT page_size FROM pragma_page_size),
                (SELECT freelist_count FROM pragma_freelist_count)
                  * (SELECT page_size FROM pragma_page_size)",
        [],
        |r| {
            Ok(LifecycleCounts {
                tombstones: r.get(0)?,
                database_bytes: r.get(1)?,
                free_bytes: r.get(2)?,
            })
        },
    )?)
}
