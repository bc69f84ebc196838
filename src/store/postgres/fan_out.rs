//! The fan-out on PostgreSQL: the first claim that reaches events after the cursor gives each
//! one state row per live subscription whose route matches, and moves the cursor past them,
//! never past an insert that has not committed (see [`fan_out_limit`]).

use super::NOW_MS;
use super::session::{Conn, Db};
use super::subscriptions::Routes;
use crate::store::StoreResult;

/// The advisory lock (of a transaction) that orders webhooks' inserts and the fan-out: an
/// insert of a lane-0 event holds it shared from before its `seq` is taken to its commit (see
/// `ingest`), and [`fan_out_limit`] takes it exclusively for a moment. Locks of this kind are
/// per database.
pub(super) const INGEST_LOCK: i64 = 0x7765_6268_6f6f_6b6c;

/// The lock a node takes, for its transaction, to fan events out: one fan-out at a time, so
/// that two nodes never read the same cursor. Another claim waits for it (for the rest of the
/// holder's short transaction) rather than skip the fan-out: a worker that found nothing would
/// rest until the next poll while events wait (seen: six workers where one did all the work).
/// Taken with `pg_advisory_xact_lock`, no row written, in a statement of its own before the
/// fan-out's: the fan-out's snapshot, taken after the lock, sees the cursor as the previous
/// holder committed it (a snapshot taken before could see an older cursor, and fan the same
/// events out again: seen as a duplicate state key with six workers).
pub(super) const FAN_OUT_LOCK: i64 = 0x7765_6268_6f6f_6b66;

/// Take [`FAN_OUT_LOCK`] for the caller's transaction, in a statement of its own (the next
/// statement's snapshot then sees what the previous holder committed).
pub(super) fn lock(db: &mut Db<'_>) -> StoreResult<()> {
    db.execute(
        &format!("SELECT pg_advisory_xact_lock({FAN_OUT_LOCK})"),
        &[],
    )?;
    Ok(())
}

