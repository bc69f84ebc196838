//! The rules every store follows, written once. A store supplies a narrow set of statements
//! run inside its own transaction ([`FinishStatements`]); what those statements mean (which
//! outcome a refused credit has, when a retry is allowed, what a refused effect does to its
//! event) is decided here, so that SQLite and PostgreSQL cannot drift apart.
//!
//! The guards themselves stay in the database: every "first time?" below is answered by a
//! unique constraint inside the transaction that completes the event (`ON CONFLICT DO
//! NOTHING`), never by a read followed by a write.

use super::{
    AttemptResult, ClaimRef, Effect, EventRecord, Finish, Finished, Next, Outcome, RetryOutcome,
    Status, StoreError, StoreResult,
};

/// The statements finishing a batch needs, each run in the transaction the store opened for
/// the batch. Times are the store's: the caller's clock, or the database's.
pub trait FinishStatements {
    /// Fenced transitions: each writes only while `claim`'s token still holds the event
    /// (status `claimed`, same token, lease not run out) and answers whether it did.
    fn complete(&mut self, claim: &ClaimRef, outcome: Outcome) -> StoreResult<bool>;
    fn retry_at(&mut self, claim: &ClaimRef, at: i64, error: &str) -> StoreResult<bool>;
    fn fail(&mut self, claim: &ClaimRef, error: &str, abandoned: bool) -> StoreResult<bool>;
    /// Replace the outcome a fenced `complete` wrote (the guards said otherwise).
    fn set_outcome(&mut self, claim: &ClaimRef, outcome: Outcome) -> StoreResult<()>;
    /// Close the attempt the claim opened in the history.
    fn close_attempt(
        &mut self,
        claim: &ClaimRef,
        result: AttemptResult,
        error: Option<&str>,
    ) -> StoreResult<()>;

    /// The consumer's dedup row for this event, with `outcome`: `false` when it exists already
    /// (unique on consumer, source, event id).
    fn mark_processed(
        &mut self,
        consumer: &str,
        claim: &ClaimRef,
        outcome: Outcome,
    ) -> StoreResult<bool>;
    /// The outcome recorded by `mark_processed` (or `set_processed_outcome`).
    fn processed_outcome(&mut self, consumer: &str, claim: &ClaimRef) -> StoreResult<String>;
    fn set_processed_outcome(
        &mut self,
        consumer: &str,
        claim: &ClaimRef,
        outcome: Outcome,
    ) -> StoreResult<()>;
    /// The credit row keyed on its order: `false` when the order was credited already
    /// (unique on `order_id`).
    fn insert_credit(
        &mut self,
        claim: &ClaimRef,
        order_id: &str,
        customer_id: &str,
        points: i64,
    ) -> StoreResult<bool>;
    /// Add `points` to the customer's balance, creating it at `points`.
    fn add_to_balance(&mut self, customer_id: &str, points: i64) -> StoreResult<()>;

    /// Per-event isolation, used only after the database refused an effect.
    fn savepoint(&mut self) -> StoreResult<()>;
    fn rollback_to_savepoint(&mut self) -> StoreResult<()>;
    fn release_savepoint(&mut self) -> StoreResult<()>;
    /// Whether `error` is the database refusing one event's writes (a constraint or trigger),
    /// rather than a failure of the transaction as a whole (I/O, a full disk, a busy server).
    fn is_refusal(&self, error: &StoreError) -> bool;
}

/// Finish a batch in the store's transaction. A failed fence writes nothing (the fence comes
/// first), so events need no savepoint of their own unless the database refuses an effect.
/// Refusals are rare, so the store first runs the batch with `isolate` off: no savepoint at
/// all. If an effect is refused ([`FinishStatements::is_refusal`]), the store rolls the
/// transaction back and runs it again with `isolate` on: each event in its own savepoint, the
/// refused one failed (permanent: the same effect would be refused again) with the database's
/// reason, so that it is neither lost nor retried forever, and the others committed. Any other
/// error fails the whole transaction.
pub fn finish_all(
    tx: &mut dyn FinishStatements,
    items: &[Finish],
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        if !isolate {
            results.push(finish_one(tx, item)?);
            continue;
        }
        tx.savepoint()?;
        let finished = match finish_one(tx, item) {
            Ok(finished) => finished,
            Err(e) if tx.is_refusal(&e) => {
                tx.rollback_to_savepoint()?;
                let error = format!("the store refused the event's effect: {e}");
                tracing::warn!(
                    source = %item.claim.source,
                    event_id = %item.claim.event_id,
                    %error,
                    "event failed"
                );
                if tx.fail(&item.claim, &error, false)? {
                    tx.close_attempt(&item.claim, AttemptResult::PermanentError, Some(&error))?;
                    Finished::Failed
                } else {
                    Finished::LeaseLost
                }
            }
            Err(e) => return Err(e),
        };
        tx.release_savepoint()?;
        results.push(finished);
    }
    Ok(results)
}

