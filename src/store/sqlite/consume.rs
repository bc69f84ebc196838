//! The consumer side: claim, finish (effect and completion), release, sweep.
//!
//! Claiming is a state transition, not a read followed by a write: one UPDATE moves due pending
//! rows to `claimed` and returns them. Every later transition is fenced by the claim token and
//! the lease, so a worker that lost its claim changes nothing.

use rusqlite::types::Null;
use rusqlite::{
    CachedStatement, Connection, ErrorCode, OptionalExtension, ToSql, Transaction, params,
};

use crate::config::DeliveryMode;
use crate::store::{
    AttemptResult, ClaimRef, Claimed, Effect, Finish, Finished, LoyaltyAccount, LoyaltyCredit,
    ModeOf, Next, Outcome, StoreError, StoreResult,
};

/// The claim: one statement moves due pending rows to `claimed` and returns them. The
/// candidates come from the partial index of due pending rows (named, so that the planner
/// cannot pick a status scan plus a sort whose cost grows with the backlog).
///
/// The limit is part of the text, not a parameter: SQLite plans with a bound LIMIT's value
/// and so re-prepares the statement at every new binding (measured: one full parse and plan
/// per claim). A worker uses one or two limits, so the statement cache holds them all.
pub fn claim_sql(limit: usize) -> String {
    format!(
        "UPDATE events
    SET status = 'claimed', claimed_by = ?1, claimed_until = ?2,
        attempts = attempts + 1, next_attempt_at = NULL,
        claim_token = lower(hex(randomblob(16)))
  WHERE rowid IN (SELECT rowid FROM events INDEXED BY events_due
                   WHERE status = 'pending' AND next_attempt_at <= ?3
                   ORDER BY next_attempt_at LIMIT {limit})
RETURNING source, event_id, event_type, attempts, attempts - budget_floor, claim_token,
          claimed_until, seq"
    )
}

