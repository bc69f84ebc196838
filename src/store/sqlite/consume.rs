//! The consumer side: claim, finish (effect and completion), release, sweep.
//!
//! Claiming is a state transition, not a read followed by a write: one UPDATE moves due pending
//! rows to `claimed` and returns them. Every later transition is fenced by the claim token and
//! the lease, so a worker that lost its claim changes nothing.

use rusqlite::types::Null;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lease {
    /// The worker's own transitions: only while its lease runs.
    Live,
    /// The sweeper's: the lease has already run out.
    Any,
}

/// Move a claimed event on, only if `claim` still holds it (and, for `Lease::Live`, its lease
/// has not run out). `set` may use `:now`, `:a` and `:b`. Returns whether the fence held.
fn fenced(
    conn: &Connection,
    claim: &ClaimRef,
    set: &str,
    a: &dyn rusqlite::ToSql,
    b: &dyn rusqlite::ToSql,
    now: i64,
    lease: Lease,
) -> StoreResult<bool> {
    let live = if lease == Lease::Live {
        "claimed_until > :now"
    } else {
        ":now = :now"
    };
    let sql = format!(
        "UPDATE events SET {set}, claim_token = NULL, claimed_until = NULL, claimed_by = NULL
          WHERE seq = :seq AND claim_token = :token AND status = 'claimed' AND {live}"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut named: Vec<(&str, &dyn rusqlite::ToSql)> = vec![
        (":seq", &claim.seq),
        (":token", &claim.claim_token),
        (":now", &now),
    ];
    // Only bind the parameters the statement names: SQLite refuses unknown ones.
    for (name, value) in [(":a", a), (":b", b)] {
        if set.contains(name) {
            named.push((name, value));
        }
    }
    Ok(stmt.execute(named.as_slice())? == 1)
}

