//! Deliveries refused at the edge on PostgreSQL (see the SQLite store's `rejections`).

use super::session::Db;
use crate::store::{NewRejection, Page, RejectionFilter, RejectionRecord, StoreResult};

pub(super) fn record(
    db: &mut Db<'_>,
    batch: &[NewRejection],
    keep: u64,
    since: i64,
) -> StoreResult<()> {
    for r in batch {
        let status = i64::from(r.status);
        db.execute(
            "INSERT INTO rejections (received_at, source, peer, reason, status, message, headers,
                                     body_bytes, body_sha256)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &r.received_at,
                &r.source,
                &r.peer,
                &r.reason,
                &status,
                &r.message,
                &r.headers,
                &r.body_bytes,
                &r.body_sha256,
            ],
        )?;
    }
    let keep = keep as i64;
    db.execute(
        "DELETE FROM rejections WHERE id <= (SELECT max(id) FROM rejections) - $1",
        &[&keep],
    )?;
    db.execute("DELETE FROM rejections WHERE received_at < $1", &[&since])?;
    Ok(())
}

pub(super) fn list(
    db: &mut Db<'_>,
    filter: &RejectionFilter,
    page: Page,
) -> StoreResult<Vec<RejectionRecord>> {
    let limit = page.limit as i64;
    db.query(
        "SELECT id, received_at, source, peer, reason, status, message, headers, body_bytes,
                body_sha256
           FROM rejections
          WHERE ($1::text IS NULL OR source = $1) AND ($2::text IS NULL OR reason = $2)
            AND ($3::bigint IS NULL OR received_at >= $3)
            AND ($4::bigint IS NULL OR received_at < $4)
            AND ($5::bigint IS NULL OR id < $5)
          ORDER BY id DESC LIMIT $6",
        &[
            &filter.source,
            &filter.reason,
            &filter.received_after,
            &filter.received_before,
            &page.before_seq,
            &limit,
        ],
    )?
    .iter()
    .map(|r| {
        let status: i64 = r.try_get(5)?;
        Ok(RejectionRecord {
            id: r.try_get(0)?,
            rejection: NewRejection {
                received_at: r.try_get(1)?,
                source: r.try_get(2)?,
                peer: r.try_get(3)?,
                reason: r.try_get(4)?,
                status: u16::try_from(status).unwrap_or(0),
                message: r.try_get(6)?,
                headers: r.try_get(7)?,
                body_bytes: r.try_get(8)?,
                body_sha256: r.try_get(9)?,
            },
        })
    })
    .collect()
}