fn finish_one(tx: &mut dyn FinishStatements, item: &Finish) -> StoreResult<Finished> {
    let claim = &item.claim;
    match &item.next {
        Next::Complete { effect, outcome } => {
            if !tx.complete(claim, *outcome)? {
                return Ok(Finished::LeaseLost);
            }
            let (applied, result) = match effect {
                None => (*outcome, AttemptResult::Ok),
                Some(effect) => apply(tx, claim, effect)?,
            };
            // The fence wrote the handler's expected outcome; the guards may say otherwise.
            if applied != *outcome {
                tx.set_outcome(claim, applied)?;
            }
            tx.close_attempt(claim, result, None)?;
            Ok(Finished::Completed {
                outcome: applied,
                result,
            })
        }
        Next::Retry { at, error } => {
            if !tx.retry_at(claim, *at, error)? {
                return Ok(Finished::LeaseLost);
            }
            tx.close_attempt(claim, AttemptResult::RetryableError, Some(error))?;
            Ok(Finished::Retrying)
        }
        Next::Fail {
            error,
            result,
            abandoned,
        } => {
            if !tx.fail(claim, error, *abandoned)? {
                return Ok(Finished::LeaseLost);
            }
            tx.close_attempt(claim, *result, Some(error))?;
            Ok(Finished::Failed)
        }
    }
}

/// The loyalty credit: consumer dedup row, business-key row and balance, all in the
/// transaction that also completes the event. All or nothing.
fn apply(
    tx: &mut dyn FinishStatements,
    claim: &ClaimRef,
    effect: &Effect,
) -> StoreResult<(Outcome, AttemptResult)> {
    let Effect::LoyaltyCredit {
        consumer,
        order_id,
        customer_id,
        points,
    } = effect;
    if !tx.mark_processed(consumer, claim, Outcome::Credited)? {
        // A forced re-run: the effect already happened; report what it was and move nothing.
        let previous = tx.processed_outcome(consumer, claim)?;
        let outcome = Outcome::parse(&previous).ok_or_else(|| {
            StoreError::Internal(anyhow::anyhow!("unknown stored outcome {previous}"))
        })?;
        return Ok((outcome, AttemptResult::AlreadyProcessed));
    }
    if !tx.insert_credit(claim, order_id, customer_id, *points)? {
        tx.set_processed_outcome(consumer, claim, Outcome::DuplicateOrder)?;
        return Ok((Outcome::DuplicateOrder, AttemptResult::Ok));
    }
    tx.add_to_balance(customer_id, *points)?;
    Ok((Outcome::Credited, AttemptResult::Ok))
}

/// Why an ops retry of one event is refused (SPEC section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryRefusal {
    /// Pending or claimed: it will run anyway.
    Unfinished,
    /// Completed, or an at-most-once call abandoned with its outcome unknown: only a
    /// deliberate `force` runs it again.
    NeedsForce,
    /// A tombstone: its body is gone, so it can never run again, forced or not.
    Purged,
}

impl RetryRefusal {
    /// The answer to the ops retry of `event`.
    pub fn answer(self, event: EventRecord) -> RetryOutcome {
        match self {
            RetryRefusal::Unfinished => RetryOutcome::Unchanged(event),
            RetryRefusal::NeedsForce => RetryOutcome::NeedsForce(event),
            RetryRefusal::Purged => RetryOutcome::Purged(event),
        }
    }
}

