//! The consumer side: claims (the fenced transitions are in `fence`, finishing a batch in
//! `finish`; release, extend and sweep in `leases`).
//!
//! A claim is one statement: `FOR UPDATE SKIP LOCKED` picks due pending rows that no other
//! transaction holds (another node's claim skips them instead of waiting or taking them too),
//! the UPDATE moves them to `claimed`, and the attempt rows are opened in the same statement.
//! Due-ness and leases are the database's clock. Every later transition is fenced by the claim
//! token, so a worker that lost its claim changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::NOW_MS;
use super::fence::{Fence, fenced, fenced_sql};
use super::session::Db;
use super::subscriptions::{RouteCache, Routes};
use crate::store::routes::{Ordered, ordered as ordered_sub};
use crate::store::{AttemptResult, ClaimFor, ClaimRef, Claimed, Lane, StoreResult};

/// Commit the in-process lane's claims (and the batch finished with them) without waiting for
/// the WAL's flush. The fan-out's lock is held to the claim's commit, so every other claim
/// waited for that flush too (paired drains: one node 19,714 against 16,395 credits/s, two
/// 15,359 against 13,685). Nothing outside the database acts on such a commit: the in-process
/// kinds' effects commit in the same transactions (an at-most-once mode is refused for them),
/// and the WAL is flushed in order, so a crash of the database server loses only a tail of
/// these commits, effects and states together, and a later synchronous commit (every
/// acknowledged delivery, every other lane's claim, every ops change) flushes all before it.
/// A claim lost that way is claimed again; an effect lost with its completion is applied again,
/// once. The call-out lane, `http` and `pull` keep synchronous commits: their claims lead to
/// calls and answers outside.
pub(super) fn commit_unflushed(db: &mut Db<'_>, lane: Lane) -> StoreResult<()> {
    if lane == Lane::InProcess {
        db.execute("SET LOCAL synchronous_commit = off", &[])?;
    }
    Ok(())
}

/// The due work of one subscription: `picked` is materialised, since a locking subquery that
/// the planner could run again (as the inner side of a nested loop) would lock and claim more
/// rows than the limit. $1 worker, $2 lease, $3 subscription, $4 limit.
///
/// An ordered subscription's due states are taken only by key (see
/// `routes::Ordered::may_claim_sql`): at most one per key, the earliest unfinished. Two claims
/// at once can only hold a key back, never take two of its states: the later state's
/// condition sees the earlier one unfinished (pending or claimed) whichever commits first.
///
/// `window`: an ordered subscription's claim looks only at the oldest due states (see the
/// SQLite store's `ordering::claim`, which this follows); `None` looks at all of them.
fn claim_due_sql(ordered: Option<&Ordered>, window: Option<usize>) -> String {
    let may = ordered.map_or(String::new(), |o| format!("AND {}", o.may_claim_sql("")));
    // The last due state of the window, if that many are due: the claim looks up to it.
    let (bound, window) = match window {
        Some(w) => (
            format!(
                "bound AS MATERIALIZED (
                    SELECT w.next_attempt_at AS at, w.seq FROM event_state w
                     WHERE w.sub = $3 AND w.status = 'pending'
                       AND w.next_attempt_at <= (SELECT ms FROM clock)
                     ORDER BY w.next_attempt_at, w.seq OFFSET {} LIMIT 1),",
                w - 1
            ),
            "AND (NOT EXISTS (SELECT 1 FROM bound)
                    OR (s.next_attempt_at, s.seq) <= (SELECT at, seq FROM bound))"
                .to_string(),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "WITH clock AS MATERIALIZED (SELECT {NOW_MS} AS ms), {bound}
     picked AS MATERIALIZED (
        SELECT s.seq, s.sub FROM event_state s
         WHERE s.sub = $3 AND s.status = 'pending' AND s.next_attempt_at <= (SELECT ms FROM clock)
               {may} {window}
         ORDER BY s.next_attempt_at, s.seq
         LIMIT $4
           FOR UPDATE SKIP LOCKED
     )
     UPDATE event_state s
        SET status = 'claimed', claimed_by = $1,
            claimed_until = (SELECT ms FROM clock) + $2,
            attempts = s.attempts + 1, claim_token = gen_random_uuid()::text
       FROM picked WHERE s.seq = picked.seq AND s.sub = picked.sub
     RETURNING s.seq, s.sub, s.attempts, s.attempts - s.budget_floor, s.claim_token"
    )
}