pub(super) fn claim(
    tx: &Transaction<'_>,
    worker: &str,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Claimed>> {
    let claimed_until = now + lease_ms;
    let mut claimed = tx
        .prepare_cached(&claim_sql(limit))?
        .query_map(params![worker, claimed_until, now], |r| {
            Ok(Claimed {
                claim: ClaimRef {
                    source: r.get(0)?,
                    event_id: r.get(1)?,
                    seq: r.get(7)?,
                    attempt: r.get(3)?,
                    claim_token: r.get(5)?,
                },
                event_type: r.get(2)?,
                // Read below from event_payloads.
                payload: Vec::new(),
                content_type: None,
                budget_used: r.get(4)?,
                claimed_until: r.get(6)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut body =
        tx.prepare_cached("SELECT payload, content_type FROM event_payloads WHERE seq = ?1")?;
    for c in &mut claimed {
        (c.payload, c.content_type) =
            body.query_row([c.claim.seq], |r| Ok((r.get(0)?, r.get(1)?)))?;
    }
    let mut history = tx.prepare_cached(
        "INSERT INTO event_attempts (event_seq, attempt, worker, started_at)
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for c in &claimed {
        history.execute(params![c.claim.seq, c.claim.attempt, worker, now])?;
    }
    Ok(claimed)
}

/// The statements a batch runs, each taken from the connection's cache once per batch.
/// `prepare_cached` hashes the whole SQL text to find a statement and again to put it back:
/// per statement execution that was measured at about 900 instructions, and a finished event
/// runs seven.
struct Prepared<'c> {
    conn: &'c Connection,
    statements: Vec<(&'static str, CachedStatement<'c>)>,
}

impl<'c> Prepared<'c> {
    fn new(conn: &'c Connection) -> Self {
        Prepared {
            conn,
            statements: Vec::with_capacity(12),
        }
    }

    fn get(&mut self, sql: &'static str) -> rusqlite::Result<&mut CachedStatement<'c>> {
        let i = match self.statements.iter().position(|(s, _)| *s == sql) {
            Some(i) => i,
            None => {
                self.statements.push((sql, self.conn.prepare_cached(sql)?));
                self.statements.len() - 1
            }
        };
        Ok(&mut self.statements[i].1)
    }
}

/// A fenced transition: `UPDATE events SET <set>` on the event only while `claim` still holds
/// it, clearing the claim. Parameters: ?1 seq, ?2 claim token, ?3 now, ?4 and ?5 the set's
/// own values. `live`: the worker's own transitions, only while its lease runs; `expired`:
/// the sweeper's, whose lease has already run out, fenced by the token alone.
macro_rules! fence {
    ($set:literal, live) => {
        concat!(
            "UPDATE events SET ",
            $set,
            ", claim_token = NULL, claimed_until = NULL, claimed_by = NULL
              WHERE seq = ?1 AND claim_token = ?2 AND status = 'claimed' AND claimed_until > ?3"
        )
    };
    ($set:literal, expired) => {
        concat!(
            "UPDATE events SET ",
            $set,
            ", claim_token = NULL, claimed_until = NULL, claimed_by = NULL
              WHERE seq = ?1 AND claim_token = ?2 AND status = 'claimed'"
        )
    };
}

const COMPLETE: &str = fence!(
    "status = 'completed', completed_at = ?3, outcome = ?4, last_error = NULL",
    live
);
const RETRY: &str = fence!(
    "status = 'pending', next_attempt_at = ?4, last_error = ?5",
    live
);
const FAIL: &str = fence!("status = 'failed', last_error = ?4", live);
const RELEASE: &str = fence!("status = 'pending', next_attempt_at = ?3", live);
const EXPIRED_ABANDONED: &str =
    fence!("status = 'failed', abandoned = 1, last_error = ?4", expired);
const EXPIRED_FAILED: &str = fence!("status = 'failed', last_error = ?4", expired);
const EXPIRED_RETRY: &str = fence!(
    "status = 'pending', next_attempt_at = ?3, last_error = ?4",
    expired
);

/// Run one of the fenced transitions above. Returns whether the fence held (one row moved).
fn fenced(
    prepared: &mut Prepared<'_>,
    sql: &'static str,
    claim: &ClaimRef,
    now: i64,
    a: &dyn ToSql,
    b: &dyn ToSql,
) -> StoreResult<bool> {
    let stmt = prepared.get(sql)?;
    let values: [&dyn ToSql; 5] = [&claim.seq, &claim.claim_token, &now, a, b];
    // A statement counts parameters up to the highest number it names.
    for (i, value) in values.iter().enumerate().take(stmt.parameter_count()) {
        stmt.raw_bind_parameter(i + 1, value)?;
    }
    Ok(stmt.raw_execute()? == 1)
}

fn close_attempt(
    prepared: &mut Prepared<'_>,
    claim: &ClaimRef,
    result: AttemptResult,
    error: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    prepared
        .get(
            "UPDATE event_attempts SET finished_at = ?3, result = ?4, error = ?5
              WHERE event_seq = ?1 AND attempt = ?2",
        )?
        .execute(params![
            claim.seq,
            claim.attempt,
            now,
            result.as_str(),
            error
        ])?;
    Ok(())
}

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
        Next::Fail { error, result } => {
            if !fenced(prepared, FAIL, claim, now, error, &Null)? {
                return lost;
            }
            close_attempt(prepared, claim, *result, Some(error), now)?;
            Ok(Finished::Failed)
        }
    }
}

/// The loyalty credit: consumer dedup row, business-key row and balance, all inside the
/// savepoint that also completes the event. All or nothing.
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
fn refused_by_a_constraint(e: &StoreError) -> bool {
    match e {
        StoreError::Internal(e) => {
            e.downcast_ref::<rusqlite::Error>()
                .and_then(rusqlite::Error::sqlite_error_code)
                == Some(ErrorCode::ConstraintViolation)
        }
        StoreError::Unavailable(_) => false,
    }
}

/// One transaction for the batch, in which what one event writes can be undone alone: when its
/// fence fails (it then wrote nothing, since the fence comes first) or when the database
/// refuses its effect. An event whose effect is refused is failed (permanent: the same effect
/// would be refused again) with the database's reason, so that it is neither lost nor retried
/// forever, and the other events still commit. Any other error fails the whole transaction,
/// which the caller rolls back.
///
/// Refusals are rare, so the batch first runs under one savepoint; only if an effect is
/// refused is that undone and the batch run again with a savepoint per event (which costs two
/// statements per event: measured, 7% of the drain's instructions).
pub(super) fn finish_all(
    tx: &Transaction<'_>,
    items: &[Finish],
    now: i64,
) -> StoreResult<Vec<Finished>> {
    let mut prepared = Prepared::new(tx);
    prepared.get("SAVEPOINT finish_batch")?.execute([])?;
    let results = match finish_each(&mut prepared, items, now, false) {
        Err(e) if refused_by_a_constraint(&e) => {
            prepared.get("ROLLBACK TO finish_batch")?.execute([])?;
            finish_each(&mut prepared, items, now, true)?
        }
        other => other?,
    };
    prepared.get("RELEASE finish_batch")?.execute([])?;
    Ok(results)
}

/// Finish each event in turn; with `isolate`, each in its own savepoint, failing an event
/// whose effect the database refuses.
fn finish_each(
    prepared: &mut Prepared<'_>,
    items: &[Finish],
    now: i64,
    isolate: bool,
) -> StoreResult<Vec<Finished>> {
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
                if fenced(prepared, FAIL, &item.claim, now, &error, &Null)? {
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

/// Expired leases. At-least-once handlers get the event again (unless its budget is spent);
/// at-most-once handlers may already have acted, so the event is failed as abandoned for ops to
/// decide. The UPDATEs are fenced by the token read in this same write transaction.
pub(super) fn sweep(
    tx: &Transaction<'_>,
    now: i64,
    max_attempts: u32,
    mode_of: ModeOf<'_>,
) -> StoreResult<usize> {
    let expired = tx
        .prepare_cached(
            "SELECT source, event_id, event_type, claim_token, attempts, attempts - budget_floor,
                    seq
               FROM events WHERE status = 'claimed' AND claimed_until <= ?1",
        )?
        .query_map([now], |r| {
            Ok((
                ClaimRef {
                    source: r.get(0)?,
                    event_id: r.get(1)?,
                    seq: r.get(6)?,
                    claim_token: r.get(3)?,
                    attempt: r.get(4)?,
                },
                r.get::<_, String>(2)?,
                r.get::<_, i64>(5)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut prepared = Prepared::new(tx);
    let mut swept = 0;
    for (claim, event_type, used) in expired {
        let (sql, error) = match mode_of(&claim.source, &event_type) {
            DeliveryMode::AtMostOnce => (
                EXPIRED_ABANDONED,
                "abandoned: the lease expired during an at-most-once attempt; the downstream \
                 may have acted, so it is not retried without force",
            ),
            DeliveryMode::AtLeastOnce if used >= i64::from(max_attempts) => {
                (EXPIRED_FAILED, "lease expired on the last attempt")
            }
            DeliveryMode::AtLeastOnce => (EXPIRED_RETRY, "lease expired"),
        };
        if fenced(&mut prepared, sql, &claim, now, &error, &Null)? {
            close_attempt(
                &mut prepared,
                &claim,
                AttemptResult::LeaseExpired,
                Some("lease expired"),
                now,
            )?;
            swept += 1;
        }
    }
    Ok(swept)
}

pub(super) fn loyalty(conn: &Connection, customer_id: &str) -> StoreResult<LoyaltyAccount> {
    let balance: i64 = conn
        .query_row(
            "SELECT balance FROM loyalty_balances WHERE customer_id = ?1",
            [customer_id],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0);
    let credits = conn
        .prepare_cached(
            "SELECT order_id, points, source, event_id, credited_at FROM loyalty_credits
              WHERE customer_id = ?1 ORDER BY credited_at, order_id",
        )?
        .query_map([customer_id], |r| {
            Ok(LoyaltyCredit {
                order_id: r.get(0)?,
                points: r.get(1)?,
                source: r.get(2)?,
                event_id: r.get(3)?,
                credited_at: r.get(4)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LoyaltyAccount {
        customer_id: customer_id.to_string(),
        balance,
        credits,
    })
}