fn close_attempt(
    conn: &Connection,
    claim: &ClaimRef,
    result: AttemptResult,
    error: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    conn.prepare_cached(
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

fn finish_one(conn: &Connection, item: &Finish, now: i64) -> StoreResult<Finished> {
    let claim = &item.claim;
    let lost = Ok(Finished::LeaseLost);
    match &item.next {
        Next::Complete { effect, outcome } => {
            let set = "status = 'completed', completed_at = :now, outcome = :a, last_error = NULL";
            if !fenced(conn, claim, set, &outcome.as_str(), &Null, now, Lease::Live)? {
                return lost;
            }
            let proposed = *outcome;
            let (outcome, result) = match effect {
                None => (proposed, AttemptResult::Ok),
                Some(effect) => apply_effect(conn, claim, effect, now)?,
            };
            // The fence wrote the handler's expected outcome; the guards may say otherwise.
            if outcome != proposed {
                conn.prepare_cached("UPDATE events SET outcome = ?2 WHERE seq = ?1")?
                    .execute(params![claim.seq, outcome.as_str()])?;
            }
            close_attempt(conn, claim, result, None, now)?;
            Ok(Finished::Completed { outcome, result })
        }
        Next::Retry { at, error } => {
            let set = "status = 'pending', next_attempt_at = :a, last_error = :b";
            if !fenced(conn, claim, set, at, error, now, Lease::Live)? {
                return lost;
            }
            close_attempt(conn, claim, AttemptResult::RetryableError, Some(error), now)?;
            Ok(Finished::Retrying)
        }
        Next::Fail { error, result } => {
            let set = "status = 'failed', last_error = :a";
            if !fenced(conn, claim, set, error, &Null, now, Lease::Live)? {
                return lost;
            }
            close_attempt(conn, claim, *result, Some(error), now)?;
            Ok(Finished::Failed)
        }
    }
}

/// The loyalty credit: consumer dedup row, business-key row and balance, all inside the
/// savepoint that also completes the event. All or nothing.
fn apply_effect(
    conn: &Connection,
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
    let first_time = conn
        .prepare_cached(
            "INSERT INTO processed_events (consumer, source, event_id, outcome, processed_at)
             VALUES (?1, ?2, ?3, 'credited', ?4) ON CONFLICT DO NOTHING",
        )?
        .execute(params![consumer, claim.source, claim.event_id, now])?
        == 1;
    if !first_time {
        // A forced re-run: the effect already happened; report what it was and move nothing.
        let previous: String = conn.query_row(
            "SELECT outcome FROM processed_events
              WHERE consumer = ?1 AND source = ?2 AND event_id = ?3",
            params![consumer, claim.source, claim.event_id],
            |r| r.get(0),
        )?;
        let outcome = Outcome::parse(&previous).ok_or_else(|| {
            StoreError::Internal(anyhow::anyhow!("unknown stored outcome {previous}"))
        })?;
        return Ok((outcome, AttemptResult::AlreadyProcessed));
    }
    let credited =
        conn.prepare_cached(
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
        ])? == 1;
    if !credited {
        conn.prepare_cached(
            "UPDATE processed_events SET outcome = 'duplicate_order'
              WHERE consumer = ?1 AND source = ?2 AND event_id = ?3",
        )?
        .execute(params![consumer, claim.source, claim.event_id])?;
        return Ok((Outcome::DuplicateOrder, AttemptResult::Ok));
    }
    conn.prepare_cached(
        "INSERT INTO loyalty_balances (customer_id, balance) VALUES (?1, ?2)
         ON CONFLICT (customer_id) DO UPDATE SET balance = balance + excluded.balance",
    )?
    .execute(params![customer_id, points])?;
    Ok((Outcome::Credited, AttemptResult::Ok))
}

/// One transaction for the batch, one savepoint per event: an event whose fence fails is rolled
/// back alone (its effect with it) and the others still commit. The savepoint statements are
/// cached (rusqlite's `Savepoint` parses them anew each time).
pub(super) fn finish_all(
    tx: &Transaction<'_>,
    items: &[Finish],
    now: i64,
) -> StoreResult<Vec<Finished>> {
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        tx.prepare_cached("SAVEPOINT finish_event")?.execute([])?;
        // An error fails the whole transaction, which the caller then rolls back.
        let finished = finish_one(tx, item, now)?;
        if finished == Finished::LeaseLost {
            tx.prepare_cached("ROLLBACK TO finish_event")?.execute([])?;
        }
        tx.prepare_cached("RELEASE finish_event")?.execute([])?;
        results.push(finished);
    }
    Ok(results)
}

/// Shutdown: claims whose handler never started go back to pending, due now.
pub(super) fn release(tx: &Transaction<'_>, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
    let mut released = 0;
    for claim in claims {
        let set = "status = 'pending', next_attempt_at = :now";
        if fenced(tx, claim, set, &Null, &Null, now, Lease::Live)? {
            let why = "released at shutdown before the handler started";
            close_attempt(tx, claim, AttemptResult::RetryableError, Some(why), now)?;
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
    let mut swept = 0;
    for (claim, event_type, used) in expired {
        let (set, error): (&str, &str) = match mode_of(&claim.source, &event_type) {
            DeliveryMode::AtMostOnce => (
                "status = 'failed', abandoned = 1, last_error = :a",
                "abandoned: the lease expired during an at-most-once attempt; the downstream \
                 may have acted, so it is not retried without force",
            ),
            DeliveryMode::AtLeastOnce if used >= i64::from(max_attempts) => (
                "status = 'failed', last_error = :a",
                "lease expired on the last attempt",
            ),
            DeliveryMode::AtLeastOnce => (
                "status = 'pending', next_attempt_at = :now, last_error = :a",
                "lease expired",
            ),
        };
        // An expired lease is fenced by its token alone.
        if fenced(tx, &claim, set, &error, &Null, now, Lease::Any)? {
            close_attempt(
                tx,
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
