//! Finishing a batch of claimed events, written once for every store.
//!
//! A store supplies the statements ([`FinishStatements`]), each over a whole phase of the
//! batch: every fence at once, every dedup row at once, every credit at once. SQLite runs each
//! item's statement in turn (a statement costs no round trip there); PostgreSQL runs one
//! statement per phase over arrays, so a batch costs a handful of round trips whatever its
//! size. What the answers mean (which outcome a refused credit has, what a refused effect does
//! to its event) is decided here.

use crate::store::{
    AttemptResult, ClaimRef, Effect, Finish, Finished, Next, Outcome, StoreError, StoreResult,
};

/// A loyalty credit to insert, keyed on its order.
#[derive(Debug, Clone, Copy)]
pub struct Credit<'a> {
    pub claim: &'a ClaimRef,
    pub order_id: &'a str,
    pub customer_id: &'a str,
    pub points: i64,
}

/// The statements finishing a batch needs, each run in the transaction the store opened for
/// the batch over a slice of items, answering per item in the slice's order. Times are the
/// store's: the caller's clock, or the database's. No slice is empty.
pub trait FinishStatements {
    /// Fenced transitions: each item writes only while its claim's token still holds the event
    /// (status `claimed`, same token, lease not run out); the answer is whether it did.
    fn complete(&mut self, items: &[(&ClaimRef, Outcome)]) -> StoreResult<Vec<bool>>;
    /// `at`: when the event is due again.
    fn retry_at(&mut self, items: &[(&ClaimRef, i64, &str)]) -> StoreResult<Vec<bool>>;
    /// `(claim, error, abandoned)`.
    fn fail(&mut self, items: &[(&ClaimRef, &str, bool)]) -> StoreResult<Vec<bool>>;
    /// Replace the outcome a fenced `complete` wrote (the guards said otherwise).
    fn set_outcomes(&mut self, items: &[(&ClaimRef, Outcome)]) -> StoreResult<()>;
    /// Close the attempts the claims opened in the history.
    fn close_attempts(
        &mut self,
        items: &[(&ClaimRef, AttemptResult, Option<&str>)],
    ) -> StoreResult<()>;

