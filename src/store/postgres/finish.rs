//! Finishing claimed events on PostgreSQL: the statements of [`FinishStatements`] over the
//! batch's transaction. What they mean (the loyalty guard's outcomes, a refused effect) is
//! decided in `store::rules`, the same for every store.
//!
//! Two nodes finishing events of the same order at once: the second `INSERT INTO
//! loyalty_credits` waits on the unique key until the first commits, then inserts nothing
//! (`ON CONFLICT DO NOTHING`), so the order is credited once and the second event completes as
//! `duplicate_order`. A refused statement aborts a PostgreSQL transaction, which is why
//! `rules::finish_all` runs the batch again with a savepoint per event after a refusal.

use super::NOW_MS;
use super::errors::refused_by_a_constraint;
use super::session::Db;
use crate::store::rules::{self, FinishStatements};
use crate::store::{AttemptResult, ClaimRef, Finish, Finished, Outcome, StoreError, StoreResult};

/// The worker's fenced transition: only while its token holds the event and its lease runs by
/// the database's clock. $1 seq, $2 claim token, then the set's own values.
fn live_fence(set: &str) -> String {
    format!(
        "UPDATE events SET {set}, claim_token = NULL, claimed_until = NULL, claimed_by = NULL
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
            "UPDATE events SET outcome = $2 WHERE seq = $1",
            &[&claim.seq, &outcome.as_str()],
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
              WHERE event_seq = $1 AND attempt = $2",
            &[
                &claim.seq,
                &claim.attempt,
                &self.now,
                &result.as_str(),
                &error,
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
    fn add_to_balance(&mut self, customer_id: &str, points: i64) -> StoreResult<()> {
        self.db.execute(
            "INSERT INTO loyalty_balances (customer_id, balance) VALUES ($1, $2)
             ON CONFLICT (customer_id)
             DO UPDATE SET balance = loyalty_balances.balance + excluded.balance",
            &[&customer_id, &points],
        )?;
        Ok(())
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

/// Finish a batch in the caller's transaction (see [`rules::finish_all`]).
pub(super) fn finish_all(
    db: &mut Db<'_>,
    items: &[Finish],
    now: i64,
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
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
    };
    rules::finish_all(&mut statements, items, isolate)
}
