//! Finishing claimed events on SQLite: the statements of [`FinishStatements`] over the batch's
//! transaction. What they mean (the loyalty guard's outcomes, a refused effect) is decided in
//! `store::rules`, the same for every store.

use rusqlite::types::Null;
use rusqlite::{ErrorCode, Transaction, params};

use super::consume::{
    COMPLETE, COMPLETE_AT_ROW, FAIL, Prepared, RETRY, close_attempt, fenced, fenced_at_row,
};
use crate::store::rules::{self, Credit, FinishStatements};
use crate::store::{AttemptResult, ClaimRef, Finish, Finished, Outcome, StoreError, StoreResult};

/// The batch's transaction, its cached statements and the time every write records.
struct Statements<'c> {
    prepared: Prepared<'c>,
    now: i64,
}

impl FinishStatements for Statements<'_> {
    fn complete(&mut self, items: &[(&ClaimRef, Outcome)]) -> StoreResult<Vec<bool>> {
        let now = self.now;
        let p = &mut self.prepared;
        items
            .iter()
            .map(|(claim, outcome)| {
                let fences = (COMPLETE_AT_ROW, COMPLETE);
                fenced_at_row(p, fences, claim, now, &outcome.as_str(), &Null)
            })
            .collect()
    }

    fn retry_at(&mut self, items: &[(&ClaimRef, i64, &str)]) -> StoreResult<Vec<bool>> {
        let now = self.now;
        let p = &mut self.prepared;
        items
            .iter()
            .map(|(claim, at, error)| fenced(p, RETRY, claim, now, at, error))
            .collect()
    }

    fn fail(&mut self, items: &[(&ClaimRef, &str, bool)]) -> StoreResult<Vec<bool>> {
        let now = self.now;
        let p = &mut self.prepared;
        items
            .iter()
            .map(|(claim, error, abandoned)| fenced(p, FAIL, claim, now, error, abandoned))
            .collect()
    }

    fn set_outcomes(&mut self, items: &[(&ClaimRef, Outcome)]) -> StoreResult<()> {
        let statement = self
            .prepared
            .get("UPDATE event_state SET outcome = ?2 WHERE seq = ?1 AND sub = ?3")?;
        for (claim, outcome) in items {
            statement.execute(params![claim.seq, outcome.as_str(), claim.subscription])?;
        }
        Ok(())
    }

    fn close_attempts(
        &mut self,
        items: &[(&ClaimRef, AttemptResult, Option<&str>)],
    ) -> StoreResult<()> {
        for (claim, result, error) in items {
            close_attempt(&mut self.prepared, claim, *result, *error, self.now)?;
        }
        Ok(())
    }

    fn mark_processed(
        &mut self,
        items: &[(&str, &ClaimRef)],
        outcome: Outcome,
    ) -> StoreResult<Vec<bool>> {
        let now = self.now;
        let statement = self.prepared.get(
            "INSERT INTO processed_events (consumer, source, event_id, outcome, processed_at)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
        )?;
        items
            .iter()
            .map(|(consumer, claim)| {
                let inserted = statement.execute(params![
                    consumer,
                    claim.source,
                    claim.event_id,
                    outcome.as_str(),
                    now
                ])?;
                Ok(inserted == 1)
            })
            .collect()
    }

    fn processed_outcome(&mut self, consumer: &str, claim: &ClaimRef) -> StoreResult<String> {
        Ok(self
            .prepared
            .get(
                "SELECT outcome FROM processed_events
                  WHERE consumer = ?1 AND source = ?2 AND event_id = ?3",
            )?
            .query_row(params![consumer, claim.source, claim.event_id], |r| {
                r.get(0)
            })?)
    }

    fn set_processed_outcomes(
        &mut self,
        items: &[(&str, &ClaimRef)],
        outcome: Outcome,
    ) -> StoreResult<()> {
        let statement = self.prepared.get(
            "UPDATE processed_events SET outcome = ?4
              WHERE consumer = ?1 AND source = ?2 AND event_id = ?3",
        )?;
        for (consumer, claim) in items {
            statement.execute(params![
                consumer,
                claim.source,
                claim.event_id,
                outcome.as_str()
            ])?;
        }
        Ok(())
    }

    fn insert_credits(&mut self, items: &[Credit<'_>]) -> StoreResult<Vec<bool>> {
        let now = self.now;
        let statement = self.prepared.get(
            "INSERT INTO loyalty_credits (order_id, customer_id, points, source, event_id,
                                          credited_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (order_id) DO NOTHING",
        )?;
        items
            .iter()
            .map(|c| {
                let inserted = statement.execute(params![
                    c.order_id,
                    c.customer_id,
                    c.points,
                    c.claim.source,
                    c.claim.event_id,
                    now
                ])?;
                Ok(inserted == 1)
            })
            .collect()
    }

    fn add_to_balance(&mut self, customer_id: &str, points: i64) -> StoreResult<()> {
        self.prepared
            .get(
                "INSERT INTO loyalty_balances (customer_id, balance) VALUES (?1, ?2)
                 ON CONFLICT (customer_id) DO UPDATE SET balance = balance + excluded.balance",
            )?
            .execute(params![customer_id, points])?;
        Ok(())
    }

    fn savepoint(&mut self) -> StoreResult<()> {
        self.prepared.get("SAVEPOINT finish_event")?.execute([])?;
        Ok(())
    }

    fn rollback_to_savepoint(&mut self) -> StoreResult<()> {
        self.prepared.get("ROLLBACK TO finish_event")?.execute([])?;
        Ok(())
    }

    fn release_savepoint(&mut self) -> StoreResult<()> {
        self.prepared.get("RELEASE finish_event")?.execute([])?;
        Ok(())
    }

    fn is_refusal(&self, error: &StoreError) -> bool {
        refused_by_a_constraint(error)
    }
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

/// Finish a batch in the caller's transaction ([`rules::finish_all`]). Without `isolate` no
/// savepoint at all: a savepoint over the whole batch made SQLite spill its sub-journal to a
/// temporary file at every batch (measured 7% slower than a savepoint per event), and a
/// savepoint per event costs two statements per event, 7% of the drain's instructions.
pub(super) fn finish_all(
    tx: &Transaction<'_>,
    items: &[Finish],
    now: i64,
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
    let mut statements = Statements {
        prepared: Prepared::new(tx),
        now,
    };
    let finished = rules::finish_all(&mut statements, items, isolate)?;
    super::customers::list_if_due(tx)?;
    Ok(finished)
}