    /// Each consumer's dedup row for its event, with `outcome`: `false` where it exists
    /// already (unique on consumer, source, event id).
    fn mark_processed(
        &mut self,
        items: &[(&str, &ClaimRef)],
        outcome: Outcome,
    ) -> StoreResult<Vec<bool>>;
    /// The outcome recorded by `mark_processed` (or `set_processed_outcomes`): read only for
    /// a forced re-run, so one at a time.
    fn processed_outcome(&mut self, consumer: &str, claim: &ClaimRef) -> StoreResult<String>;
    fn set_processed_outcomes(
        &mut self,
        items: &[(&str, &ClaimRef)],
        outcome: Outcome,
    ) -> StoreResult<()>;
    /// The credit rows keyed on their orders, inserted in the slice's order: `false` where
    /// the order was credited already, by an earlier transaction or an earlier item.
    fn insert_credits(&mut self, items: &[Credit<'_>]) -> StoreResult<Vec<bool>>;
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
/// Refusals are rare, so the store first runs the batch with `isolate` off: the whole batch at
/// once, no savepoint at all. If an effect is refused ([`FinishStatements::is_refusal`]), the
/// store rolls the transaction back and runs it again with `isolate` on: each event alone in
/// its own savepoint, the refused one failed (permanent: the same effect would be refused
/// again) with the database's reason, so that it is neither lost nor retried forever, and the
/// others committed. Any other error fails the whole transaction.
pub fn finish_all(
    tx: &mut dyn FinishStatements,
    items: &[Finish],
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
    if !isolate {
        return finish_batch(tx, items);
    }
    let mut results = Vec::with_capacity(items.len());
    for one in items.chunks(1) {
        let item = &one[0];
        tx.savepoint()?;
        let finished = match finish_batch(tx, one) {
            Ok(mut finished) => finished.remove(0),
            Err(e) if tx.is_refusal(&e) => {
                tx.rollback_to_savepoint()?;
                let error = format!("the store refused the event's effect: {e}");
                tracing::warn!(
                    source = %item.claim.source,
                    event_id = %item.claim.event_id,
                    %error,
                    "event failed"
                );
                if tx.fail(&[(&item.claim, &error, false)])?[0] {
                    let closing = (&item.claim, AttemptResult::PermanentError, Some(&*error));
                    tx.close_attempts(&[closing])?;
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

/// The batch, phase by phase: the fences of each transition, then the effects of the events
/// whose fence held, then the outcomes the guards changed and the attempts' results. Every
/// guard is a unique key answered inside this transaction, in the items' order.
fn finish_batch(tx: &mut dyn FinishStatements, items: &[Finish]) -> StoreResult<Vec<Finished>> {
    let mut results = vec![Finished::LeaseLost; items.len()];
    let mut closes: Vec<(&ClaimRef, AttemptResult, Option<&str>)> = Vec::new();

    // The fences.
    let (mut completes, mut retries, mut fails) = (Vec::new(), Vec::new(), Vec::new());
    for (i, item) in items.iter().enumerate() {
        match &item.next {
            Next::Complete { outcome, .. } => completes.push((i, (&item.claim, *outcome))),
            Next::Retry { at, error } => retries.push((i, (&item.claim, *at, error.as_str()))),
            Next::Fail {
                error, abandoned, ..
            } => fails.push((i, (&item.claim, error.as_str(), *abandoned))),
        }
    }
    for i in moved(&retries, |r| tx.retry_at(r))? {
        let Next::Retry { error, .. } = &items[i].next else {
            unreachable!("only retries are in the retry phase")
        };
        results[i] = Finished::Retrying;
        closes.push((&items[i].claim, AttemptResult::RetryableError, Some(error)));
    }
    for i in moved(&fails, |f| tx.fail(f))? {
        let Next::Fail { error, result, .. } = &items[i].next else {
            unreachable!("only failures are in the fail phase")
        };
        results[i] = Finished::Failed;
        closes.push((&items[i].claim, *result, Some(error)));
    }
    let completed = moved(&completes, |c| tx.complete(c))?;

    // The effects of the completed events; the rest succeed as their handler said.
    let mut applied: Vec<(usize, Outcome, AttemptResult)> = Vec::with_capacity(completed.len());
    let mut credits = Vec::new();
    for &i in &completed {
        match &items[i].next {
            Next::Complete {
                effect: Some(effect),
                ..
            } => credits.push((i, effect)),
            Next::Complete { outcome, .. } => applied.push((i, *outcome, AttemptResult::Ok)),
            _ => unreachable!("only completions are in the complete phase"),
        }
    }
    applied.extend(apply_credits(tx, items, &credits)?);

    let mut changed = Vec::new();
    for &(i, outcome, result) in &applied {
        let Next::Complete {
            outcome: expected, ..
        } = &items[i].next
        else {
            unreachable!("only completions have effects")
        };
        // The fence wrote the handler's expected outcome; the guards may say otherwise.
        if outcome != *expected {
            changed.push((&items[i].claim, outcome));
        }
        results[i] = Finished::Completed { outcome, result };
        closes.push((&items[i].claim, result, None));
    }
    if !changed.is_empty() {
        tx.set_outcomes(&changed)?;
    }
    if !closes.is_empty() {
        tx.close_attempts(&closes)?;
    }
    Ok(results)
}

/// Run one fenced phase over `phase` (each item with its index in the batch) and answer the
/// indices whose fence held.
fn moved<T>(
    phase: &[(usize, T)],
    run: impl FnOnce(&[T]) -> StoreResult<Vec<bool>>,
) -> StoreResult<Vec<usize>>
where
    T: Copy,
{
    if phase.is_empty() {
        return Ok(Vec::new());
    }
    let args: Vec<T> = phase.iter().map(|(_, t)| *t).collect();
    let held = run(&args)?;
    Ok(phase
        .iter()
        .zip(held)
        .filter_map(|(&(i, _), held)| held.then_some(i))
        .collect())
}

/// The loyalty credits of the completed events `credits` (index in the batch, effect): the
/// consumer's dedup row, the business-key row and the balance, all in the transaction that
/// also completes the events. Answers each event's outcome and attempt result.
fn apply_credits(
    tx: &mut dyn FinishStatements,
    items: &[Finish],
    credits: &[(usize, &Effect)],
) -> StoreResult<Vec<(usize, Outcome, AttemptResult)>> {
    let mut applied = Vec::with_capacity(credits.len());
    if credits.is_empty() {
        return Ok(applied);
    }
    let dedup: Vec<(&str, &ClaimRef)> = credits
        .iter()
        .map(|&(i, Effect::LoyaltyCredit { consumer, .. })| (*consumer, &items[i].claim))
        .collect();
    let first = tx.mark_processed(&dedup, Outcome::Credited)?;
    let mut fresh = Vec::with_capacity(credits.len());
    for (&(i, effect), first) in credits.iter().zip(first) {
        let Effect::LoyaltyCredit {
            consumer,
            order_id,
            customer_id,
            points,
        } = effect;
        let claim = &items[i].claim;
        if first {
            fresh.push((
                i,
                *consumer,
                Credit {
                    claim,
                    order_id,
                    customer_id,
                    points: *points,
                },
            ));
            continue;
        }
        // A forced re-run: the effect already happened; report what it was and move nothing.
        let previous = tx.processed_outcome(consumer, claim)?;
        let outcome = Outcome::parse(&previous).ok_or_else(|| {
            StoreError::Internal(anyhow::anyhow!("unknown stored outcome {previous}"))
        })?;
        applied.push((i, outcome, AttemptResult::AlreadyProcessed));
    }
    if fresh.is_empty() {
        return Ok(applied);
    }
    let rows: Vec<Credit<'_>> = fresh.iter().map(|(_, _, credit)| *credit).collect();
    let credited = tx.insert_credits(&rows)?;
    let mut duplicates = Vec::new();
    for ((i, consumer, credit), credited) in fresh.iter().zip(credited) {
        if credited {
            tx.add_to_balance(credit.customer_id, credit.points)?;
            applied.push((*i, Outcome::Credited, AttemptResult::Ok));
        } else {
            duplicates.push((*consumer, credit.claim));
            applied.push((*i, Outcome::DuplicateOrder, AttemptResult::Ok));
        }
    }
    if !duplicates.is_empty() {
        tx.set_processed_outcomes(&duplicates, Outcome::DuplicateOrder)?;
    }
    Ok(applied)
}
