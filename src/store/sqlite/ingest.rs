//! Storing deliveries. The primary key is the dedup: `INSERT … ON CONFLICT DO NOTHING`, then
//! branch on the rows changed. There is no SELECT before the INSERT, so no interleaving of
//! concurrent deliveries can make two rows or two `queued` answers.

use std::sync::LazyLock;

use rusqlite::{Transaction, params};

use crate::store::{InsertOutcome, NewDelivery, StoreResult};

/// Insert every delivery of a group commit in the caller's transaction. Items are applied in
/// order, so a second copy of a key within the batch is a duplicate of the first.
///
/// New events and their bodies are written with multi-row `INSERT`s, a few statements per
/// batch rather than two per delivery: each execution of an `INSERT` into `events` opens a
/// cursor on the table and on each of its indexes, and that, with the statement's own setup,
/// cost more than the row itself (measured: about 9,000 of the 20,000 instructions per row).
pub(super) fn insert_all(
    tx: &Transaction<'_>,
    batch: &[NewDelivery],
) -> StoreResult<Vec<InsertOutcome>> {
    // seq: writes are serialised (BEGIN IMMEDIATE), so max + 1 is unique and commit-ordered.
    // It is read once per batch: delivery `i` is offered `base + i`. A delivery that turns out
    // to be a duplicate leaves its number unused (a gap, never a reuse of an event's seq).
    let base: i64 = tx
        .prepare_cached("SELECT ifnull(max(seq), 0) + 1 FROM events")?
        .query_row([], |r| r.get(0))?;
    let mut inserted = vec![false; batch.len()];
    for (start, len) in chunks(batch.len()) {
        let mut insert = tx.prepare_cached(&EVENT_INSERTS[len.trailing_zeros() as usize])?;
        for (i, d) in batch[start..start + len].iter().enumerate() {
            let (p, seq) = (i * EVENT_COLUMNS, base + (start + i) as i64);
            insert.raw_bind_parameter(p + 1, &d.source)?;
            insert.raw_bind_parameter(p + 2, &d.event_id)?;
            insert.raw_bind_parameter(p + 3, seq)?;
            insert.raw_bind_parameter(p + 4, &d.event_type)?;
            insert.raw_bind_parameter(p + 5, &d.sha256[..])?;
            insert.raw_bind_parameter(p + 6, d.received_at)?;
            insert.raw_bind_parameter(p + 7, d.lane.as_i64())?;
        }
        let changed = insert.raw_execute()?;
        let chunk = &mut inserted[start..start + len];
        if changed == len {
            chunk.fill(true);
        } else {
            // Some were already stored (or repeat an earlier delivery of this batch): the rows
            // of this chunk's numbers say which were new.
            let mut rows =
                tx.prepare_cached("SELECT seq FROM events WHERE seq >= ?1 AND seq < ?2")?;
            let first = base + start as i64;
            for seq in rows.query_map(params![first, first + len as i64], |r| r.get::<_, i64>(0))? {
                chunk[(seq? - first) as usize] = true;
            }
        }
    }
    let new: Vec<usize> = (0..batch.len()).filter(|&i| inserted[i]).collect();
    for (start, len) in chunks(new.len()) {
        let mut bodies = tx.prepare_cached(&BODY_INSERTS[len.trailing_zeros() as usize])?;
        for (i, &at) in new[start..start + len].iter().enumerate() {
            let (p, d) = (i * BODY_COLUMNS, &batch[at]);
            bodies.raw_bind_parameter(p + 1, base + at as i64)?;
            bodies.raw_bind_parameter(p + 2, &d.payload[..])?;
            bodies.raw_bind_parameter(p + 3, &d.content_type)?;
        }
        bodies.raw_execute()?;
    }
    let mut redelivered = tx.prepare_cached(
        "UPDATE events
            SET deliveries = deliveries + 1,
                last_delivered_at = ?3,
                payload_mismatches = payload_mismatches + (payload_sha256 IS NOT ?4)
          WHERE source = ?1 AND event_id = ?2
      RETURNING payload_sha256 IS ?4",
    )?;
    let mut outcomes = Vec::with_capacity(batch.len());
    // New first attempts per lane, for the queue's `waiting` counts (migration 0007).
    let mut queued = [0_i64; 2];
    for (d, &new) in batch.iter().zip(&inserted) {
        let outcome = if new {
            queued[usize::from(d.lane.as_i64() == 1)] += 1;
            InsertOutcome::Queued
        } else {
            // After every insert of the batch: a repeat of an earlier delivery of this batch
            // finds the row that one made, as it would in a later batch.
            let same: bool = redelivered.query_row(
                params![d.source, d.event_id, d.received_at, &d.sha256[..]],
                |r| r.get(0),
            )?;
            match (same, d.reject_mismatch) {
                (true, _) => InsertOutcome::Duplicate,
                (false, false) => InsertOutcome::Mismatch,
                (false, true) => InsertOutcome::MismatchRejected,
            }
        };
        outcomes.push(outcome);
    }
    let mut waiting =
        tx.prepare_cached("UPDATE queue_cursors SET waiting = waiting + ?2 WHERE lane = ?1")?;
    for (lane, n) in queued.into_iter().enumerate() {
        if n > 0 {
            waiting.execute(params![lane as i64, n])?;
        }
    }
    Ok(outcomes)
}

