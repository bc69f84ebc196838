//! The consumer side: claim, the fenced transitions (finishing a batch is in `finish`),
//! release, sweep.
//!
//! Claiming is a state transition, not a read followed by a write: one UPDATE moves due pending
//! rows to `claimed` and returns them. Every later transition is fenced by the claim token and
//! the lease, so a worker that lost its claim changes nothing.

use rusqlite::types::Null;
use rusqlite::{CachedStatement, Connection, OptionalExtension, ToSql, Transaction, params};

use crate::store::{
    AttemptResult, ClaimRef, Claimed, DecideExpiry, ExpiredClaim, Expiry, Lane, LoyaltyAccount,
    StoreResult,
};

/// The claim, as state transitions: due work moves to `claimed` and is returned, in the
/// statements that change it.
///
/// The queue is log-structured (migrations `0007`, `0009`): a first attempt of lane 0 has no
/// state row, and is claimed by giving it one, `INSERT … SELECT` of the first events after the
/// lane's cursor in `seq` order. Events that came back (a retry, a released or swept claim, an
/// ops retry) and submitted requests (lane 1) have their state row, and are claimed by one
/// `UPDATE` through the partial index of due work (named, so that the planner cannot pick a
/// status scan plus a sort whose cost grows with the backlog). Work that came back goes first;
/// first attempts fill the rest of the batch.
///
/// The limit is part of the text, not a parameter: SQLite plans with a bound LIMIT's value
/// and so re-prepares the statement at every new binding (measured: one full parse and plan
/// per claim). A worker uses one or two limits, so the statement cache holds them all.
///
/// The lane is part of the text too (two values), and leads `events_due`: each lane's claim is
/// one range of the index. A claimed event keeps `next_attempt_at`, the time it became due,
/// for the lag gauge; terminal transitions clear it.
pub fn claim_sql(lane: Lane, limit: usize) -> String {
    let lane = lane.as_i64();
    format!(
        "UPDATE event_state
    SET status = 'claimed', claimed_by = ?1, claimed_until = ?2,
        attempts = attempts + 1, claim_token = lower(hex(randomblob(16)))
  WHERE rowid IN (SELECT rowid FROM event_state INDEXED BY events_due
                   WHERE status = 'pending' AND lane = {lane} AND next_attempt_at <= ?3
                   ORDER BY next_attempt_at LIMIT {limit})
RETURNING {CLAIMED}"
    )
}

/// The first attempts' claim: the first `limit` events of lane 0 after the cursor get their
/// state row, claimed; due since they were received.
pub fn first_attempts_sql(limit: usize) -> String {
    format!(
        "INSERT INTO event_state (seq, lane, status, attempts, next_attempt_at, claimed_until,
                         claimed_by, claim_token)
SELECT seq, 0, 'claimed', 1, received_at, ?2, ?1, lower(hex(randomblob(16)))
  FROM event_log
 WHERE seq > (SELECT after_seq FROM queue_cursors WHERE lane = 0) AND lane = 0
 ORDER BY seq LIMIT {limit}
RETURNING {CLAIMED}"
    )
}

/// What both claims return, in the order [`claimed`] reads it.
const CLAIMED: &str = "seq, attempts, attempts - budget_floor, claim_token, claimed_until";

fn claimed(r: &rusqlite::Row<'_>) -> rusqlite::Result<Claimed> {
    Ok(Claimed {
        claim: ClaimRef {
            // Read below from the log, with the body.
            source: String::new(),
            event_id: String::new(),
            seq: r.get(0)?,
            attempt: r.get(1)?,
            claim_token: r.get(3)?,
        },
        event_type: String::new(),
        payload: Vec::new(),
        content_type: None,
        budget_used: r.get(2)?,
        claimed_until: r.get(4)?,
    })
}

/// Move the cursor past the first attempts just claimed, `first` of `room`. If the claim took
/// fewer than it had room for, none of lane 0's first attempts is left anywhere in the log,
/// and the cursor moves to the last `seq`; else to the last one claimed (writes are
/// serialised, so no event can appear behind it). It only ever moves forward.
fn advance_cursor(
    tx: &Transaction<'_>,
    first: usize,
    room: usize,
    last_claimed: i64,
) -> StoreResult<()> {
    let to = if first < room {
        tx.prepare_cached("SELECT ifnull(max(seq), 0) FROM event_log")?
            .query_row([], |r| r.get(0))?
    } else {
        last_claimed
    };
    tx.prepare_cached("UPDATE queue_cursors SET after_seq = ?1 WHERE lane = 0 AND after_seq < ?1")?
        .execute(params![to])?;
    Ok(())
}