/// An ordered subscription's claim first looks at this many times its limit of the oldest due
/// states (see `claim_due_sql`).
const WINDOW: usize = 4;

/// Turns the subscriptions take at being claimed first.
static ROTATION: AtomicUsize = AtomicUsize::new(0);

/// (seq, sub, attempts, budget used, claim token) of a claimed state row.
pub(super) type Picked = (i64, i64, i64, i64, String);

fn picked(r: &postgres::Row) -> StoreResult<Picked> {
    Ok((
        r.try_get(0)?,
        r.try_get(1)?,
        r.try_get(2)?,
        r.try_get(3)?,
        r.try_get(4)?,
    ))
}

/// The due work of `subs`, in turns, up to `limit` claims in all.
pub(super) fn claim_due(
    db: &mut Db<'_>,
    routes: &Routes,
    subs: &[i64],
    worker: &str,
    limit: usize,
    lease_ms: i64,
    claims: &mut Vec<Picked>,
) -> StoreResult<()> {
    let turn = ROTATION.fetch_add(1, Ordering::Relaxed);
    for i in 0..subs.len() {
        let room = limit.saturating_sub(claims.len());
        if room == 0 {
            break;
        }
        let sub = subs[(turn + i) % subs.len()];
        let ordered = ordered_sub(&routes.live, sub);
        let window = ordered.map(|_| (room * WINDOW).max(64));
        let room = i64::try_from(room).unwrap_or(i64::MAX);
        let before = claims.len();
        for r in db.query(
            &claim_due_sql(ordered, window),
            &[&worker, &lease_ms, &sub, &room],
        )? {
            claims.push(picked(&r)?);
        }
        // An ordered subscription's window held nothing claimable: if it was full, look at
        // the whole backlog (at most every `WHOLE_LOOK_EVERY`), so that no key waits behind
        // a long held one.
        if let Some(w) = window.filter(|_| claims.len() == before) {
            let full: bool = db
                .query_one(
                    &format!(
                        "SELECT count(*) = {w} FROM (SELECT 1 FROM event_state
                          WHERE sub = $1 AND status = 'pending' AND next_attempt_at <= {NOW_MS}
                          LIMIT {w}) x"
                    ),
                    &[&sub],
                )?
                .try_get(0)?;
            if full && routes.whole_look_due(sub) {
                for r in db.query(
                    &claim_due_sql(ordered, None),
                    &[&worker, &lease_ms, &sub, &room],
                )? {
                    claims.push(picked(&r)?);
                }
            }
        }
    }
    Ok(())
}

/// The subscriptions whose new states the in-process workers' fan-out claims at once (an
/// expression on `u`).
pub(super) const IN_PROCESS_CLAIMS_NOW: &str =
    "(u.lane = 0 AND NOT u.paused AND u.ordered_by IS NULL)";

