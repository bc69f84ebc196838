//! Finishing claimed events on PostgreSQL: the statements of [`FinishStatements`] over the
//! batch's transaction, each one statement over arrays (`unnest`) for the whole batch, so a
//! batch costs a handful of round trips rather than several per event. What they mean (the
//! loyalty guard's outcomes, a refused effect) is decided in `store::rules`, the same for every
//! store.
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

use std::collections::{HashMap, HashSet};

use super::NOW_MS;
use super::errors::refused_by_a_constraint;
use super::session::Db;
use crate::store::rules::{self, Credit, FinishStatements};
use crate::store::{
    AttemptResult, ClaimRef, Effect, Finish, Finished, Next, Outcome, StoreError, StoreResult,
};

/// The worker's fenced transition over a batch: each row only while its token holds the event
/// and its lease runs by the database's clock. `u` is the batch (`seq`, `sub`, `token` and the
/// set's own columns, from $4) from `unnest`; answers the tokens whose fence held.
///
/// Each row is found by its whole primary key, and only by it: joined on `seq` alone, or with
/// `status = 'claimed'` in the condition, the plan could read every claimed row through
/// `events_leases` (whose statistics may say it is nearly empty while it holds thousands of
/// claims and their dead entries) to pick the batch's out of them, at a cost that grew with
/// the backlog and the workers (docs/postgres.md, "Plans that read too much"). A token is set
/// exactly while its row is claimed (a CHECK of the table), so matching it says `claimed`.
fn live_fence(set: &str, columns: &str, types: &str) -> String {
    format!(
        "UPDATE event_state s SET {set}, claim_token = NULL, claimed_until = NULL,
                                  claimed_by = NULL
           FROM unnest($1::bigint[], $2::bigint[], $3::text[], {types})
                AS u(seq, sub, token, {columns})
          WHERE s.seq = u.seq AND s.sub = u.sub AND s.claim_token = u.token
            AND s.claimed_until > {NOW_MS}
         RETURNING u.token"
    )
}

/// A batch's completions: $4 their outcomes, $5 the time.
pub(super) fn complete_sql() -> String {
    live_fence(
        "status = 'completed', completed_at = $5, outcome = u.outcome, \
         last_error = NULL, next_attempt_at = NULL",
        "outcome",
        "$4::text[]",
    )
}

/// Which of `tokens` are among the `rows` a fenced statement answered.
fn held(tokens: &[String], rows: &[postgres::Row]) -> StoreResult<Vec<bool>> {
    let mut moved = HashSet::with_capacity(rows.len());
    for row in rows {
        moved.insert(row.try_get::<_, String>(0)?);
    }
    Ok(tokens.iter().map(|t| moved.contains(t)).collect())
}

/// Rows that an `INSERT … ON CONFLICT DO NOTHING RETURNING` answered, as keys to take one by
/// one: the items carrying the same key take them in order, so that only as many items as rows
/// were inserted count as first.
struct Inserted(HashMap<Vec<String>, usize>);

impl Inserted {
    fn new(rows: &[postgres::Row], width: usize) -> StoreResult<Inserted> {
        let mut keys = HashMap::with_capacity(rows.len());
        for row in rows {
            let key = (0..width)
                .map(|i| row.try_get::<_, String>(i))
                .collect::<Result<Vec<_>, _>>()?;
            *keys.entry(key).or_insert(0) += 1;
        }
        Ok(Inserted(keys))
    }

    fn take(&mut self, key: Vec<String>) -> bool {
        match self.0.get_mut(&key) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

/// The seqs, subscriptions and tokens of `claims`, as statement arrays.
fn claim_arrays<'a>(
    claims: impl Iterator<Item = &'a ClaimRef>,
) -> (Vec<i64>, Vec<i64>, Vec<String>) {
    let mut arrays = (Vec::new(), Vec::new(), Vec::new());
    for claim in claims {
        arrays.0.push(claim.seq);
        arrays.1.push(claim.subscription);
        arrays.2.push(claim.claim_token.clone());
    }
    arrays
}

/// The batch's transaction and the time every write records.
struct Statements<'d, 'c> {
    db: &'d mut Db<'c>,
    now: i64,
    /// Balance additions not yet written (`None`: written at once, as in the isolated rerun,
    /// where a refused addition must fail its own event inside its savepoint).
    balances: Option<Vec<(String, i64)>>,
}

impl Statements<'_, '_> {
    /// Add to balances, in one statement: each customer once, in ascending order (the
    /// module's lock order). A sum that would leave `bigint` is refused
    /// (numeric_value_out_of_range): a refusal.
    fn add(&mut self, additions: &[(String, i64)]) -> StoreResult<()> {
        if additions.is_empty() {
            return Ok(());
        }
        let (customers, points): (Vec<&str>, Vec<i64>) =
            additions.iter().map(|(c, p)| (c.as_str(), *p)).unzip();
        self.db.execute(
            "INSERT INTO loyalty_balances (customer_id, balance)
             SELECT c, sum(p)::bigint FROM unnest($1::text[], $2::bigint[]) AS u(c, p)
              GROUP BY c ORDER BY c
             ON CONFLICT (customer_id)
             DO UPDATE SET balance = loyalty_balances.balance + excluded.balance",
            &[&customers, &points],
        )?;
        Ok(())
    }

