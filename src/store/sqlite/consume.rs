//! The consumer side: claim and the fenced transitions (finishing a batch is in `finish`;
//! release, extend and sweep in `leases`).
//!
//! Claiming is a state transition, not a read followed by a write: one UPDATE moves due pending
//! rows to `claimed` and returns them. Every later transition is fenced by the claim token and
//! the lease, so a worker that lost its claim changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

use rusqlite::{CachedStatement, Connection, OptionalExtension, ToSql, Transaction, params};

use crate::store::{AttemptResult, ClaimFor, ClaimRef, Claimed, Lane, LoyaltyAccount, StoreResult};

use super::fan_out::{IN_PROCESS_CLAIMS_NOW, fan_out};
use super::subscriptions::Routes;
use crate::store::routes::ordered as ordered_sub;

/// The claim, as state transitions: due work moves to `claimed` and is returned, in the
/// statements that change it.
///
/// The queue is log-structured (migrations `0007`, `0009`, `0011`): an event of lane 0 after
/// the cursor has no state row, and is claimed by fanning it out: one `INSERT … SELECT` gives
/// it a state row per live subscription whose route matches, claimed for the in-process ones
/// that are not paused (pending for the others), and the cursor moves past it in the same
/// transaction. Events that came back (a retry, a released or swept claim, an ops retry, a
/// resumed subscription's waiting events) and submitted requests (lane 1) have their state
/// rows, and are claimed by one `UPDATE` per subscription through the partial index of due
/// work (named, so that the planner cannot pick a status scan plus a sort whose cost grows with
/// the backlog). Work that came back goes first; fanned-out events fill the rest of the batch.
///
/// The limit is part of the text, not a parameter: SQLite plans with a bound LIMIT's value
/// and so re-prepares the statement at every new binding (measured: one full parse and plan
/// per claim). A worker uses one or two limits, so the statement cache holds them all.
///
/// The subscription is part of the text too, and leads `events_due`: each subscription's
/// claim is one range of the index, so a paused one's waiting events are never read. A
/// claimed event keeps `next_attempt_at`, the time it became due, for the lag gauge; terminal
/// transitions clear it.
pub fn claim_sql(sub: i64, limit: usize) -> String {
    format!(
        "UPDATE event_state
    SET status = 'claimed', claimed_by = ?1, claimed_until = ?2,
        attempts = attempts + 1, claim_token = lower(hex(randomblob(16)))
  WHERE rowid IN (SELECT rowid FROM event_state INDEXED BY events_due
                   WHERE status = 'pending' AND sub = {sub} AND next_attempt_at <= ?3
                   ORDER BY next_attempt_at LIMIT {limit})
RETURNING {CLAIMED}"
    )
}

/// What the claims return, in the order [`claimed`] reads it.
pub(super) const CLAIMED: &str =
    "seq, attempts, attempts - budget_floor, claim_token, claimed_until, sub, rowid";

pub(super) fn claimed(r: &rusqlite::Row<'_>) -> rusqlite::Result<Claimed> {
    Ok(Claimed {
        claim: ClaimRef {
            // Read below from the log, with the body.
            source: String::new(),
            event_id: String::new(),
            seq: r.get(0)?,
            subscription: r.get(5)?,
            attempt: r.get(1)?,
            claim_token: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
            row: Some(r.get(6)?),
        },
        event_type: String::new(),
        payload: Vec::new(),
        content_type: None,
        received_at: 0,
        budget_used: r.get(2)?,
        claimed_until: r.get::<_, Option<i64>>(4)?.unwrap_or_default(),
        traceparent: None,
        probe: false,
    })
}

/// Turns the subscriptions take at being claimed first, so that a full batch of one does not
/// always leave the others the rest.
static ROTATION: AtomicUsize = AtomicUsize::new(0);

