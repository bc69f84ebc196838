//! Storing deliveries: a group commit is one multi-row `INSERT … ON CONFLICT (source,
//! event_id) DO NOTHING RETURNING`, its bodies and its announcement to the listeners in the
//! same statement. The unique key is the dedup, across nodes too: a second node inserting the
//! same key waits for the first one's transaction and then inserts nothing. There is no SELECT
//! before the INSERT.
//!
//! A batch of webhooks (no submitted request in it) is that one statement in the server's
//! implicit transaction: one round trip, where `BEGIN`, the insert, `NOTIFY` and `COMMIT` were
//! four. Its redeliveries, if any, are counted in a transaction after it: a redelivery's answer
//! waits for both, and a counter lost to a crash between them belongs to a delivery that was
//! not answered yet.

use std::collections::HashSet;
use std::sync::LazyLock;

use postgres::Row;

use super::QUEUED_CHANNEL;
use super::fan_out::INGEST_LOCK;
use super::session::{Conn, Db, Params};
use super::subscriptions::RouteCache;
use crate::store::{EventOrigin, InsertOutcome, NewDelivery, StoreError, StoreResult};

/// Only the first copy of each key in a batch is offered to the INSERT; the rows are inserted
/// in key order, so that two nodes whose batches share keys take their locks in one order and
/// cannot deadlock. `ord` says which batch item each inserted row was. The `NOTIFY` (an init
/// plan, run once, and only if a row was inserted) is delivered at commit, to every node's
/// listener (see `listen`). Written once: every group commit runs it.
static INSERT_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH input AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bigint[],
                                 $6::bigint[], $7::bytea[], $8::text[], $9::bigint[],
                                 $10::text[])
                AS t (source, event_id, event_type, sha, received_at, lane, payload,
                      content_type, ord, traceparent)
         ), ordered AS MATERIALIZED (
            -- Held from before the first `seq` is taken to the commit (see
            -- `fan_out::fan_out_limit`): every inserted row waits for it.
            SELECT pg_advisory_xact_lock_shared({INGEST_LOCK})
         ), inserted AS (
            INSERT INTO event_log (source, event_id, event_type, payload_sha256, received_at,
                                   last_delivered_at, lane)
            SELECT source, event_id, event_type, sha, received_at, received_at, lane
              FROM input CROSS JOIN ordered ORDER BY source, event_id
            ON CONFLICT (source, event_id) DO NOTHING
            RETURNING seq, source, event_id
         ), bodies AS (
            INSERT INTO event_payloads (seq, payload, content_type, traceparent)
            SELECT inserted.seq, input.payload, input.content_type, input.traceparent
              FROM inserted JOIN input USING (source, event_id)
         )
         SELECT input.ord, inserted.seq,
                (SELECT count(*) FROM pg_notify('{QUEUED_CHANNEL}', '')) AS announced
           FROM inserted JOIN input USING (source, event_id)"
    )
});

/// A redelivery: counted on the row, and compared with the first body's SHA-256.
const REDELIVERED: &str = "UPDATE event_log
    SET deliveries = deliveries + 1,
        last_delivered_at = $3,
        payload_mismatches = payload_mismatches + (payload_sha256 IS DISTINCT FROM $4)::int
  WHERE source = $1 AND event_id = $2
RETURNING payload_sha256 = $4";

/// Insert every delivery of a group commit in the caller's transaction. A second copy of a key
/// within the batch is a duplicate of the first, as on SQLite.
pub(super) fn insert_all(
    db: &mut Db<'_>,
    batch: &[NewDelivery],
    cache: &RouteCache,
) -> StoreResult<Vec<InsertOutcome>> {
    let rows = insert_new(batch, |sql, params| db.query(sql, params))?;
    // The routes read after the insert, which holds the ingest lock shared: a sync that
    // committed before it is seen, and one that comes later waits for this commit and starts
    // its new subscriptions after these numbers.
    let routes = cache.current(db)?;
    let mut outcomes = vec![None; batch.len()];
    for row in &rows {
        let ord = queued(row, &mut outcomes)?;
        // A submitted request is claimed through its state rows, written with it; a webhook's
        // are written by the claim that fans it out.
        if batch[ord].origin == EventOrigin::Submission {
            let seq: i64 = row.try_get(1)?;
            db.execute(&super::fan_out::fan_out_one_sql(&routes), &[&seq])?;
        }
    }
    count_redeliveries(db, batch, &mut outcomes)?;
    Ok(finished(outcomes))
}