/// Rows per statement: powers of two up to this, so that a batch of any size takes at most a
/// few statements and the statement cache holds one of each size.
const MOST_ROWS: usize = 64;
const EVENT_COLUMNS: usize = 7;
const BODY_COLUMNS: usize = 3;

/// `(start, len)` pieces of `0..n`, each `len` a power of two of at most [`MOST_ROWS`].
fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        let left = n - start;
        (left > 0).then(|| {
            let len = if left >= MOST_ROWS {
                MOST_ROWS
            } else {
                1 << left.ilog2()
            };
            start += len;
            (start - len, len)
        })
    })
}

/// The multi-row statements, indexed by log2 of their row count.
static EVENT_INSERTS: LazyLock<Vec<String>> = LazyLock::new(|| {
    statements(
        "INSERT INTO events (source, event_id, seq, event_type, payload_sha256, received_at,
                             last_delivered_at, next_attempt_at, lane) VALUES ",
        |p| {
            format!(
                "(?{}, ?{}, ?{}, ?{}, ?{}, ?{f}, ?{f}, ?{f}, ?{})",
                p + 1,
                p + 2,
                p + 3,
                p + 4,
                p + 5,
                p + 7,
                f = p + 6
            )
        },
        EVENT_COLUMNS,
        " ON CONFLICT (source, event_id) DO NOTHING",
    )
});
static BODY_INSERTS: LazyLock<Vec<String>> = LazyLock::new(|| {
    statements(
        "INSERT INTO event_payloads (seq, payload, content_type) VALUES ",
        |p| format!("(?{}, ?{}, ?{})", p + 1, p + 2, p + 3),
        BODY_COLUMNS,
        "",
    )
});

fn statements(
    head: &str,
    row: impl Fn(usize) -> String,
    columns: usize,
    tail: &str,
) -> Vec<String> {
    (0..=MOST_ROWS.ilog2())
        .map(|k| {
            let rows: Vec<String> = (0..1_usize << k).map(|i| row(i * columns)).collect();
            format!("{head}{}{tail}", rows.join(", "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_index_once_in_order_with_power_of_two_lengths() {
        for n in 0..300 {
            let pieces: Vec<_> = chunks(n).collect();
            let mut next = 0;
            for &(start, len) in &pieces {
                assert_eq!(start, next, "n = {n}");
                assert!(len.is_power_of_two() && len <= MOST_ROWS, "n = {n}: {len}");
                next += len;
            }
            assert_eq!(next, n);
            assert!(pieces.len() <= n / MOST_ROWS + MOST_ROWS.ilog2() as usize + 1);
        }
    }

    #[test]
    fn each_statement_has_its_rows_placeholders() {
        for (k, sql) in EVENT_INSERTS.iter().enumerate() {
            let rows = 1 << k;
            assert_eq!(sql.matches("(?").count(), rows);
            assert!(sql.contains(&format!("?{}", rows * EVENT_COLUMNS)));
            assert!(!sql.contains(&format!("?{}", rows * EVENT_COLUMNS + 1)));
        }
        for (k, sql) in BODY_INSERTS.iter().enumerate() {
            let rows = 1 << k;
            assert!(sql.contains(&format!("?{},", rows * BODY_COLUMNS - 1)));
            assert!(!sql.contains(&format!("?{}", rows * BODY_COLUMNS + 1)));
        }
    }
}