/// `fan_out_to`: see [`fan_out_limit`] (`None`: nothing to fan out).
#[allow(clippy::too_many_arguments)]
pub(super) fn claim(
    db: &mut Db<'_>,
    cache: &RouteCache,
    version: Option<i64>,
    fan_out_to: Option<i64>,
    worker: &str,
    whose: ClaimFor,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Claimed>> {
    // `probing`: the lane's subscriptions whose breaker is open with a probe due (none waits
    // for its probe in `subs`, and these are not in it).
    let (mut routes, subs, probing): (Arc<Routes>, Vec<i64>, Vec<i64>) = match whose {
        // The kinds with workers of their own (forwarders, pull clients) are not the lane's.
        // Read with the registry's version, in one statement: the routes used are the ones
        // of the subscriptions listed.
        ClaimFor::Lane(lane) => {
            let row = db.query_one(
                "SELECT (SELECT version FROM subscription_registry WHERE id = 0),
                        array(SELECT id FROM subscriptions
                               WHERE claimer = $1 AND NOT paused AND removed_at IS NULL
                                 AND probe_at IS NULL
                               ORDER BY id),
                        array(SELECT id FROM subscriptions
                               WHERE claimer = $1 AND NOT paused AND removed_at IS NULL
                                 AND probe_at <= $2
                               ORDER BY id)",
                &[&lane.claimer().as_str(), &now],
            )?;
            let version: i64 = row.try_get(0)?;
            (cache.at(db, version)?, row.try_get(1)?, row.try_get(2)?)
        }
        // A subscription's own claim: the routes of the registry's version its caller read
        // (its gate's statement), or the kept ones.
        ClaimFor::Subscription(sub) => {
            let routes = match version {
                Some(version) => cache.at(db, version)?,
                None => cache.kept(db)?,
            };
            // Its gate was read by its caller (`breaker::claim`).
            (routes, vec![sub], Vec::new())
        }
    };
    let mut due = Vec::new();
    super::breaker::probe(
        db,
        &routes,
        &probing,
        worker,
        limit,
        (lease_ms, now),
        &mut due,
    )?;
    claim_due(db, &routes, &subs, worker, limit, lease_ms, &mut due)?;
    let room = limit - due.len();
    let mut claims = open(db, due, worker, lease_ms, now)?;
    for c in &mut claims {
        c.probe = probing.contains(&c.claim.subscription);
    }
    let claims_now = match whose {
        // An ordered subscription's rows start pending: claimed below, by key.
        ClaimFor::Lane(Lane::InProcess) => Some(IN_PROCESS_CLAIMS_NOW.to_string()),
        ClaimFor::Lane(Lane::CallOut) => None,
        ClaimFor::Subscription(sub) => Some(format!(
            "(u.id = {sub} AND NOT u.paused AND u.ordered_by IS NULL)"
        )),
    };
    if let (Some(claims_now), Some(to), true) = (claims_now, fan_out_to, room > 0) {
        super::fan_out::lock(db)?;
        // Fanned out by the registry as this transaction sees it after the lock: a change
        // another node committed meanwhile (a subscription added) is in it (its start is read
        // under the same locks: see `subscriptions::sync`).
        routes = cache.current(db)?;
        let room = crate::store::routes::fan_out_room(&routes.live, whose, room);
        let room = i64::try_from(room).unwrap_or(i64::MAX);
        let sql = super::fan_out::fan_out_sql(&routes, &claims_now);
        for r in db.query(&sql, &[&worker, &lease_ms, &room, &to, &now])? {
            // A count of what a filter left out (`fan_out::LEFT_OUT`), not a claim.
            if r.try_get::<_, Option<String>>(4)?.is_none() {
                let (n, sub): (i64, i64) = (r.try_get(0)?, r.try_get(1)?);
                if let Some(s) = routes.live.iter().find(|s| s.id == sub) {
                    routes.left_out.add(&s.name, u64::try_from(n).unwrap_or(0));
                }
                continue;
            }
            claims.push(claimed(&r, 5, picked(&r)?, now + lease_ms)?);
        }
        // What the fan-out did not claim, up to the limit.
        let limit = limit.saturating_sub(claims.len());
        let mut due = Vec::new();
        if let ClaimFor::Subscription(_) = whose {
            // Another node's fan-out, committed while this one waited for the lock, may have
            // given this subscription pending rows: this statement's snapshot sees them. (An
            // ordered one's new rows too.)
            claim_due(db, &routes, &subs, worker, limit, lease_ms, &mut due)?;
        } else {
            let ordered: Vec<i64> = subs
                .iter()
                .copied()
                .filter(|&s| ordered_sub(&routes.live, s).is_some())
                .collect();
            claim_due(db, &routes, &ordered, worker, limit, lease_ms, &mut due)?;
        }
        claims.extend(open(db, due, worker, lease_ms, now)?);
    }
    Ok(claims)
}

/// The columns of a claimed event that [`claimed`] reads (`l` the log, `p` the payloads).
pub(super) const EVENT_COLUMNS: &str =
    "l.source, l.event_id, l.event_type, p.payload, p.content_type, l.received_at, p.traceparent";

/// A claim as the worker gets it, from a row whose columns from `at` on are
/// [`EVENT_COLUMNS`]. `claimed_until` is in the caller's clock, for the handler's "does the
/// lease cover the call" check: the database's lease began after the caller's `now`, so it
/// ends no earlier.
fn claimed(
    r: &postgres::Row,
    at: usize,
    picked: Picked,
    claimed_until: i64,
) -> StoreResult<Claimed> {
    let (seq, sub, attempt, budget_used, claim_token) = picked;
    Ok(Claimed {
        claim: ClaimRef {
            seq,
            source: r.try_get(at)?,
            event_id: r.try_get(at + 1)?,
            subscription: sub,
            attempt,
            claim_token,
            row: None,
        },
        event_type: r.try_get(at + 2)?,
        budget_used,
        payload: r.try_get(at + 3)?,
        content_type: r.try_get(at + 4)?,
        received_at: r.try_get(at + 5)?,
        claimed_until,
        traceparent: r.try_get(at + 6)?,
        probe: false,
    })
}

/// Open the attempts of rows claimed by [`claim_due`] and read their events: two statements
/// (none for no claims). The fan-out does both in its own statement.
fn open(
    db: &mut Db<'_>,
    picked: Vec<Picked>,
    worker: &str,
    lease_ms: i64,
    now: i64,
) -> StoreResult<Vec<Claimed>> {
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let seqs: Vec<i64> = picked.iter().map(|c| c.0).collect();
    let subs: Vec<i64> = picked.iter().map(|c| c.1).collect();
    let attempts: Vec<i64> = picked.iter().map(|c| c.2).collect();
    db.execute(
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at)
         SELECT seq, sub, attempt, $4, $5 FROM unnest($1::bigint[], $2::bigint[], $3::bigint[])
             AS t (seq, sub, attempt)",
        &[&seqs, &subs, &attempts, &worker, &now],
    )?;
    let events = db.query(
        &format!(
            "SELECT l.seq, {EVENT_COLUMNS}
               FROM event_log l JOIN event_payloads p ON p.seq = l.seq
              WHERE l.seq = ANY($1)"
        ),
        &[&seqs],
    )?;
    let by_seq: std::collections::HashMap<i64, &postgres::Row> = events
        .iter()
        .map(|r| Ok((r.try_get(0)?, r)))
        .collect::<StoreResult<_>>()?;
    let mut claims = Vec::with_capacity(picked.len());
    for p in picked {
        match by_seq.get(&p.0) {
            Some(r) => claims.push(claimed(r, 1, p, now + lease_ms)?),
            None => bodiless(db, p, now)?,
        }
    }
    Ok(claims)
}

/// What a state whose event has no body left becomes when it is claimed: failed at once, with
/// the reason in its history, rather than a claim that fails (and with it every claim after it
/// that meets the same row). Nothing can deliver it, and ops see why.
fn bodiless(
    db: &mut Db<'_>,
    (seq, _, attempt, _, claim_token): Picked,
    now: i64,
) -> StoreResult<()> {
    const WHY: &str = "the event's body is gone (purged): nothing to deliver";
    tracing::warn!(seq, "a claimed event has no body left: failed");
    let claim = ClaimRef {
        source: String::new(),
        event_id: String::new(),
        seq,
        subscription: 0,
        claim_token,
        attempt,
        row: None,
    };
    let sql = fenced_sql(
        "status = 'failed', last_error = $7, abandoned = false, next_attempt_at = NULL",
        Fence::Expired,
    );
    fenced(
        db,
        &sql,
        &claim,
        now,
        Some(AttemptResult::PermanentError),
        Some(WHY),
        &[&WHY],
    )?;
    Ok(())
}