/// [`insert_all`] for a batch of webhooks only (nothing to fan out with the rows): the insert
/// in a transaction of its own, then the redeliveries' counts in another.
pub(super) fn insert_webhooks(
    conn: &mut Conn,
    batch: &[NewDelivery],
) -> StoreResult<Vec<InsertOutcome>> {
    debug_assert!(batch.iter().all(|d| d.origin != EventOrigin::Submission));
    let rows = insert_new(batch, |sql, params| conn.query_alone(sql, params))?;
    let mut outcomes = vec![None; batch.len()];
    for row in &rows {
        queued(row, &mut outcomes)?;
    }
    if outcomes.iter().any(Option::is_none) {
        super::in_tx(conn, |db| count_redeliveries(db, batch, &mut outcomes))?;
    }
    Ok(finished(outcomes))
}

/// Run the INSERT over the first copy of each key in `batch`: a row per inserted delivery.
fn insert_new(
    batch: &[NewDelivery],
    query: impl FnOnce(&str, Params<'_>) -> StoreResult<Vec<Row>>,
) -> StoreResult<Vec<Row>> {
    let mut seen = HashSet::with_capacity(batch.len());
    let first: Vec<usize> = (0..batch.len())
        .filter(|&i| seen.insert((&batch[i].source, &batch[i].event_id)))
        .collect();
    let sources: Vec<&str> = first.iter().map(|&i| batch[i].source.as_str()).collect();
    let ids: Vec<&str> = first.iter().map(|&i| batch[i].event_id.as_str()).collect();
    let types: Vec<&str> = first
        .iter()
        .map(|&i| batch[i].event_type.as_str())
        .collect();
    let shas: Vec<&[u8]> = first.iter().map(|&i| &batch[i].sha256[..]).collect();
    let received: Vec<i64> = first.iter().map(|&i| batch[i].received_at).collect();
    let lanes: Vec<i64> = first.iter().map(|&i| batch[i].origin.as_i64()).collect();
    let payloads: Vec<&[u8]> = first.iter().map(|&i| batch[i].payload.as_slice()).collect();
    let content_types: Vec<Option<&str>> = first
        .iter()
        .map(|&i| batch[i].content_type.as_deref())
        .collect();
    let ords: Vec<i64> = first.iter().map(|&i| i as i64).collect();
    let traceparents: Vec<Option<&str>> = first
        .iter()
        .map(|&i| batch[i].traceparent.as_deref())
        .collect();
    query(
        &INSERT_SQL,
        &[
            &sources,
            &ids,
            &types,
            &shas,
            &received,
            &lanes,
            &payloads,
            &content_types,
            &ords,
            &traceparents,
        ],
    )
}

/// Mark the batch item an inserted row was as queued; its place in the batch.
fn queued(row: &Row, outcomes: &mut [Option<InsertOutcome>]) -> StoreResult<usize> {
    let ord = usize::try_from(row.try_get::<_, i64>(0)?)
        .map_err(|e| StoreError::Internal(anyhow::anyhow!("an inserted row's place: {e}")))?;
    outcomes[ord] = Some(InsertOutcome::Queued);
    Ok(ord)
}

/// Count the redeliveries (the items not inserted), in key order: the lock order of the
/// INSERT.
fn count_redeliveries(
    db: &mut Db<'_>,
    batch: &[NewDelivery],
    outcomes: &mut [Option<InsertOutcome>],
) -> StoreResult<()> {
    let mut again: Vec<usize> = (0..batch.len())
        .filter(|&i| outcomes[i].is_none())
        .collect();
    again.sort_by(|&a, &b| {
        (&batch[a].source, &batch[a].event_id).cmp(&(&batch[b].source, &batch[b].event_id))
    });
    for i in again {
        let d = &batch[i];
        let same: bool = db
            .query_opt(
                REDELIVERED,
                &[&d.source, &d.event_id, &d.received_at, &&d.sha256[..]],
            )?
            .ok_or_else(|| {
                StoreError::Internal(anyhow::anyhow!(
                    "event {}/{} conflicted on insert but is not there",
                    d.source,
                    d.event_id
                ))
            })?
            .try_get(0)?;
        outcomes[i] = Some(match (same, d.reject_mismatch) {
            (true, _) => InsertOutcome::Duplicate,
            (false, false) => InsertOutcome::Mismatch,
            (false, true) => InsertOutcome::MismatchRejected,
        });
    }
    Ok(())
}

fn finished(outcomes: Vec<Option<InsertOutcome>>) -> Vec<InsertOutcome> {
    outcomes
        .into_iter()
        .map(|o| o.expect("every item is inserted or a redelivery"))
        .collect()
}
