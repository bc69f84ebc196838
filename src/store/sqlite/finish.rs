//! Finishing claimed events: the fenced completion (or retry, or failure), the loyalty
//! credit's guarded effect, and the attempt's result, for a batch of events in one
//! transaction.

use rusqlite::types::Null;
use rusqlite::{ErrorCode, Transaction, params};

use super::consume::{COMPLETE, FAIL, Prepared, RETRY, close_attempt, fenced};
use crate::store::{
    AttemptResult, ClaimRef, Effect, Finish, Finished, Next, Outcome, StoreError, StoreResult,
};

fn finish_one(prepared: &mut Prepared<'_>, item: &Finish, now: i64) -> StoreResult<Finished> {
    let claim = &item.claim;
    let lost = Ok(Finished::LeaseLost);
    match &item.next {
        Next::Complete { effect, outcome } => {
            if !fenced(prepared, COMPLETE, claim, now, &outcome.as_str(), &Null)? {
                return lost;
            }
            let proposed = *outcome;
            let (outcome, result) = match effect {
                None => (proposed, AttemptResult::Ok),
                Some(effect) => apply_effect(prepared, claim, effect, now)?,
            };
            // The fence wrote the handler's expected outcome; the guards may say otherwise.
            if outcome != proposed {
                prepared
                    .get("UPDATE events SET outcome = ?2 WHERE seq = ?1")?
                    .execute(params![claim.seq, outcome.as_str()])?;
            }
            close_attempt(prepared, claim, result, None, now)?;
            Ok(Finished::Completed { outcome, result })
        }
        Next::Retry { at, error } => {
            if !fenced(prepared, RETRY, claim, now, at, error)? {
                return lost;
            }
            close_attempt(
                prepared,
                claim,
                AttemptResult::RetryableError,
                Some(error),
                now,
            )?;
            Ok(Finished::Retrying)
        }
        Next::Fail {
            error,
            result,
            abandoned,
        } => {
            if !fenced(prepared, FAIL, claim, now, error, abandoned)? {
                return lost;
            }
            close_attempt(prepared, claim, *result, Some(error), now)?;
            Ok(Finished::Failed)
        }
    }
}

/// The loyalty credit: consumer dedup row, business-key row and balance, all in the
/// transaction that also completes the event. All or nothing.
fn apply_effect(
    prepared: &mut Prepared<'_>,
    claim: &ClaimRef,
    effect: &Effect,
    now: i64,
) -> StoreResult<(Outcome, AttemptResult)> {
    let Effect::LoyaltyCredit {
        consumer,
        order_id,
        customer_id,
        points,
    } = effect;
    let first_time = prepared
        .get(
            "INSERT INTO processed_events (consumer, source, event_id, outcome, processed_at)
             VALUES (?1, ?2, ?3, 'credited', ?4) ON CONFLICT DO NOTHING",
        )?
        .execute(params![consumer, claim.source, claim.event_id, now])?
        == 1;
    if !first_time {
        // A forced re-run: the effect already happened; report what it was and move nothing.
        let previous: String = prepared
            .get(
                "SELECT outcome FROM processed_events
                  WHERE consumer = ?1 AND source = ?2 AND event_id = ?3",
            )?
            .query_row(params![consumer, claim.source, claim.event_id], |r| {
                r.get(0)
            })?;
        let outcome = Outcome::parse(&previous).ok_or_else(|| {
            StoreError::Internal(anyhow::anyhow!("unknown stored outcome {previous}"))
        })?;
        return Ok((outcome, AttemptResult::AlreadyProcessed));
    }
    let credited = prepared
        .get(
            "INSERT INTO loyalty_credits (order_id, customer_id, points, source, event_id,
                                          credited_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (order_id) DO NOTHING",
        )?
        .execute(params![
            order_id,
            customer_id,
            points,
            claim.source,
            claim.event_id,
            now
        ])?
        == 1;
    if !credited {
        prepared
            .get(
                "UPDATE processed_events SET outcome = 'duplicate_order'
                  WHERE consumer = ?1 AND source = ?2 AND event_id = ?3",
            )?
            .execute(params![consumer, claim.source, claim.event_id])?;
        return Ok((Outcome::DuplicateOrder, AttemptResult::Ok));
    }
    prepared
        .get(
            "INSERT INTO loyalty_balances (customer_id, balance) VALUES (?1, ?2)
             ON CONFLICT (customer_id) DO UPDATE SET balance = balance + excluded.balance",
        )?
        .execute(params![customer_id, points])?;
    Ok((Outcome::Credited, AttemptResult::Ok))
}

/// Whether an error belongs to one event's writes (a constraint or trigger refused them)
/// rather than to the transaction as a whole (I/O, a full disk, a busy database).
pub(super) fn refused_by_a_constraint(e: &StoreError) -> bool {
    match e {
        StoreError::Internal(e) => {
            e.downcast_ref::<rusqlite::Error>()
                .and_then(rusqlite::Error::sqlite_error_code)
                == Some(ErrorCode::ConstraintViolation)
        }
        StoreError::Unavailable(_) => false,
    }
}

/// Finish a batch in the caller's transaction. A failed fence writes nothing (the fence comes
/// first), so events need no savepoint of their own unless the database refuses an effect.
/// Refusals are rare, so the caller first runs the batch with `isolate` off: no savepoint at
/// all (a savepoint over the whole batch made SQLite spill its sub-journal to a temporary
/// file at every batch: measured 7% slower than a savepoint per event, and a savepoint per
/// event costs two statements per event, 7% of the drain's instructions). If an effect is
/// refused ([`refused_by_a_constraint`]), the caller rolls the transaction back and runs it
/// again with `isolate` on: each event in its own savepoint, the refused one failed
/// (permanent: the same effect would be refused again) with the database's reason, so that it
/// is neither lost nor retried forever, and the others committed. Any other error fails the
/// whole transaction.
pub(super) fn finish_all(
    tx: &Transaction<'_>,
    items: &[Finish],
    now: i64,
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
    let prepared = &mut Prepared::new(tx);
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        if !isolate {
            results.push(finish_one(prepared, item, now)?);
            continue;
        }
        prepared.get("SAVEPOINT finish_event")?.execute([])?;
        let finished = match finish_one(prepared, item, now) {
            Ok(finished) => finished,
            Err(e) if refused_by_a_constraint(&e) => {
                prepared.get("ROLLBACK TO finish_event")?.execute([])?;
                let error = format!("the store refused the event's effect: {e}");
                tracing::warn!(
                    source = %item.claim.source,
                    event_id = %item.claim.event_id,
                    %error,
                    "event failed"
                );
                let result = AttemptResult::PermanentError;
                if fenced(prepared, FAIL, &item.claim, now, &error, &false)? {
                    close_attempt(prepared, &item.claim, result, Some(&error), now)?;
                    Finished::Failed
                } else {
                    Finished::LeaseLost
                }
            }
            Err(e) => return Err(e),
        };
        prepared.get("RELEASE finish_event")?.execute([])?;
        results.push(finished);
    }
    Ok(results)
}
