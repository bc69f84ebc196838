//! Finishing claimed events: the fenced completion (or retry, or failure), the loyalty
//! credit's guarded effect, and the attempt's result, for a batch of events in one
//! transaction. The same statements as SQLite's, in PostgreSQL's words.
//!
//! Two nodes finishing events of the same order at once: the second `INSERT INTO
//! loyalty_credits` waits on the unique key until the first commits, then inserts nothing
//! (`ON CONFLICT DO NOTHING`), so the order is credited once and the second event completes as
//! `duplicate_order`.

use super::NOW_MS;
use super::consume::{Fence, fenced, fenced_sql};
use super::errors::refused_by_a_constraint;
use super::session::Db;
use crate::store::{
    AttemptResult, ClaimRef, Effect, Finish, Finished, Next, Outcome, StoreError, StoreResult,
};

/// The statements of a batch, built once per batch.
struct Statements {
    complete: String,
    retry: String,
    fail: String,
}

impl Statements {
    fn new() -> Self {
        Statements {
            // The attempt stays open ($5 NULL): its result depends on the effect.
            complete: fenced_sql(
                "status = 'completed', completed_at = $4, outcome = $7, last_error = NULL, \
                 next_attempt_at = NULL",
                Fence::Live,
            ),
            // $7: the backoff, counted from the database's clock.
            retry: fenced_sql(
                &format!("status = 'pending', next_attempt_at = {NOW_MS} + $7, last_error = $8"),
                Fence::Live,
            ),
            fail: fenced_sql(
                "status = 'failed', last_error = $7, abandoned = $8, next_attempt_at = NULL",
                Fence::Live,
            ),
        }
    }
}

const CLOSE_ATTEMPT: &str = "UPDATE event_attempts SET finished_at = $3, result = $4, error = $5
  WHERE event_seq = $1 AND attempt = $2";

fn finish_one(db: &mut Db<'_>, sql: &Statements, item: &Finish, now: i64) -> StoreResult<Finished> {
    let claim = &item.claim;
    let lost = Ok(Finished::LeaseLost);
    match &item.next {
        Next::Complete { effect, outcome } => {
            let proposed = *outcome;
            let held = match effect {
                None => Some(AttemptResult::Ok),
                Some(_) => None,
            };
            if !fenced(
                db,
                &sql.complete,
                claim,
                now,
                held,
                None,
                &[&proposed.as_str()],
            )? {
                return lost;
            }
            let Some(effect) = effect else {
                return Ok(Finished::Completed {
                    outcome: proposed,
                    result: AttemptResult::Ok,
                });
            };
            let (outcome, result) = apply_effect(db, claim, effect, now)?;
            // The fence wrote the handler's expected outcome; the guards may say otherwise.
            if outcome != proposed {
                db.execute(
                    "UPDATE events SET outcome = $2 WHERE seq = $1",
                    &[&claim.seq, &outcome.as_str()],
                )?;
            }
            let no_error: Option<&str> = None;
            db.execute(
                CLOSE_ATTEMPT,
                &[
                    &claim.seq,
                    &claim.attempt,
                    &now,
                    &result.as_str(),
                    &no_error,
                ],
            )?;
            Ok(Finished::Completed { outcome, result })
        }
        Next::Retry { at, error } => {
            let delay = (at - now).max(0);
            let result = Some(AttemptResult::RetryableError);
            if !fenced(
                db,
                &sql.retry,
                claim,
                now,
                result,
                Some(error),
                &[&delay, error],
            )? {
                return lost;
            }
            Ok(Finished::Retrying)
        }
        Next::Fail {
            error,
            result,
            abandoned,
        } => {
            let set: [&(dyn postgres::types::ToSql + Sync); 2] = [error, abandoned];
            if !fenced(db, &sql.fail, claim, now, Some(*result), Some(error), &set)? {
                return lost;
            }
            Ok(Finished::Failed)
        }
    }
}

/// The loyalty credit: consumer dedup row, business-key row and balance, all in the
/// transaction that also completes the event. All or nothing.
fn apply_effect(
    db: &mut Db<'_>,
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
    let first_time = db.execute(
        "INSERT INTO processed_events (consumer, source, event_id, outcome, processed_at)
         VALUES ($1, $2, $3, 'credited', $4) ON CONFLICT DO NOTHING",
        &[consumer, &claim.source, &claim.event_id, &now],
    )? == 1;
    if !first_time {
        // A forced re-run: the effect already happened; report what it was and move nothing.
        let previous: String = db
            .query_one(
                "SELECT outcome FROM processed_events
                  WHERE consumer = $1 AND source = $2 AND event_id = $3",
                &[consumer, &claim.source, &claim.event_id],
            )?
            .try_get(0)?;
        let outcome = Outcome::parse(&previous).ok_or_else(|| {
            StoreError::Internal(anyhow::anyhow!("unknown stored outcome {previous}"))
        })?;
        return Ok((outcome, AttemptResult::AlreadyProcessed));
    }
    let credited = db.execute(
        "INSERT INTO loyalty_credits (order_id, customer_id, points, source, event_id,
                                      credited_at)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (order_id) DO NOTHING",
        &[
            order_id,
            customer_id,
            points,
            &claim.source,
            &claim.event_id,
            &now,
        ],
    )? == 1;
    if !credited {
        db.execute(
            "UPDATE processed_events SET outcome = 'duplicate_order'
              WHERE consumer = $1 AND source = $2 AND event_id = $3",
            &[consumer, &claim.source, &claim.event_id],
        )?;
        return Ok((Outcome::DuplicateOrder, AttemptResult::Ok));
    }
    db.execute(
        "INSERT INTO loyalty_balances (customer_id, balance) VALUES ($1, $2)
         ON CONFLICT (customer_id)
         DO UPDATE SET balance = loyalty_balances.balance + excluded.balance",
        &[customer_id, points],
    )?;
    Ok((Outcome::Credited, AttemptResult::Ok))
}

/// Finish a batch in the caller's transaction, as SQLite's `finish_all`: a failed fence
/// writes nothing (the fence comes first), so events need no savepoint of their own unless
/// the database refuses an effect. On PostgreSQL a refused statement aborts the whole
/// transaction, so the caller rolls back and runs the batch again with `isolate` on: each
/// event in its own savepoint, the refused one failed (permanent: the same effect would be
/// refused again) with the database's reason, and the others committed.
pub(super) fn finish_all(
    db: &mut Db<'_>,
    items: &[Finish],
    now: i64,
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
    let sql = Statements::new();
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        if !isolate {
            results.push(finish_one(db, &sql, item, now)?);
            continue;
        }
        db.batch("SAVEPOINT finish_event")?;
        let finished = match finish_one(db, &sql, item, now) {
            Ok(finished) => finished,
            Err(e) if refused_by_a_constraint(&e) => {
                db.batch("ROLLBACK TO SAVEPOINT finish_event")?;
                let error = format!("the store refused the event's effect: {e:#}");
                tracing::warn!(
                    source = %item.claim.source,
                    event_id = %item.claim.event_id,
                    %error,
                    "event failed"
                );
                let result = AttemptResult::PermanentError;
                let set: [&(dyn postgres::types::ToSql + Sync); 2] = [&error, &false];
                if fenced(
                    db,
                    &sql.fail,
                    &item.claim,
                    now,
                    Some(result),
                    Some(&error),
                    &set,
                )? {
                    Finished::Failed
                } else {
                    Finished::LeaseLost
                }
            }
            Err(e) => return Err(e),
        };
        db.batch("RELEASE SAVEPOINT finish_event")?;
        results.push(finished);
    }
    Ok(results)
}
