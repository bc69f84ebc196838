//! Storing deliveries. The `(source, event_id)` key of the log is the dedup: `INSERT … ON
//! CONFLICT DO NOTHING`, then branch on the rows changed. There is no SELECT before the INSERT,
//! so no interleaving of concurrent deliveries can make two rows or two `queued` answers.
//!
//! A new event is one appended row of `event_log` (migration 0009) with its body, and nothing
//! else: an event of lane 0 is fanned out to its subscriptions by the consumers' claim after
//! their cursor. Only a submitted request (lane 1) gets its state rows here.

use std::sync::LazyLock;

use rusqlite::{Transaction, params};

use super::subscriptions::Routes;
use crate::store::{EventOrigin, InsertOutcome, NewDelivery, StoreResult};

/// Insert every delivery of a group commit in the caller's transaction. Items are applied in
/// order, so a second copy of a key within the batch is a duplicate of the first.
///
/// New events are written with multi-row `INSERT`s, a few statements per batch rather than
/// one per delivery: each execution of an `INSERT` opens a cursor on the table and on its
/// index, and that, with the statement's own setup, cost more than the row itself (measured:
/// about 9,000 of the 20,000 instructions per row).
pub(super) fn insert_all(
    tx: &Transaction<'_>,
    batch: &[NewDelivery],
    routes: &Routes,
) -> StoreResult<Vec<InsertOutcome>> {
    // SQLite numbers each inserted row `max(seq) + 1` (writes are serialised: BEGIN
    // IMMEDIATE), so `seq` follows commit order and has no gaps: a duplicate takes no number.
    // So the rows one statement inserted are the seqs that end at its `last_insert_rowid()`:
    // no `max(seq)` is read per batch. The seq of each delivery that made a new event:
    let mut seqs: Vec<Option<i64>> = vec![None; batch.len()];
    for (start, len) in chunks(batch.len()) {
        let mut insert = tx.prepare_cached(&EVENT_INSERTS[len.trailing_zeros() as usize])?;
        let chunk = &batch[start..start + len];
        for (i, d) in chunk.iter().enumerate() {
            let p = i * EVENT_COLUMNS;
            insert.raw_bind_parameter(p + 1, &d.source)?;
            insert.raw_bind_parameter(p + 2, &d.event_id)?;
            insert.raw_bind_parameter(p + 3, &d.event_type)?;
            insert.raw_bind_parameter(p + 4, &d.sha256[..])?;
            insert.raw_bind_parameter(p + 5, d.received_at)?;
            insert.raw_bind_parameter(p + 6, d.origin.as_i64())?;
            insert.raw_bind_parameter(p + 7, &d.payload[..])?;
            insert.raw_bind_parameter(p + 8, &d.content_type)?;
            insert.raw_bind_parameter(p + 9, &d.traceparent)?;
        }
        let changed = insert.raw_execute()?;
        if changed == 0 {
            continue;
        }
        let last = tx.last_insert_rowid() - changed as i64;
        let numbered = &mut seqs[start..start + len];
        if changed == len {
            for (i, seq) in numbered.iter_mut().enumerate() {
                *seq = Some(last + 1 + i as i64);
            }
        } else {
            // Some were already stored (or repeat an earlier delivery of this chunk): the new
            // rows, in the order they were inserted, are the chunk's new deliveries in order.
            let mut rows = tx.prepare_cached(
                "SELECT seq, source, event_id FROM event_log WHERE seq > ?1 ORDER BY seq",
            )?;
            let new = rows
                .query_map([last], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut new = new.into_iter().peekable();
            for (d, seq) in chunk.iter().zip(numbered.iter_mut()) {
                if new
                    .peek()
                    .is_some_and(|(_, s, e)| *s == d.source && *e == d.event_id)
                {
                    *seq = new.next().map(|(n, _, _)| n);
                }
            }
        }
    }
    let mut outcomes = Vec::with_capacity(batch.len());
    for (d, seq) in batch.iter().zip(&seqs) {
        let outcome = match seq {
            Some(seq) => {
                if d.origin == EventOrigin::Submission {
                    // Claimed through the index of due work, not the log's cursor.
                    tx.prepare_cached(&super::fan_out::fan_out_one_sql(&routes.by_id))?
                        .execute(params![seq])?;
                }
                InsertOutcome::Queued
            }
            None => {
                // After every insert of the batch: a repeat of an earlier delivery of this
                // batch finds the row that one made, as it would in a later batch.
                let same: bool = tx.prepare_cached(REDELIVERED)?.query_row(
                    params![d.source, d.event_id, d.received_at, &d.sha256[..]],
                    |r| r.get(0),
                )?;
                match (same, d.reject_mismatch) {
                    (true, _) => InsertOutcome::Duplicate,
                    (false, false) => InsertOutcome::Mismatch,
                    (false, true) => InsertOutcome::MismatchRejected,
                }
            }
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// A delivery of a stored event: counted on it, and compared by its body's digest.
const REDELIVERED: &str = "UPDATE event_log
    SET deliveries = deliveries + 1,
        last_delivered_at = ?3,
        payload_mismatches = payload_mismatches + (payload_sha256 IS NOT ?4)
  WHERE source = ?1 AND event_id = ?2
RETURNING payload_sha256 IS ?4";

/// Rows per statement: powers of two up to this, so that a batch of any size takes at most a
/// few statements and the statement cache holds one of each size.
const MOST_ROWS: usize = 64;
const EVENT_COLUMNS: usize = 9;

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
        "INSERT INTO event_log (source, event_id, event_type, payload_sha256, received_at,
                                last_delivered_at, lane, payload, content_type, traceparent)
         VALUES ",
        |p| {
            format!(
                "(?{}, ?{}, ?{}, ?{}, ?{r}, ?{r}, ?{}, ?{}, ?{}, ?{})",
                p + 1,
                p + 2,
                p + 3,
                p + 4,
                p + 6,
                p + 7,
                p + 8,
                p + 9,
                r = p + 5
            )
        },
        EVENT_COLUMNS,
        " ON CONFLICT (source, event_id) DO NOTHING",
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
    }
}