pub(super) fn claim(
    tx: &Transaction<'_>,
    routes: &Routes,
    worker: &str,
    lane: Lane,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Claimed>> {
    claim_for(
        tx,
        routes,
        worker,
        ClaimFor::Lane(lane),
        limit,
        lease_ms,
        now,
    )
}

/// A claim of one lane's subscriptions (the kinds its workers serve), or of one subscription
/// (an `http` subscription's forwarder). Both fan new events out: a lane-0 claim starts the
/// rows of the in-process subscriptions claimed, a subscription's claim its own rows.
pub(super) fn claim_for(
    tx: &Transaction<'_>,
    routes: &Routes,
    worker: &str,
    whose: ClaimFor,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Claimed>> {
    let claimed_until = now + lease_ms;
    // With each, whether its breaker is open with a probe due (none waits for its probe here).
    let subs: Vec<(i64, bool)> = match whose {
        // The kinds with workers of their own (forwarders, pull clients) are not the lane's.
        ClaimFor::Lane(lane) => tx
            .prepare_cached(
                "SELECT id, probe_at IS NOT NULL FROM subscriptions
                  WHERE claimer = ?1 AND paused = 0 AND removed_at IS NULL
                    AND (probe_at IS NULL OR probe_at <= ?2)
                  ORDER BY id",
            )?
            .query_map(params![lane.claimer().as_str(), now], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<Result<_, _>>()?,
        // Its gate was read by its caller (`breaker::claim`).
        ClaimFor::Subscription(sub) => vec![(sub, false)],
    };
    let mut claims = Vec::new();
    let turn = ROTATION.fetch_add(1, Ordering::Relaxed);
    for i in 0..subs.len() {
        let room = limit - claims.len();
        if room == 0 {
            break;
        }
        let (sub, probe) = subs[(turn + i) % subs.len()];
        let before = claims.len();
        claim_due(
            tx,
            routes,
            sub,
            if probe { 1 } else { room },
            worker,
            claimed_until,
            now,
            &mut claims,
        )?;
        // The probe: one event, and the next probe a lease away (this transaction holds the
        // write lock, so no other worker saw this one due).
        if probe && claims.len() > before {
            claims[before].probe = true;
            tx.prepare_cached("UPDATE subscriptions SET probe_at = ?2 WHERE id = ?1")?
                .execute(params![sub, claimed_until])?;
        }
    }
    let room = limit - claims.len();
    let claims_now = match whose {
        ClaimFor::Lane(Lane::InProcess) => Some(IN_PROCESS_CLAIMS_NOW.to_string()),
        ClaimFor::Lane(Lane::CallOut) => None,
        ClaimFor::Subscription(sub) => Some(format!(
            "(u.id = {sub} AND u.paused = 0 AND u.ordered_by IS NULL)"
        )),
    };
    // The fan-out's claims are in `claims[fanned]`, their history rows written by `fan_out`.
    let mut fanned = claims.len()..claims.len();
    if let Some(claims_now) = claims_now.filter(|_| room > 0) {
        let fan_room = crate::store::routes::fan_out_room(&routes.live, whose, room);
        let lease = (worker, claimed_until, now);
        claims.extend(fan_out(tx, routes, &claims_now, lease, fan_room)?);
        fanned.end = claims.len();
        // An ordered subscription's new rows start pending: claimed here, by key.
        for &(sub, probe) in &subs {
            let room = limit.saturating_sub(claims.len());
            if room > 0 && !probe && ordered_sub(&routes.live, sub).is_some() {
                claim_due(
                    tx,
                    routes,
                    sub,
                    room,
                    worker,
                    claimed_until,
                    now,
                    &mut claims,
                )?;
            }
        }
    }
    super::claimed_events::read(tx, &mut claims)?;
    let mut history = tx.prepare_cached(
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let others = claims[..fanned.start].iter().chain(&claims[fanned.end..]);
    for c in others {
        history.execute(params![
            c.claim.seq,
            c.claim.subscription,
            c.claim.attempt,
            worker,
            now
        ])?;
    }
    Ok(claims)
}

/// Up to `room` due states of `sub`, claimed (by key, for an ordered subscription).
#[allow(clippy::too_many_arguments)]
fn claim_due(
    tx: &Transaction<'_>,
    routes: &Routes,
    sub: i64,
    room: usize,
    worker: &str,
    claimed_until: i64,
    now: i64,
    claims: &mut Vec<Claimed>,
) -> StoreResult<()> {
    if let Some(o) = ordered_sub(&routes.live, sub) {
        let claim = (worker, claimed_until, now);
        return super::ordering::claim(tx, routes, sub, o, room, claim, claims);
    }
    let mut stmt = tx.prepare_cached(&claim_sql(sub, room))?;
    for c in stmt.query_map(params![worker, claimed_until, now], claimed)? {
        claims.push(c?);
    }
    Ok(())
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
/// own values, ?6 the subscription. `live`: the worker's own transitions, only while its lease
/// runs; `expired`: the sweeper's, whose lease has already run out, fenced by the token alone.
/// The row is named by `(seq, sub)`: a fan-out's rows share their claim's token.
macro_rules! fence {
    ($set:literal, live) => {
        concat!(
            "UPDATE event_state SET ",
            $set,
            ", claim_token = NULL, claimed_until = NULL, claimed_by = NULL
              WHERE seq = ?1 AND sub = ?6 AND claim_token = ?2 AND status = 'claimed'
                AND claimed_until > ?3"
        )
    };
    // The same fence at the row the claim found (?7, its rowid): one seek of the table, where
    // `(seq, sub)` seeks the key's index and then the table. `NOT INDEXED` keeps the planner
    // on the rowid.
    ($set:literal, live_at_row) => {
        concat!(
            "UPDATE event_state NOT INDEXED SET ",
            $set,
            ", claim_token = NULL, claimed_until = NULL, claimed_by = NULL
              WHERE rowid = ?7 AND seq = ?1 AND sub = ?6 AND claim_token = ?2
                AND status = 'claimed' AND claimed_until > ?3"
        )
    };
    ($set:literal, expired) => {
        concat!(
            "UPDATE event_state SET ",
            $set,
            ", claim_token = NULL, claimed_until = NULL, claimed_by = NULL
              WHERE seq = ?1 AND sub = ?6 AND claim_token = ?2 AND status = 'claimed'"
        )
    };
}

pub(super) const COMPLETE: &str = fence!(
    "status = 'completed', completed_at = ?3, outcome = ?4, last_error = NULL, \
     next_attempt_at = NULL",
    live
);
/// [`COMPLETE`] at the claim's row: the hot path, every finished event runs it (measured:
/// 17,300 instructions an event by the key, 15,800 at the row; 13,300 before subscriptions,
/// whose key was the rowid).
pub(super) const COMPLETE_AT_ROW: &str = fence!(
    "status = 'completed', completed_at = ?3, outcome = ?4, last_error = NULL, \
     next_attempt_at = NULL",
    live_at_row
);
pub(super) const RETRY: &str = fence!(
    "status = 'pending', next_attempt_at = ?4, last_error = ?5",
    live
);
pub(super) const FAIL: &str = fence!(
    "status = 'failed', last_error = ?4, abandoned = ?5, next_attempt_at = NULL",
    live
);
pub(super) const RELEASE: &str = fence!("status = 'pending', next_attempt_at = ?3", live);
/// A release that was no attempt at all (see `leases::give_back`): the claim's count taken back.
pub(super) const GIVE_BACK: &str = fence!(
    "status = 'pending', next_attempt_at = ?3, attempts = attempts - 1",
    live
);
pub(super) const EXPIRED_FAIL: &str = fence!(
    "status = 'failed', last_error = ?4, abandoned = ?5, next_attempt_at = NULL",
    expired
);
pub(super) const EXPIRED_RETRY: &str = fence!(
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
    fenced_with(prepared, sql, claim, now, [a, b], None)
}

/// A fence's statement with its values: `row` for a `live_at_row` fence's ?7.
fn fenced_with(
    prepared: &mut Prepared<'_>,
    sql: &'static str,
    claim: &ClaimRef,
    now: i64,
    [a, b]: [&dyn ToSql; 2],
    row: Option<i64>,
) -> StoreResult<bool> {
    let stmt = prepared.get(sql)?;
    let values: [&dyn ToSql; 6] = [
        &claim.seq,
        &claim.claim_token,
        &now,
        a,
        b,
        &claim.subscription,
    ];
    for (i, value) in values.iter().enumerate() {
        stmt.raw_bind_parameter(i + 1, value)?;
    }
    if let Some(row) = row {
        stmt.raw_bind_parameter(values.len() + 1, row)?;
    }
    Ok(stmt.raw_execute()? == 1)
}

/// [`fenced`] by `at_row` (a `live_at_row` fence) where the claim knows its row, else by
/// `by_key`: the same transition and fence.
pub(super) fn fenced_at_row(
    prepared: &mut Prepared<'_>,
    (at_row, by_key): (&'static str, &'static str),
    claim: &ClaimRef,
    now: i64,
    a: &dyn ToSql,
    b: &dyn ToSql,
) -> StoreResult<bool> {
    match claim.row {
        Some(row) => fenced_with(prepared, at_row, claim, now, [a, b], Some(row)),
        None => fenced_with(prepared, by_key, claim, now, [a, b], None),
    }
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
              WHERE event_seq = ?1 AND sub = ?6 AND attempt = ?2",
        )?
        .execute(params![
            claim.seq,
            claim.attempt,
            now,
            result.as_str(),
            error,
            claim.subscription
        ])?;
    Ok(())
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
