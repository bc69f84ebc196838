//! Finishing claimed events on PostgreSQL: the statements of [`FinishStatements`] over the
//! batch's transaction. What they mean (the loyalty guard's outcomes, a refused effect) is
//! decided in `store::rules`, the same for every store.
//!
//! Two nodes finishing events of the same order at once: the second `INSERT INTO
//! loyalty_credits` waits on the unique key until the first commits, then inserts nothing
//! (`ON CONFLICT DO NOTHING`), so the order is credited once and the second event completes as
//! `duplicate_order`. A refused statement aborts a PostgreSQL transaction, which is why
//! `rules::finish_all` runs the batch again with a savepoint per event after a refusal.
//!
//! Lock order: batches finished at once on several workers or nodes lock order keys (the
//! credit's unique key) and balances (one row per customer). Taken in each batch's own order,
//! two batches crediting two customers in opposite orders deadlock, and PostgreSQL aborts one
//! of them (seen: the six-worker conformance tests). So a batch takes its order keys in
//! ascending order (items are finished sorted by order id) and its balances after all of them,
//! in ascending customer order (deferred to the end of the batch's writes, in the same
//! transaction): no two batches can wait on each other.

use super::NOW_MS;
use super::errors::refused_by_a_constraint;
use super::session::Db;
use crate::store::rules::{self, FinishStatements};
use crate::store::{
    AttemptResult, ClaimRef, Effect, Finish, Finished, Next, Outcome, StoreError, StoreResult,
};

/// The worker's fenced transition: only while its token holds the event and its lease runs by
/// the database's clock. $1 seq, $2 claim token, then the set's own values.
fn live_fence(set: &str) -> String {
    format!(
        "UPDATE event_state SET {set}, claim_token = NULL, claimed_until = NULL, claimed_by = NULL
          WHERE seq = $1 AND claim_token = $2 AND status = 'claimed'
            AND claimed_until > {NOW_MS}"
    )
}

/// The batch's transaction, the statements it runs and the time every write records.
struct Statements<'d, 'c> {
    db: &'d mut Db<'c>,
    now: i64,
    complete: String,
    retry: String,
    fail: String,
    /// Balance additions not yet written (`None`: written at once, as in the isolated rerun,
    /// where a refused addition must fail its own event inside its savepoint).
    balances: Option<Vec<(String, i64)>>,
}

impl Statements<'_, '_> {
    fn add_now(&mut self, customer_id: &str, points: i64) -> StoreResult<()> {
        self.db.execute(
            "INSERT INTO loyalty_balances (customer_id, balance) VALUES ($1, $2)
             ON CONFLICT (customer_id)
             DO UPDATE SET balance = loyalty_balances.balance + excluded.balance",
            &[&customer_id, &points],
        )?;
        Ok(())
    }

    /// Write the deferred balance additions, in ascending customer order.
    fn flush_balances(&mut self) -> StoreResult<()> {
        let mut pending = self.balances.take().unwrap_or_default();
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        for (customer_id, points) in pending {
            self.add_now(&customer_id, points)?;
        }
        Ok(())
    }
}

impl FinishStatements for Statements<'_, '_> {
    fn complete(&mut self, claim: &ClaimRef, outcome: Outcome) -> StoreResult<bool> {
        let moved = self.db.execute(
            &self.complete,
            &[&claim.seq, &claim.claim_token, &self.now, &outcome.as_str()],
        )?;
        Ok(moved == 1)
    }

    /// Due at the database's now plus the backoff the consumer chose (`at - now` in its clock).
    fn retry_at(&mut self, claim: &ClaimRef, at: i64, error: &str) -> StoreResult<bool> {
        let delay = (at - self.now).max(0);
        let moved = self.db.execute(
            &self.retry,
            &[&claim.seq, &claim.claim_token, &delay, &error],
        )?;
        Ok(moved == 1)
    }

    fn fail(&mut self, claim: &ClaimRef, error: &str, abandoned: bool) -> StoreResult<bool> {
        let moved = self.db.execute(
            &self.fail,
            &[&claim.seq, &claim.claim_token, &error, &abandoned],
        )?;
        Ok(moved == 1)
    }

    fn set_outcome(&mut self, claim: &ClaimRef, outcome: Outcome) -> StoreResult<()> {
        self.db.execute(
            "UPDATE event_state SET outcome = $2 WHERE seq = $1 AND sub = $3",
            &[&claim.seq, &outcome.as_str(), &claim.subscription],
        )?;
        Ok(())
    }

