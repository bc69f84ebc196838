//! Leases on SQLite: claims given back at shutdown or by a client, leases extended by a `pull`
//! client, and expired leases swept, each transition fenced by the claim token.

use rusqlite::types::Null;
use rusqlite::{OptionalExtension, Transaction, params};

use super::consume::{
    EXPIRED_FAIL, EXPIRED_RETRY, GIVE_BACK, Prepared, RELEASE, close_attempt, fenced,
};
use crate::store::{AttemptResult, ClaimRef, DecideExpiry, ExpiredClaim, Expiry, StoreResult};

/// Shutdown: claims whose handler never started go back to pending, due now.
pub(super) fn release(tx: &Transaction<'_>, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
    let mut prepared = Prepared::new(tx);
    let mut released = 0;
    for claim in claims {
        if fenced(&mut prepared, RELEASE, claim, now, &Null, &Null)? {
            let why = "released at shutdown before the handler started";
            close_attempt(
                &mut prepared,
                claim,
                AttemptResult::RetryableError,
                Some(why),
                now,
            )?;
            released += 1;
        }
    }
    Ok(released)
}

/// Claims given back unused, as if never made: pending, due now, the claim's attempt taken
/// back from the count and from the history. For a forwarder whose claims saw a registry its
/// node has not applied yet (`forward::Forwarder::fenced_by`): nothing was sent, so nothing
/// may cost the event its budget or show as an attempt.
pub(super) fn give_back(tx: &Transaction<'_>, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
    let mut prepared = Prepared::new(tx);
    let mut given = 0;
    for claim in claims {
        if fenced(&mut prepared, GIVE_BACK, claim, now, &Null, &Null)? {
            prepared
                .get(
                    "DELETE FROM event_attempts
                      WHERE event_seq = ?1 AND sub = ?2 AND attempt = ?3 AND finished_at IS NULL",
                )?
                .execute(params![claim.seq, claim.subscription, claim.attempt])?;
            given += 1;
        }
    }
    Ok(given)
}

/// Longer leases for claims still held (fenced as a worker's own transitions are).
pub(super) fn extend(
    tx: &Transaction<'_>,
    claims: &[ClaimRef],
    until: i64,
    now: i64,
) -> StoreResult<Vec<Option<i64>>> {
    let mut stmt = tx.prepare_cached(
        "UPDATE event_state SET claimed_until = ?3
          WHERE seq = ?1 AND sub = ?5 AND claim_token = ?2 AND status = 'claimed'
            AND claimed_until > ?4
         RETURNING claimed_until",
    )?;
    let mut extended = Vec::with_capacity(claims.len());
    for claim in claims {
        extended.push(
            stmt.query_row(
                params![claim.seq, claim.claim_token, until, now, claim.subscription],
                |r| r.get(0),
            )
            .optional()?,
        );
    }
    Ok(extended)
}

/// Expired leases: each goes where `decide` says (the rule is the consumer's), through a
/// transition fenced by the token read in this same write transaction.
pub(super) fn sweep(
    tx: &Transaction<'_>,
    now: i64,
    decide: DecideExpiry<'_>,
) -> StoreResult<usize> {
    let expired = tx
        .prepare_cached(
            "SELECT l.source, l.event_id, l.event_type, s.claim_token, s.attempts,
                    s.attempts - s.budget_floor, s.seq, s.sub
               FROM event_state s INDEXED BY events_leases JOIN event_log l ON l.seq = s.seq
              WHERE s.status = 'claimed' AND s.claimed_until <= ?1",
        )?
        .query_map([now], |r| {
            Ok(ExpiredClaim {
                claim: ClaimRef {
                    source: r.get(0)?,
                    event_id: r.get(1)?,
                    seq: r.get(6)?,
                    subscription: r.get(7)?,
                    claim_token: r.get(3)?,
                    attempt: r.get(4)?,
                    row: None,
                },
                event_type: r.get(2)?,
                budget_used: r.get(5)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut prepared = Prepared::new(tx);
    let mut swept = 0;
    for expired in expired {
        let claim = &expired.claim;
        let held = match decide(&expired) {
            Expiry::Retry { error } => {
                fenced(&mut prepared, EXPIRED_RETRY, claim, now, &error, &Null)?
            }
            Expiry::Fail { error, abandoned } => {
                fenced(&mut prepared, EXPIRED_FAIL, claim, now, &error, &abandoned)?
            }
        };
        if held {
            close_attempt(
                &mut prepared,
                claim,
                AttemptResult::LeaseExpired,
                Some("lease expired"),
                now,
            )?;
            swept += 1;
        }
    }
    Ok(swept)
}
