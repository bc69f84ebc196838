//! The consumer side: claim, the fenced transitions (finishing a batch is in `finish`),
//! release, sweep.
//!
//! A claim is one statement: `FOR UPDATE SKIP LOCKED` picks due pending rows that no other
//! transaction holds (another node's claim skips them instead of waiting or taking them too),
//! the UPDATE moves them to `claimed`, and the attempt rows are opened in the same statement.
//! Due-ness and leases are the database's clock. Every later transition is fenced by the claim
//! token, so a worker that lost its claim changes nothing.

use super::session::Db;
use super::subscriptions::SUB_OF;
use super::{NOW_MS, QUEUED_CHANNEL};
use crate::store::{
    AttemptResult, ClaimRef, Claimed, DecideExpiry, ExpiredClaim, Expiry, Lane, LoyaltyAccount,
    LoyaltyCredit, Page, StoreResult,
};

/// `picked` is materialised: a locking subquery that the planner could run again (as the inner
/// side of a nested loop) would lock and claim more rows than the limit.
fn claim_sql() -> String {
    let sub_of_e = SUB_OF
        .replace("lane", "e.lane")
        .replace("event_type", "e.event_type");
    format!(
        "WITH clock AS MATERIALIZED (SELECT {NOW_MS} AS ms),
         picked AS MATERIALIZED (
            SELECT seq FROM events
             WHERE lane = $3 AND status = 'pending'
               AND next_attempt_at <= (SELECT ms FROM clock)
               AND {SUB_OF} NOT IN (SELECT id FROM subscriptions WHERE paused)
             ORDER BY next_attempt_at, seq
             LIMIT $4
               FOR UPDATE SKIP LOCKED
         ), claimed AS (
            UPDATE events e
               SET status = 'claimed', claimed_by = $1,
                   claimed_until = (SELECT ms FROM clock) + $2,
                   attempts = e.attempts + 1, claim_token = gen_random_uuid()::text
              FROM picked WHERE e.seq = picked.seq
            RETURNING e.seq, e.source, e.event_id, e.event_type, e.attempts,
                      e.attempts - e.budget_floor AS budget_used, e.claim_token,
                      {sub_of_e} AS sub
         ), history AS (
            INSERT INTO event_attempts (event_seq, attempt, worker, started_at)
            SELECT seq, attempts, $1, $5 FROM claimed
         )
         SELECT c.seq, c.source, c.event_id, c.event_type, c.attempts, c.budget_used,
                c.claim_token, p.payload, p.content_type, c.sub
           FROM claimed c JOIN event_payloads p USING (seq)
          ORDER BY c.seq"
    )
}

pub(super) fn claim(
    db: &mut Db<'_>,
    worker: &str,
    lane: Lane,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Claimed>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = db.query(
        &claim_sql(),
        &[&worker, &lease_ms, &lane.as_i64(), &limit, &now],
    )?;
    rows.iter()
        .map(|r| {
            Ok(Claimed {
                claim: ClaimRef {
                    seq: r.try_get(0)?,
                    source: r.try_get(1)?,
                    event_id: r.try_get(2)?,
                    attempt: r.try_get(4)?,
                    claim_token: r.try_get(6)?,
                    subscription: r.try_get(9)?,
                },
                event_type: r.try_get(3)?,
                budget_used: r.try_get(5)?,
                payload: r.try_get(7)?,
                content_type: r.try_get(8)?,
                // In the caller's clock, for the handler's "does the lease cover the call"
                // check: the database's lease began after `now`, so it ends no earlier.
                claimed_until: now + lease_ms,
            })
        })
        .collect()
}

/// How a fenced transition finds its row: the worker's own transitions hold only while its
/// lease runs (the database's clock); the sweeper's, whose lease has run out, by the token
/// alone.
#[derive(Clone, Copy)]
pub(super) enum Fence {
    Live,
    Expired,
}