/// How far the fan-out may go, read before the claim's transaction: `None` when nothing was
/// stored after the cursor. Else the highest `seq` handed out so far, read once no webhook
/// insert is in flight (the exclusive [`INGEST_LOCK`]): every lane-0 event up to it is
/// committed or rolled back, and a later one gets a higher `seq`. Inserts wait for this moment;
/// it is taken only when there is something new. One statement in a transaction of its own
/// (the lock is held to its end): the sequence is read in the projection over the row that
/// took the lock, so after it (the sequence is not versioned: this is what was handed out).
pub(super) fn fan_out_limit(conn: &mut Conn) -> StoreResult<Option<i64>> {
    const LAST: &str =
        "coalesce(pg_sequence_last_value(pg_get_serial_sequence('event_log', 'seq')), 0)";
    let rows = conn.query_alone(
        &format!(
            "WITH behind AS MATERIALIZED (
                SELECT {LAST} > (SELECT after_seq FROM queue_cursor) AS yes
             ), locked AS MATERIALIZED (
                SELECT pg_advisory_xact_lock({INGEST_LOCK}) FROM behind WHERE yes
             )
             SELECT {LAST} FROM locked"
        ),
        &[],
    )?;
    Ok(match rows.first() {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

/// The fan-out of the next lane-0 events after the cursor, up to `$4` (see
/// [`fan_out_limit`]): a state row per live subscription whose route matches (claimed for the
/// ones `claims_now`, an expression on `u`, picks; pending for the others), the cursor moved
/// past them, and each claim's attempt opened, in one statement that returns the claims with
/// their events (after the five claim columns, `consume::EVENT_COLUMNS`). $1 worker, $2
/// lease, $3 limit, $4 the highest `seq` it may take, $5 the caller's clock (the attempts'
/// start). One round trip under the fan-out's lock, where three were (the attempts and the
/// bodies each had theirs): every other claim waits for this lock.
pub(super) fn fan_out_sql(routes: &Routes, claims_now: &str) -> String {
    // The scan first reads at most this many times the limit of numbers past the cursor
    // (`near`). Bounded by `$4` alone, a custom plan (the first five runs of the statement on
    // each connection) knew how far `$4` was and read the whole backlog in a bitmap scan, then
    // sorted it for the limit: 10 to 33 ms for a backlog of 50,000, all of it under the
    // fan-out's lock, and more for a larger one (seen with auto_explain in a drain; the
    // generic plan walks the key and stops at the limit). Only when that range holds no event
    // at all (a run of numbers taken by duplicates or rolled back) does it read on to `$4`
    // (`far`), so that the events behind such a run wait for no further claim.
    const SPAN: i64 = 4;
    format!(
        "WITH clock AS MATERIALIZED (SELECT {NOW_MS} AS ms),
         cur AS MATERIALIZED (
            SELECT after_seq, least($4::bigint, after_seq + $3::bigint * {SPAN}) AS hi
              FROM queue_cursor WHERE id = 0
         ), near AS MATERIALIZED (
            -- The cursor and the range's end as values (init plans), so that the primary
            -- key's scan starts at the cursor: as a join, the plan walked the log from its
            -- first event each time.
            SELECT l.seq, l.lane, l.source, l.event_type, l.received_at FROM event_log l
             WHERE l.seq > (SELECT after_seq FROM cur) AND l.seq <= (SELECT hi FROM cur)
             ORDER BY l.seq LIMIT $3
         ), far AS MATERIALIZED (
            SELECT l.seq, l.lane, l.source, l.event_type, l.received_at FROM event_log l
             WHERE NOT EXISTS (SELECT 1 FROM near)
               AND l.seq > (SELECT hi FROM cur) AND l.seq <= $4
             ORDER BY l.seq LIMIT $3
         ), scanned AS MATERIALIZED (
            SELECT * FROM near UNION ALL SELECT * FROM far
         ), batch AS MATERIALIZED (
            SELECT * FROM scanned WHERE lane = 0
         ), moved AS (
            -- Past the last event scanned; when fewer than the limit were, past the end of
            -- the range read (`near`'s, or `$4` if `far` was read): numbers taken by
            -- duplicates and rolled-back inserts leave gaps the cursor must pass too.
            UPDATE queue_cursor q
               SET after_seq = greatest(q.after_seq,
                   CASE WHEN (SELECT count(*) FROM scanned) = $3 THEN (SELECT max(seq) FROM scanned)
                        WHEN EXISTS (SELECT 1 FROM near) THEN (SELECT hi FROM cur)
                        ELSE $4 END)
             WHERE q.id = 0 AND EXISTS (SELECT 1 FROM cur)
         ), fanned AS (
            INSERT INTO event_state (seq, sub, lane, status, attempts, next_attempt_at,
                                     claimed_until, claimed_by, claim_token, order_key)
            SELECT b.seq, u.id, u.lane,
                   CASE WHEN {claims_now} THEN 'claimed' ELSE 'pending' END,
                   CASE WHEN {claims_now} THEN 1 ELSE 0 END,
                   b.received_at,
                   CASE WHEN {claims_now} THEN (SELECT ms FROM clock) + $2 END,
                   CASE WHEN {claims_now} THEN $1 END,
                   CASE WHEN {claims_now} THEN gen_random_uuid()::text END,
                   {}
              FROM batch b {} CROSS JOIN subscriptions u
             WHERE u.removed_at IS NULL AND b.seq > u.start_after_seq AND {}
            RETURNING seq, sub, status, attempts, attempts - budget_floor AS used, claim_token
         ), opened AS (
            INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at)
            SELECT seq, sub, attempts, $1, $5 FROM fanned WHERE status = 'claimed'
         )
         SELECT f.seq, f.sub, f.attempts, f.used, f.claim_token, {}
           FROM fanned f JOIN event_log l ON l.seq = f.seq
           -- Left: a claim whose body is missing fails the claim (a NULL read as bytes),
           -- as `consume::open` does, rather than vanish from the answer while claimed.
           LEFT JOIN event_payloads p ON p.seq = f.seq
          WHERE f.status = 'claimed'{}",
        routes.keys_by_id("(SELECT p.payload FROM event_payloads p WHERE p.seq = b.seq)"),
        bodies_join(routes, "batch b", "b.", "true"),
        routes.by_id("b."),
        super::consume::EVENT_COLUMNS,
        left_out(routes),
    )
}

/// The state rows of one submitted request (lane 1), written when it is stored: pending, due
/// now, for each live subscription whose route takes it. $1 seq.
pub(super) fn fan_out_one_sql(routes: &Routes) -> String {
    format!(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at)
         SELECT l.seq, u.id, u.lane, 'pending', l.received_at
           FROM event_log l {} CROSS JOIN subscriptions u
          WHERE l.seq = $1 AND u.removed_at IS NULL AND l.seq > u.start_after_seq AND {}",
        bodies_join(routes, "event_log l", "l.", "l.seq = $1"),
        routes.by_id("l.")
    )
}

/// The join of the filters' bodies (`j.body`) to the events `{alias}seq` of `from`, or nothing
/// when no subscription has a filter (the statement is then what it was before filters).
/// Materialized: each body is parsed once, however many subscriptions read it.
fn bodies_join(routes: &Routes, from: &str, alias: &str, only: &str) -> String {
    if !routes.filtered() {
        return String::new();
    }
    format!(
        "LEFT JOIN (SELECT * FROM ({}) x OFFSET 0) j ON j.seq = {alias}seq",
        routes.bodies(from, alias, only)
    )
}

/// Rows of the fan-out's answer that count, for each filtered subscription, the events of the
/// batch its route took (no body read) less the rows it was given: `(count, sub)` in the
/// claims' first two columns, no claim token. Nothing without a filtered subscription.
fn left_out(routes: &Routes) -> String {
    let arms: String = routes
        .live
        .iter()
        .filter(|s| s.filter.is_some())
        .map(|s| {
            format!(
                " WHEN {} THEN {}",
                s.id,
                super::subscriptions::route_sql(&s.route, "b.")
            )
        })
        .collect();
    if arms.is_empty() {
        return String::new();
    }
    // As many NULLs as the claims' columns after the first two: the three other claim
    // columns and the event's (which grow: the trace context joined them).
    let nulls = vec!["NULL"; 3 + super::consume::EVENT_COLUMNS.split(',').count()].join(", ");
    format!(
        "
         UNION ALL
         SELECT count(*) - (SELECT count(*) FROM fanned f WHERE f.sub = u.id), u.id,
                {nulls}
           FROM batch b CROSS JOIN subscriptions u
          WHERE u.removed_at IS NULL AND b.seq > u.start_after_seq
            AND (CASE u.id{arms} ELSE false END)
          GROUP BY u.id"
    )
}
