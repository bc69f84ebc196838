//! The events a claim returns, read from the log in runs of `seq`.
//!
//! A claim's rows carry only their state; each event's source, id, type, body and trace come
//! from its log row. Read one lookup per claim, that was a descent of the log's b-tree per
//! claimed state (and the same event read once per subscription that took it). A fan-out claims
//! events in `seq` order, nearly every one after the cursor, so the claimed `seq`s sit in
//! runs: each run is one range scan of the log, which steps from leaf cell to leaf cell.

use rusqlite::Transaction;

use crate::store::{Claimed, StoreError, StoreResult};

/// The most log rows a run may step over that no claim asked for: a wider gap starts a new run
/// (a new descent), which costs about what stepping over a few rows does.
const GAP: i64 = 8;

/// Fills each claim's event from the log, in place.
pub(super) fn read(tx: &Transaction<'_>, claims: &mut [Claimed]) -> StoreResult<()> {
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_unstable_by_key(|&i| claims[i].claim.seq);
    let mut stmt = tx.prepare_cached(
        "SELECT seq, source, event_id, event_type, payload, content_type, received_at,
                traceparent
           FROM event_log WHERE seq >= ?1 AND seq <= ?2 ORDER BY seq",
    )?;
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len()
            && claims[order[end]].claim.seq - claims[order[end - 1]].claim.seq <= GAP
        {
            end += 1;
        }
        let run = &order[start..end];
        let (first, last) = (
            claims[run[0]].claim.seq,
            claims[run[run.len() - 1]].claim.seq,
        );
        let mut rows = stmt.query([first, last])?;
        let mut next = 0;
        while next < run.len() {
            let Some(row) = rows.next()? else { break };
            let seq: i64 = row.get(0)?;
            let mut filled: Option<usize> = None;
            while next < run.len() && claims[run[next]].claim.seq == seq {
                let i = run[next];
                match filled {
                    // A second subscription's claim of the same event: a copy of the first.
                    Some(j) => {
                        let (source, event_id) = (
                            claims[j].claim.source.clone(),
                            claims[j].claim.event_id.clone(),
                        );
                        let (event_type, payload) =
                            (claims[j].event_type.clone(), claims[j].payload.clone());
                        let (content_type, traceparent) = (
                            claims[j].content_type.clone(),
                            claims[j].traceparent.clone(),
                        );
                        let received_at = claims[j].received_at;
                        let c = &mut claims[i];
                        (c.claim.source, c.claim.event_id) = (source, event_id);
                        (c.event_type, c.payload) = (event_type, payload);
                        (c.content_type, c.traceparent) = (content_type, traceparent);
                        c.received_at = received_at;
                    }
                    None => {
                        let c = &mut claims[i];
                        c.claim.source = row.get(1)?;
                        c.claim.event_id = row.get(2)?;
                        c.event_type = row.get(3)?;
                        c.payload = row.get(4)?;
                        c.content_type = row.get(5)?;
                        c.received_at = row.get(6)?;
                        c.traceparent = row.get(7)?;
                        filled = Some(i);
                    }
                }
                next += 1;
            }
        }
        if next < run.len() {
            // A state row whose log row is gone: the schema's foreign key forbids it.
            let seq = claims[run[next]].claim.seq;
            return Err(StoreError::Internal(anyhow::anyhow!(
                "claimed event {seq} has no log row"
            )));
        }
        start = end;
    }
    Ok(())
}