/// A fenced transition and the close of its attempt, in one statement: `UPDATE events SET
/// <set>` while `claim` still holds the event, clearing the claim; then the attempt's result,
/// only if the fence held. Parameters: $1 seq, $2 claim token, $3 attempt, $4 now, $5 result,
/// $6 error, then the set's own from $7. Returns whether the fence held.
pub(super) fn fenced_sql(set: &str, fence: Fence) -> String {
    let lease = match fence {
        Fence::Live => format!("AND claimed_until > {NOW_MS}"),
        Fence::Expired => String::new(),
    };
    format!(
        "WITH moved AS (
            UPDATE events SET {set}, claim_token = NULL, claimed_until = NULL, claimed_by = NULL
             WHERE seq = $1 AND claim_token = $2 AND status = 'claimed' {lease}
            RETURNING seq
         ), closed AS (
            UPDATE event_attempts SET finished_at = $4, result = $5, error = $6
             WHERE event_seq IN (SELECT seq FROM moved) AND attempt = $3
         )
         SELECT count(*) FROM moved"
    )
}

/// Run a statement of [`fenced_sql`]; `set` holds the values from $7 on.
pub(super) fn fenced(
    db: &mut Db<'_>,
    sql: &str,
    claim: &ClaimRef,
    now: i64,
    result: Option<AttemptResult>,
    error: Option<&str>,
    set: &[&(dyn postgres::types::ToSql + Sync)],
) -> StoreResult<bool> {
    let result = result.map(AttemptResult::as_str);
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![
        &claim.seq,
        &claim.claim_token,
        &claim.attempt,
        &now,
        &result,
        &error,
    ];
    params.extend_from_slice(set);
    let moved: i64 = db.query_one(sql, &params)?.try_get(0)?;
    Ok(moved == 1)
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

/// Expired leases (by the database's clock): each goes where `decide` says, through a
/// transition fenced by the token. The rows are locked as they are read, skipping rows another
/// node's sweeper (or a late worker's completion) holds: two sweepers never settle one claim
/// twice, and a completion that commits first leaves nothing to sweep.
pub(super) fn sweep(db: &mut Db<'_>, now: i64, decide: DecideExpiry<'_>) -> StoreResult<usize> {
    let rows = db.query(
        &format!(
            "SELECT seq, source, event_id, event_type, claim_token, attempts,
                    attempts - budget_floor, {SUB_OF}
               FROM events WHERE status = 'claimed' AND claimed_until <= {NOW_MS}
              ORDER BY seq LIMIT 1000
                FOR UPDATE SKIP LOCKED"
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

/// The balance and one page of credits, newest first by the `seq` of the event that earned
/// each credit: the order and cursor of `GET /events`.
pub(super) fn loyalty(
    db: &mut Db<'_>,
    customer_id: &str,
    page: Page,
) -> StoreResult<LoyaltyAccount> {
    let balance: i64 = match db.query_opt(
        "SELECT balance FROM loyalty_balances WHERE customer_id = $1",
        &[&customer_id],
    )? {
        Some(row) => row.try_get(0)?,
        None => 0,
    };
    let limit = i64::try_from(page.limit).unwrap_or(i64::MAX);
    let rows = db.query(
        "SELECT c.order_id, c.points, c.source, c.event_id, c.credited_at, e.seq
           FROM loyalty_credits c
           JOIN events e ON e.source = c.source AND e.event_id = c.event_id
          WHERE c.customer_id = $1 AND ($2::bigint IS NULL OR e.seq < $2)
          ORDER BY e.seq DESC LIMIT $3",
        &[&customer_id, &page.before_seq, &limit],
    )?;
    let credits = rows
        .iter()
        .map(|r| {
            Ok(LoyaltyCredit {
                order_id: r.try_get(0)?,
                points: r.try_get(1)?,
                source: r.try_get(2)?,
                event_id: r.try_get(3)?,
                credited_at: r.try_get(4)?,
                seq: r.try_get(5)?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(LoyaltyAccount {
        customer_id: customer_id.to_string(),
        balance,
        credits,
    })
}
