//! Deliveries refused at the edge, on either store: a bounded table, written in batches (see
//! `crate::rejections`) and trimmed in the same transaction.

use super::{Conn, Row, Value};
use crate::store::{NewRejection, Page, RejectionFilter, RejectionRecord, StoreResult};

/// Insert the batch, then keep only the newest `keep` rows and none received before `since`.
pub fn record(
    conn: &mut impl Conn,
    batch: &[NewRejection],
    keep: u64,
    since: i64,
) -> StoreResult<()> {
    for r in batch {
        conn.execute(
            "INSERT INTO rejections (received_at, source, peer, reason, status, message, headers,
                                     body_bytes, body_sha256)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            &[
                Value::Int(r.received_at),
                Value::Text(r.source.clone()),
                r.peer.as_deref().into(),
                Value::Text(r.reason.clone()),
                Value::Int(i64::from(r.status)),
                Value::Text(r.message.clone()),
                Value::Text(r.headers.clone()),
                r.body_bytes.into(),
                r.body_sha256.as_deref().into(),
            ],
        )?;
    }
    // Ids grow by one per row and the oldest go first, so the newest `keep` are the last ids.
    conn.execute(
        "DELETE FROM rejections WHERE id <= (SELECT max(id) FROM rejections) - ?1",
        &[Value::Int(i64::try_from(keep).unwrap_or(i64::MAX))],
    )?;
    conn.execute(
        "DELETE FROM rejections WHERE received_at < ?1",
        &[Value::Int(since)],
    )?;
    Ok(())
}

/// Newest first; `page.before_seq` is the last id of the previous page. Each optional filter
/// is cast, so that PostgreSQL knows its type when it is NULL.
pub fn list(
    conn: &mut impl Conn,
    filter: &RejectionFilter,
    page: Page,
) -> StoreResult<Vec<RejectionRecord>> {
    conn.query(
        "SELECT id, received_at, source, peer, reason, status, message, headers, body_bytes,
                body_sha256
           FROM rejections
          WHERE (CAST(?1 AS TEXT) IS NULL OR source = ?1)
            AND (CAST(?2 AS TEXT) IS NULL OR reason = ?2)
            AND (CAST(?3 AS BIGINT) IS NULL OR received_at >= ?3)
            AND (CAST(?4 AS BIGINT) IS NULL OR received_at < ?4)
            AND (CAST(?5 AS BIGINT) IS NULL OR id < ?5)
          ORDER BY id DESC LIMIT ?6",
        &[
            filter.source.as_deref().into(),
            filter.reason.as_deref().into(),
            filter.received_after.into(),
            filter.received_before.into(),
            page.before_seq.into(),
            Value::Int(i64::try_from(page.limit).unwrap_or(i64::MAX)),
        ],
    )?
    .iter()
    .map(record_of)
    .collect()
}

fn record_of(r: &Row) -> StoreResult<RejectionRecord> {
    Ok(RejectionRecord {
        id: r.int(0)?,
        rejection: NewRejection {
            received_at: r.int(1)?,
            source: r.text(2)?,
            peer: r.opt_text(3)?,
            reason: r.text(4)?,
            status: u16::try_from(r.int(5)?).unwrap_or(0),
            message: r.text(6)?,
            headers: r.text(7)?,
            body_bytes: r.opt_int(8)?,
            body_sha256: r.opt_text(9)?,
        },
    })
}