/// One subscription's state of an event, as a retry weighs it.
#[derive(Debug, Clone)]
pub struct StateRow {
    pub sub: i64,
    pub status: Status,
    pub abandoned: bool,
    pub purged: bool,
}

/// What an ops retry of one event does, the same on every store.
#[derive(Debug)]
pub enum RetryPlan {
    /// Move these states back to pending (fenced on the status each was read with).
    Retry(Vec<StateRow>),
    /// Answer without a change (the refusal says how).
    Refuse(RetryRefusal),
    /// The event has no state in that subscription, and will not get one.
    NotFound,
}

/// The retry of `event`, whose live subscriptions' states are `states`: with a subscription,
/// its state (an event not fanned out yet is pending in it already); without, each failed
/// state, or, when none failed, what the summary says (a completed event runs again in each
/// subscription with `force`; one pending or claimed somewhere is left alone).
pub fn plan_retry(
    event: &EventRecord,
    states: &[StateRow],
    sub: Option<i64>,
    force: bool,
) -> RetryPlan {
    let targets: Vec<StateRow> = match sub {
        Some(id) => match states.iter().find(|s| s.sub == id) {
            Some(state) => vec![state.clone()],
            None if event.status == Status::Pending => {
                return RetryPlan::Refuse(RetryRefusal::Unfinished);
            }
            None => return RetryPlan::NotFound,
        },
        None => {
            let failed: Vec<StateRow> = states
                .iter()
                .filter(|s| s.status == Status::Failed)
                .cloned()
                .collect();
            if !failed.is_empty() {
                failed
            } else if let Err(refusal) = may_retry_event(event, force) {
                return RetryPlan::Refuse(refusal);
            } else {
                states
                    .iter()
                    .filter(|s| s.status == Status::Completed)
                    .cloned()
                    .collect()
            }
        }
    };
    if targets.is_empty() {
        return match may_retry_event(event, force) {
            Err(refusal) => RetryPlan::Refuse(refusal),
            Ok(()) => RetryPlan::Refuse(RetryRefusal::Unfinished),
        };
    }
    for t in &targets {
        if let Err(refusal) = may_retry(t.status, t.abandoned, t.purged, force) {
            return RetryPlan::Refuse(refusal);
        }
    }
    RetryPlan::Retry(targets)
}

/// [`may_retry`] for a stored event.
pub fn may_retry_event(event: &EventRecord, force: bool) -> Result<(), RetryRefusal> {
    may_retry(
        event.status,
        event.abandoned,
        event.purged_at.is_some(),
        force,
    )
}

/// Whether an ops retry may move an event in this state back to pending. Bulk retry asks with
/// `force` off: abandoned events each need a deliberate forced retry of their own.
pub fn may_retry(
    status: Status,
    abandoned: bool,
    purged: bool,
    force: bool,
) -> Result<(), RetryRefusal> {
    match status {
        _ if purged => Err(RetryRefusal::Purged),
        // Stored: no subscription took it, so there is nothing to run again.
        Status::Pending | Status::Claimed | Status::Stored => Err(RetryRefusal::Unfinished),
        Status::Failed if !abandoned || force => Ok(()),
        Status::Completed if force => Ok(()),
        Status::Failed | Status::Completed => Err(RetryRefusal::NeedsForce),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_follow_the_rule_of_spec_section_5() {
        use RetryRefusal::*;
        use Status::*;
        let cases = [
            // (status, abandoned, purged, force) => expected
            ((Failed, false, false, false), Ok(())),
            ((Failed, true, false, false), Err(NeedsForce)),
            ((Failed, true, false, true), Ok(())),
            ((Completed, false, false, false), Err(NeedsForce)),
            ((Completed, false, false, true), Ok(())),
            ((Pending, false, false, true), Err(Unfinished)),
            ((Claimed, false, false, false), Err(Unfinished)),
            ((Completed, false, true, true), Err(Purged)),
            ((Failed, false, true, false), Err(Purged)),
        ];
        for ((status, abandoned, purged, force), expected) in cases {
            assert_eq!(
                may_retry(status, abandoned, purged, force),
                expected,
                "{status:?} abandoned={abandoned} purged={purged} force={force}"
            );
        }
    }
}