    /// Write the deferred balance additions.
    fn flush_balances(&mut self) -> StoreResult<()> {
        let pending = self.balances.take().unwrap_or_default();
        self.add(&pending)
    }
}

impl FinishStatements for Statements<'_, '_> {
    fn complete(&mut self, items: &[(&ClaimRef, Outcome)]) -> StoreResult<Vec<bool>> {
        let (seqs, subs, tokens) = claim_arrays(items.iter().map(|(c, _)| *c));
        let outcomes: Vec<&str> = items.iter().map(|(_, o)| o.as_str()).collect();
        let rows = self.db.query(
            &complete_sql(),
            &[&seqs, &subs, &tokens, &outcomes, &self.now],
        )?;
        held(&tokens, &rows)
    }

    /// Due at the database's now plus the backoff the consumer chose (`at - now` in its clock).
    fn retry_at(&mut self, items: &[(&ClaimRef, i64, &str)]) -> StoreResult<Vec<bool>> {
        let (seqs, subs, tokens) = claim_arrays(items.iter().map(|(c, _, _)| *c));
        let delays: Vec<i64> = items
            .iter()
            .map(|(_, at, _)| (at - self.now).max(0))
            .collect();
        let errors: Vec<&str> = items.iter().map(|(_, _, e)| *e).collect();
        let rows = self.db.query(
            &live_fence(
                &format!(
                    "status = 'pending', next_attempt_at = {NOW_MS} + u.delay, \
                     last_error = u.error"
                ),
                "delay, error",
                "$4::bigint[], $5::text[]",
            ),
            &[&seqs, &subs, &tokens, &delays, &errors],
        )?;
        held(&tokens, &rows)
    }

    fn fail(&mut self, items: &[(&ClaimRef, &str, bool)]) -> StoreResult<Vec<bool>> {
        let (seqs, subs, tokens) = claim_arrays(items.iter().map(|(c, _, _)| *c));
        let errors: Vec<&str> = items.iter().map(|(_, e, _)| *e).collect();
        let abandoned: Vec<bool> = items.iter().map(|(_, _, a)| *a).collect();
        let rows = self.db.query(
            &live_fence(
                "status = 'failed', last_error = u.error, abandoned = u.abandoned, \
                 next_attempt_at = NULL",
                "error, abandoned",
                "$4::text[], $5::boolean[]",
            ),
            &[&seqs, &subs, &tokens, &errors, &abandoned],
        )?;
        held(&tokens, &rows)
    }

    fn set_outcomes(&mut self, items: &[(&ClaimRef, Outcome)]) -> StoreResult<()> {
        let (seqs, subs, _) = claim_arrays(items.iter().map(|(c, _)| *c));
        let outcomes: Vec<&str> = items.iter().map(|(_, o)| o.as_str()).collect();
        self.db.execute(
            "UPDATE event_state s SET outcome = u.outcome
               FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(seq, sub, outcome)
              WHERE s.seq = u.seq AND s.sub = u.sub",
            &[&seqs, &subs, &outcomes],
        )?;
        Ok(())
    }

