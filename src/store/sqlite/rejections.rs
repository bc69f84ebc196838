//! Deliveries refused at the edge: a bounded table, written in batches (see
//! `crate::rejections`) and trimmed in the same transaction.

use rusqlite::{Connection, Transaction, params};

use crate::store::{NewRejection, Page, RejectionFilter, RejectionRecord, StoreResult};

/// Insert the batch, then keep only the newest `keep` rows and none received before `since`.
pub(super) fn record(
    tx: &Transaction<'_>,
    batch: &[NewRejection],
    keep: u64,
    since: i64,
) -> StoreResult<()> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO rejections (received_at, source, peer, reason, status, message, headers,
                                 body_bytes, body_sha256)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    for r in batch {
        insert.execute(params![
            r.received_at,
            r.source,
            r.peer,
            r.reason,
            r.status,
            r.message,
            r.headers,
            r.body_bytes,
            r.body_sha256
        ])?;
    }
    // Ids grow by one per row and the oldest go first, so the newest `keep` are the last ids.
    tx.prepare_cached("DELETE FROM rejections WHERE id <= (SELECT max(id) FROM rejections) - ?1")?
        .execute([keep as i64])?;
    tx.prepare_cached("DELETE FROM rejections WHERE received_at < ?1")?
        .execute([since])?;
    Ok(())
}

/// Newest first; `page.before_seq` is the last id of the previous page.
pub(super) fn list(
    conn: &Connection,
    filter: &RejectionFilter,
    page: Page,
) -> StoreResult<Vec<RejectionRecord>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, received_at, source, peer, reason, status, message, headers, body_bytes,
                body_sha256
           FROM rejections
          WHERE (?1 IS NULL OR source = ?1) AND (?2 IS NULL OR reason = ?2)
            AND (?3 IS NULL OR received_at >= ?3) AND (?4 IS NULL OR received_at < ?4)
            AND (?5 IS NULL OR id < ?5)
          ORDER BY id DESC LIMIT ?6",
    )?;
    let rows = stmt
        .query_map(
            params![
                filter.source,
                filter.reason,
                filter.received_after,
                filter.received_before,
                page.before_seq,
                page.limit as i64
            ],
            |r| {
                Ok(RejectionRecord {
                    id: r.get(0)?,
                    rejection: NewRejection {
                        received_at: r.get(1)?,
                        source: r.get(2)?,
                        peer: r.get(3)?,
                        reason: r.get(4)?,
                        status: r.get(5)?,
                        message: r.get(6)?,
                        headers: r.get(7)?,
                        body_bytes: r.get(8)?,
                        body_sha256: r.get(9)?,
                    },
                })
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}
