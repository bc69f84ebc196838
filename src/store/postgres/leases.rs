//! Leases on PostgreSQL: claims given back at shutdown or by a client, leases extended by a
//! `pull` client, and expired leases swept, each transition fenced by the claim token.

use super::fence::{Fence, fenced, fenced_sql};
use super::session::Db;
use super::{NOW_MS, QUEUED_CHANNEL};
use crate::store::{AttemptResult, ClaimRef, DecideExpiry, ExpiredClaim, Expiry, StoreResult};

/// Longer leases for claims still held, in one statement, on the database's clock. `now`
/// (the caller's) is the base of the answer, as for a claim's `claimed_until`.
pub(super) fn extend(
    db: &mut Db<'_>,
    claims: &[ClaimRef],
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Option<i64>>> {
    let seqs: Vec<i64> = claims.iter().map(|c| c.seq).collect();
    let subs: Vec<i64> = claims.iter().map(|c| c.subscription).collect();
    let tokens: Vec<&str> = claims.iter().map(|c| c.claim_token.as_str()).collect();
    // By the whole primary key only, as a finish's fence (see `finish::live_fence`).
    let moved = db.query(
        &format!(
            "UPDATE event_state s SET claimed_until = {NOW_MS} + $4
               FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS t (seq, sub, token)
              WHERE s.seq = t.seq AND s.sub = t.sub AND s.claim_token = t.token
                AND s.claimed_until > {NOW_MS}
             RETURNING s.claim_token"
        ),
        &[&seqs, &subs, &tokens, &lease_ms],
    )?;
    let held: std::collections::HashSet<String> = moved
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    Ok(claims
        .iter()
        .map(|c| held.contains(&c.claim_token).then_some(now + lease_ms))
        .collect())
}

/// Shutdown: claims whose handler never started go back to pending, due now.
pub(super) fn release(db: &mut Db<'_>, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
    let sql = fenced_sql(
        &format!("status = 'pending', next_attempt_at = {NOW_MS}"),
        Fence::Live,
    );
    let why = "released at shutdown before the handler started";
    let mut released = 0;
    for claim in claims {
        let result = Some(AttemptResult::RetryableError);
        if fenced(db, &sql, claim, now, result, Some(why), &[])? {
            released += 1;
        }
    }
    if released > 0 {
        db.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))?;
    }
    Ok(released)
}

/// Claims given back unused, as if never made (see the SQLite store's `give_back`): pending,
/// due now, the claim's attempt taken back from the count and from the history.
pub(super) fn give_back(db: &mut Db<'_>, claims: &[ClaimRef]) -> StoreResult<usize> {
    let sql = format!(
        "WITH moved AS (
            UPDATE event_state SET status = 'pending', next_attempt_at = {NOW_MS},
                   attempts = attempts - 1, claim_token = NULL, claimed_until = NULL,
                   claimed_by = NULL
             WHERE seq = $1 AND claim_token = $2 AND claimed_until > {NOW_MS}
            RETURNING seq, sub
         ), gone AS (
            DELETE FROM event_attempts a USING moved
             WHERE a.event_seq = moved.seq AND a.sub = moved.sub AND a.attempt = $3
               AND a.finished_at IS NULL
         )
         SELECT count(*) FROM moved"
    );
    let mut given = 0;
    for claim in claims {
        let moved: i64 = db
            .query_one(&sql, &[&claim.seq, &claim.claim_token, &claim.attempt])?
            .try_get(0)?;
        given += usize::from(moved == 1);
    }
    if given > 0 {
        db.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))?;
    }
    Ok(given)
}

/// Expired leases (by the database's clock): each goes where `decide` says, through a
/// transition fenced by the token. The rows are locked as they are read, skipping rows another
/// node's sweeper (or a late worker's completion) holds: two sweepers never settle one claim
/// twice, and a completion that commits first leaves nothing to sweep.
pub(super) fn sweep(db: &mut Db<'_>, now: i64, decide: DecideExpiry<'_>) -> StoreResult<usize> {
    let rows = db.query(
        &format!(
            "SELECT s.seq, l.source, l.event_id, l.event_type, s.claim_token, s.attempts,
                    s.attempts - s.budget_floor, s.sub
               FROM event_state s JOIN event_log l ON l.seq = s.seq
              WHERE s.status = 'claimed' AND s.claimed_until <= {NOW_MS}
              ORDER BY s.seq, s.sub LIMIT 1000
                FOR UPDATE OF s SKIP LOCKED"
        ),
        &[],
    )?;
    let retry = fenced_sql(
        &format!("status = 'pending', next_attempt_at = {NOW_MS}, last_error = $7"),
        Fence::Expired,
    );
    let fail = fenced_sql(
        "status = 'failed', last_error = $7, abandoned = $8, next_attempt_at = NULL",
        Fence::Expired,
    );
    let (mut swept, mut requeued) = (0, false);
    let lease_expired = Some(AttemptResult::LeaseExpired);
    for r in &rows {
        let expired = ExpiredClaim {
            claim: ClaimRef {
                seq: r.try_get(0)?,
                source: r.try_get(1)?,
                event_id: r.try_get(2)?,
                claim_token: r.try_get(4)?,
                attempt: r.try_get(5)?,
                subscription: r.try_get(7)?,
                row: None,
            },
            event_type: r.try_get(3)?,
            budget_used: r.try_get(6)?,
        };
        let claim = &expired.claim;
        let why = Some("lease expired");
        let held = match decide(&expired) {
            Expiry::Retry { error } => {
                let held = fenced(db, &retry, claim, now, lease_expired, why, &[&error])?;
                requeued |= held;
                held
            }
            Expiry::Fail { error, abandoned } => fenced(
                db,
                &fail,
                claim,
                now,
                lease_expired,
                why,
                &[&error, &abandoned],
            )?,
        };
        swept += usize::from(held);
    }
    if requeued {
        db.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))?;
    }
    Ok(swept)
}