    fn close_attempt(
        &mut self,
        claim: &ClaimRef,
        result: AttemptResult,
        error: Option<&str>,
    ) -> StoreResult<()> {
        self.db.execute(
            "UPDATE event_attempts SET finished_at = $3, result = $4, error = $5
              WHERE event_seq = $1 AND sub = $6 AND attempt = $2",
            &[
                &claim.seq,
                &claim.attempt,
                &self.now,
                &result.as_str(),
                &error,
                &claim.subscription,
            ],
        )?;
        Ok(())
    }

    fn mark_processed(
        &mut self,
        consumer: &str,
        claim: &ClaimRef,
        outcome: Outcome,
    ) -> StoreResult<bool> {
        let inserted = self.db.execute(
            "INSERT INTO processed_events (consumer, source, event_id, outcome, processed_at)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            &[
                &consumer,
                &claim.source,
                &claim.event_id,
                &outcome.as_str(),
                &self.now,
            ],
        )?;
        Ok(inserted == 1)
    }

    fn processed_outcome(&mut self, consumer: &str, claim: &ClaimRef) -> StoreResult<String> {
        Ok(self
            .db
            .query_one(
                "SELECT outcome FROM processed_events
                  WHERE consumer = $1 AND source = $2 AND event_id = $3",
                &[&consumer, &claim.source, &claim.event_id],
            )?
            .try_get(0)?)
    }

    fn set_processed_outcome(
        &mut self,
        consumer: &str,
        claim: &ClaimRef,
        outcome: Outcome,
    ) -> StoreResult<()> {
        self.db.execute(
            "UPDATE processed_events SET outcome = $4
              WHERE consumer = $1 AND source = $2 AND event_id = $3",
            &[&consumer, &claim.source, &claim.event_id, &outcome.as_str()],
        )?;
        Ok(())
    }

    fn insert_credit(
        &mut self,
        claim: &ClaimRef,
        order_id: &str,
        customer_id: &str,
        points: i64,
    ) -> StoreResult<bool> {
        let inserted = self.db.execute(
            "INSERT INTO loyalty_credits (order_id, customer_id, points, source, event_id,
                                          credited_at)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (order_id) DO NOTHING",
            &[
                &order_id,
                &customer_id,
                &points,
                &claim.source,
                &claim.event_id,
                &self.now,
            ],
        )?;
        Ok(inserted == 1)
    }

    /// A sum that would leave `bigint` is refused (numeric_value_out_of_range): a refusal.
    /// Deferred to the end of the batch (see the module's lock order).
    fn add_to_balance(&mut self, customer_id: &str, points: i64) -> StoreResult<()> {
        match &mut self.balances {
            Some(pending) => {
                pending.push((customer_id.to_string(), points));
                Ok(())
            }
            None => self.add_now(customer_id, points),
        }
    }

    fn savepoint(&mut self) -> StoreResult<()> {
        self.db.batch("SAVEPOINT finish_event")
    }

    fn rollback_to_savepoint(&mut self) -> StoreResult<()> {
        self.db.batch("ROLLBACK TO SAVEPOINT finish_event")
    }

    fn release_savepoint(&mut self) -> StoreResult<()> {
        self.db.batch("RELEASE SAVEPOINT finish_event")
    }

    fn is_refusal(&self, error: &StoreError) -> bool {
        refused_by_a_constraint(error)
    }
}

/// The order key an item's effect locks, if any: items are finished in this order.
fn order_key(item: &Finish) -> Option<&str> {
    match &item.next {
        Next::Complete {
            effect: Some(Effect::LoyaltyCredit { order_id, .. }),
            ..
        } => Some(order_id),
        _ => None,
    }
}

/// Finish a batch in the caller's transaction (see [`rules::finish_all`]), in the lock order
/// the module describes; results come back in the items' order.
pub(super) fn finish_all(
    db: &mut Db<'_>,
    items: &[Finish],
    now: i64,
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| order_key(&items[a]).cmp(&order_key(&items[b])));
    let sorted: Vec<Finish> = order.iter().map(|&i| items[i].clone()).collect();
    let mut statements = Statements {
        db,
        now,
        complete: live_fence(
            "status = 'completed', completed_at = $3, outcome = $4, last_error = NULL, \
             next_attempt_at = NULL",
        ),
        retry: live_fence(&format!(
            "status = 'pending', next_attempt_at = {NOW_MS} + $3, last_error = $4"
        )),
        fail: live_fence(
            "status = 'failed', last_error = $3, abandoned = $4, next_attempt_at = NULL",
        ),
        balances: (!isolate).then(Vec::new),
    };
    let finished = rules::finish_all(&mut statements, &sorted, isolate)?;
    statements.flush_balances()?;
    let mut results = vec![Finished::LeaseLost; items.len()];
    for (result, &i) in finished.into_iter().zip(&order) {
        results[i] = result;
    }
    Ok(results)
}