    fn close_attempts(
        &mut self,
        items: &[(&ClaimRef, AttemptResult, Option<&str>)],
    ) -> StoreResult<()> {
        let (seqs, subs, _) = claim_arrays(items.iter().map(|(c, _, _)| *c));
        let attempts: Vec<i64> = items.iter().map(|(c, _, _)| c.attempt).collect();
        let results: Vec<&str> = items.iter().map(|(_, r, _)| r.as_str()).collect();
        let errors: Vec<Option<&str>> = items.iter().map(|(_, _, e)| *e).collect();
        self.db.execute(
            "UPDATE event_attempts a SET finished_at = $6, result = u.result, error = u.error
               FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::text[])
                    AS u(seq, sub, attempt, result, error)
              WHERE a.event_seq = u.seq AND a.sub = u.sub AND a.attempt = u.attempt",
            &[&seqs, &subs, &attempts, &results, &errors, &self.now],
        )?;
        Ok(())
    }

    fn mark_processed(
        &mut self,
        items: &[(&str, &ClaimRef)],
        outcome: Outcome,
    ) -> StoreResult<Vec<bool>> {
        let consumers: Vec<&str> = items.iter().map(|(c, _)| *c).collect();
        let sources: Vec<&str> = items.iter().map(|(_, c)| c.source.as_str()).collect();
        let ids: Vec<&str> = items.iter().map(|(_, c)| c.event_id.as_str()).collect();
        let rows = self.db.query(
            "INSERT INTO processed_events (consumer, source, event_id, outcome, processed_at)
             SELECT c, s, e, $4, $5 FROM unnest($1::text[], $2::text[], $3::text[]) AS u(c, s, e)
             ON CONFLICT DO NOTHING
             RETURNING consumer, source, event_id",
            &[&consumers, &sources, &ids, &outcome.as_str(), &self.now],
        )?;
        let mut inserted = Inserted::new(&rows, 3)?;
        Ok(items
            .iter()
            .map(|(consumer, c)| {
                inserted.take(vec![
                    consumer.to_string(),
                    c.source.clone(),
                    c.event_id.clone(),
                ])
            })
            .collect())
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

    fn set_processed_outcomes(
        &mut self,
        items: &[(&str, &ClaimRef)],
        outcome: Outcome,
    ) -> StoreResult<()> {
        let consumers: Vec<&str> = items.iter().map(|(c, _)| *c).collect();
        let sources: Vec<&str> = items.iter().map(|(_, c)| c.source.as_str()).collect();
        let ids: Vec<&str> = items.iter().map(|(_, c)| c.event_id.as_str()).collect();
        self.db.execute(
            "UPDATE processed_events p SET outcome = $4
               FROM unnest($1::text[], $2::text[], $3::text[]) AS u(c, s, e)
              WHERE p.consumer = u.c AND p.source = u.s AND p.event_id = u.e",
            &[&consumers, &sources, &ids, &outcome.as_str()],
        )?;
        Ok(())
    }

    /// In the slice's order (`WITH ORDINALITY`): the items come sorted by order id, the
    /// module's lock order, and of two items of one order the first is credited.
    fn insert_credits(&mut self, items: &[Credit<'_>]) -> StoreResult<Vec<bool>> {
        let orders: Vec<&str> = items.iter().map(|c| c.order_id).collect();
        let customers: Vec<&str> = items.iter().map(|c| c.customer_id).collect();
        let points: Vec<i64> = items.iter().map(|c| c.points).collect();
        let sources: Vec<&str> = items.iter().map(|c| c.claim.source.as_str()).collect();
        let ids: Vec<&str> = items.iter().map(|c| c.claim.event_id.as_str()).collect();
        let rows = self.db.query(
            "INSERT INTO loyalty_credits (order_id, customer_id, points, source, event_id,
                                          credited_at)
             SELECT o, c, p, s, e, $6
               FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[])
                    WITH ORDINALITY AS u(o, c, p, s, e, n)
              ORDER BY n
             ON CONFLICT (order_id) DO NOTHING
             RETURNING order_id, source, event_id",
            &[&orders, &customers, &points, &sources, &ids, &self.now],
        )?;
        let mut inserted = Inserted::new(&rows, 3)?;
        Ok(items
            .iter()
            .map(|c| {
                inserted.take(vec![
                    c.order_id.to_string(),
                    c.claim.source.clone(),
                    c.claim.event_id.clone(),
                ])
            })
            .collect())
    }

    /// Deferred to the end of the batch (see the module's lock order).
    fn add_to_balance(&mut self, customer_id: &str, points: i64) -> StoreResult<()> {
        match &mut self.balances {
            Some(pending) => {
                pending.push((customer_id.to_string(), points));
                Ok(())
            }
            None => self.add(&[(customer_id.to_string(), points)]),
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