pub(super) fn claim(
    tx: &Transaction<'_>,
    worker: &str,
    lane: Lane,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Claimed>> {
    let claimed_until = now + lease_ms;
    let mut claims = tx
        .prepare_cached(&claim_sql(lane, limit))?
        .query_map(params![worker, claimed_until, now], claimed)?
        .collect::<Result<Vec<_>, _>>()?;
    let room = limit - claims.len();
    if lane == Lane::InProcess && room > 0 {
        let first = tx
            .prepare_cached(&first_attempts_sql(room))?
            .query_map(params![worker, claimed_until], claimed)?
            .collect::<Result<Vec<_>, _>>()?;
        let last = first.iter().map(|c| c.claim.seq).max().unwrap_or(0);
        advance_cursor(tx, first.len(), room, last)?;
        claims.extend(first);
    }
    let mut event = tx.prepare_cached(
        "SELECT source, event_id, event_type, payload, content_type FROM event_log
          WHERE seq = ?1",
    )?;
    for c in &mut claims {
        (
            c.claim.source,
            c.claim.event_id,
            c.event_type,
            c.payload,
            c.content_type,
        ) = event.query_row([c.claim.seq], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?;
    }
    let mut history = tx.prepare_cached(
        "INSERT INTO event_attempts (event_seq, attempt, worker, started_at)
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for c in &claims {
        history.execute(params![c.claim.seq, c.claim.attempt, worker, now])?;
    }
    Ok(claims)
}

/// The statements a batch runs, each taken from the connection's cache once per batch.
/// `prepare_cached` hashes the whole SQL text to find a statement and again to put it back:
/// per statement execution that was measured at about 900 instructions, and a finished event
/// runs seven.
pub(super) struct Prepared<'c> {
    conn: &'c Connection,
    statements: Vec<(&'static str, CachedStatement<'c>)>,
}

impl<'c> Prepared<'c> {
    pub(super) fn new(conn: &'c Connection) -> Self {
        Prepared {
            conn,
            statements: Vec::with_capacity(12),
        }
    }

    pub(super) fn get(&mut self, sql: &'static str) -> rusqlite::Result<&mut CachedStatement<'c>> {
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

/// A fenced transition: `UPDATE event_state SET <set>` on the event only while `claim` still holds
/// it, clearing the claim. Parameters: ?1 seq, ?2 claim token, ?3 now, ?4 and ?5 the set's
/// own values. `live`: the worker's own transitions, only while its lease runs; `expired`:
/// the sweeper's, whose lease has already run out, fenced by the token alone.
macro_rules! fence {
    ($set:literal, live) => {
        concat!(
            "UPDATE event_state SET ",
            $set,
            ", claim_token = NULL, claimed_until = NULL, claimed_by = NULL
              WHERE seq = ?1 AND claim_token = ?2 AND status = 'claimed' AND claimed_until > ?3"
        )
    };
    ($set:literal, expired) => {
        concat!(
            "UPDATE event_state SET ",
            $set,
            ", claim_token = NULL, claimed_until = NULL, claimed_by = NULL
              WHERE seq = ?1 AND claim_token = ?2 AND status = 'claimed'"
        )
    };
}

pub(super) const COMPLETE: &str = fence!(
    "status = 'completed', completed_at = ?3, outcome = ?4, last_error = NULL, \
     next_attempt_at = NULL",
    live
);
pub(super) const RETRY: &str = fence!(
    "status = 'pending', next_attempt_at = ?4, last_error = ?5",
    live
);
pub(super) const FAIL: &str = fence!(
    "status = 'failed', last_error = ?4, abandoned = ?5, next_attempt_at = NULL",
    live
);
const RELEASE: &str = fence!("status = 'pending', next_attempt_at = ?3", live);
const EXPIRED_FAIL: &str = fence!(
    "status = 'failed', last_error = ?4, abandoned = ?5, next_attempt_at = NULL",
    expired
);
const EXPIRED_RETRY: &str = fence!(
    "status = 'pending', next_attempt_at = ?3, last_error = ?4",
    expired
);

/// Run one of the fenced transitions above. Returns whether the fence held (one row moved).
pub(super) fn fenced(
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

pub(super) fn close_attempt(
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

/// Expired leases: each goes where `decide` says (the rule is the consumer's), through a
/// transition fenced by the token read in this same write transaction.
pub(super) fn sweep(
    tx: &Transaction<'_>,
    now: i64,
    decide: DecideExpiry<'_>,
) -> StoreResult<usize> {
    let expired = tx
        .prepare_cached(
            "SELECT l.source, l.event_id, l.event_type, s.claim_token, s.attempts,
                    s.attempts - s.budget_floor, s.seq
               FROM event_state s INDEXED BY events_leases JOIN event_log l ON l.seq = s.seq
              WHERE s.status = 'claimed' AND s.claimed_until <= ?1",
        )?
        .query_map([now], |r| {
            Ok(ExpiredClaim {
                claim: ClaimRef {
                    source: r.get(0)?,
                    event_id: r.get(1)?,
                    seq: r.get(6)?,
                    claim_token: r.get(3)?,
                    attempt: r.get(4)?,
                },
                event_type: r.get(2)?,
                budget_used: r.get(5)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut prepared = Prepared::new(tx);
    let mut swept = 0;
    for expired in expired {
        let claim = &expired.claim;
        let held = match decide(&expired) {
            Expiry::Retry { error } => {
                fenced(&mut prepared, EXPIRED_RETRY, claim, now, &error, &Null)?
            }
            Expiry::Fail { error, abandoned } => {
                fenced(&mut prepared, EXPIRED_FAIL, claim, now, &error, &abandoned)?
            }
        };
        if held {
            close_attempt(
                &mut prepared,
                claim,
                AttemptResult::LeaseExpired,
                Some("lease expired"),
                now,
            )?;
            swept += 1;
        }
    }
    Ok(swept)
}

/// The balance and one page of credits, newest first by the `seq` of the event that earned
/// each credit: the order and cursor of `GET /events`.
pub(super) fn loyalty(
    conn: &Connection,
    customer_id: &str,
    page: crate::store::Page,
) -> StoreResult<LoyaltyAccount> {
    let balance: i64 = conn
        .query_row(
            "SELECT balance FROM loyalty_balances WHERE customer_id = ?1",
            [customer_id],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0);
    let credits = super::customers::credits(conn, customer_id, page)?;
    Ok(LoyaltyAccount {
        customer_id: customer_id.to_string(),
        balance,
        credits,
    })
}
