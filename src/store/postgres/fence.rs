//! The fenced transition of one claimed event: a change of its state only while its claim
//! token still holds it, and the close of its attempt, in one statement.

use super::NOW_MS;
use super::session::Db;
use crate::store::{AttemptResult, ClaimRef, StoreResult};

/// How a fenced transition finds its row: the worker's own transitions hold only while its
/// lease runs (the database's clock); the sweeper's, whose lease has run out, by the token
/// alone.
#[derive(Clone, Copy)]
pub(super) enum Fence {
    Live,
    Expired,
}

/// A fenced transition and the close of its attempt, in one statement: `UPDATE event_state
/// SET <set>` while `claim` still holds the event, clearing the claim; then the attempt's
/// result, only if the fence held. Parameters: $1 seq, $2 claim token, $3 attempt, $4 now, $5
/// result, $6 error, then the set's own from $7. Returns whether the fence held. The token
/// says the row is claimed (see `finish::live_fence`: no `status` in the condition, so that the
/// plan cannot take `events_leases` for the way to the row).
pub(super) fn fenced_sql(set: &str, fence: Fence) -> String {
    let lease = match fence {
        Fence::Live => format!("AND claimed_until > {NOW_MS}"),
        Fence::Expired => String::new(),
    };
    format!(
        "WITH moved AS (
            UPDATE event_state SET {set}, claim_token = NULL, claimed_until = NULL,
                   claimed_by = NULL
             WHERE seq = $1 AND claim_token = $2 {lease}
            RETURNING seq, sub
         ), closed AS (
            UPDATE event_attempts a SET finished_at = $4, result = $5, error = $6
              FROM moved WHERE a.event_seq = moved.seq AND a.sub = moved.sub AND a.attempt = $3
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
