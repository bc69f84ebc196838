//! What the alert engine (`crate::alerts`) keeps in the store: each alert's state, shared by
//! every node, and the outbox of notices. The rules (what holds, for how long, what a notice
//! says) live above; each store supplies the statements.
//!
//! Exactly one node writes each notice: an episode starts with one conditional `UPDATE ...
//! WHERE active = 0` (and clears with `... WHERE active = 1`), and the node whose statement
//! changed the row writes the notice in the same transaction; `UNIQUE (alert, episode, phase)`
//! backs it. Exactly one node at a time sends it: a claim with a lease, its later transitions
//! fenced by the claimer's token.

use super::StoreResult;

/// What one node saw of one alert's condition in one evaluation.
#[derive(Debug, Clone)]
pub struct Observation {
    /// `channel/condition/subject`.
    pub alert: String,
    pub channel: String,
    /// Whether the condition holds now.
    pub holding: bool,
    /// How long it must have held before a "started" notice (ms; 0: at once).
    pub for_ms: i64,
    /// What it is about, in words ("subscription `billing`: breaker open").
    pub title: String,
    /// The figure now ("open for 42 s"): the started notice's, or the cleared one's.
    pub figure: String,
    /// Where the dashboard shows it.
    pub link: String,
}

/// A notice written to the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub id: i64,
    pub alert: String,
    pub episode: i64,
    /// `started` or `cleared`.
    pub phase: String,
    pub channel: String,
    pub title: String,
    pub figure: String,
    /// When the condition started to hold (unix ms).
    pub since: i64,
    pub link: String,
    pub created_at: i64,
    /// Attempts to send it, this one included (on a claimed notice).
    pub attempts: i64,
}

/// An alert whose episode is open ("started" written, "cleared" not yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveAlert {
    pub alert: String,
    pub episode: i64,
    pub since: i64,
    pub figure: String,
}

pub trait AlertStore: Send + Sync {
    /// Apply one evaluation's observations, in one transaction: record when a condition
    /// started to hold, start an episode of one that has held for its `for_ms` (writing its
    /// "started" notice), clear the episode of one that no longer holds (writing "cleared").
    /// Returns the notices this call wrote: none when another node wrote them first.
    /// `now` is when the observations' snapshot was taken (before reading it): an alert
    /// started or cleared at or after it (`changed_at`) is left as it is, so that a stale
    /// snapshot applied late changes nothing.
    fn observe(&self, observations: &[Observation], now: i64) -> StoreResult<Vec<Notice>>;
    /// Claim up to `limit` unsent notices of `channel` that are due and not claimed by a live
    /// claim, for `lease_ms`, as `claimer`; counts the attempt. Notices past `max_attempts`
    /// stay unsent and are not claimed again.
    fn claim_notices(
        &self,
        channel: &str,
        claimer: &str,
        limit: usize,
        lease_ms: i64,
        max_attempts: i64,
        now: i64,
    ) -> StoreResult<Vec<Notice>>;
    /// The channel took it. `false`: the claim was no longer `claimer`'s (nothing changed).
    fn notice_sent(&self, id: i64, claimer: &str, now: i64) -> StoreResult<bool>;
    /// The channel failed: try again at `retry_at`.
    fn notice_failed(
        &self,
        id: i64,
        claimer: &str,
        error: &str,
        retry_at: i64,
    ) -> StoreResult<bool>;
    /// The alerts whose episode is open, by key.
    fn active_alerts(&self) -> StoreResult<Vec<ActiveAlert>>;
    /// What the conditions need of each live subscription, by id (see [`SUBJECTS`]).
    fn subjects(&self) -> StoreResult<Vec<AlertSubject>>;
    /// Per live subscription, its failed states whose last attempt finished at or after
    /// `since` (unix ms): `(subscription, count)`, only those with some.
    fn failed_since(&self, since: i64) -> StoreResult<Vec<(String, i64)>>;
    /// Per source, deliveries refused at the edge (and kept, see `crate::rejections`) at or
    /// after `since`: `(source, count)`.
    fn rejected_since(&self, since: i64) -> StoreResult<Vec<(String, i64)>>;
}

/// What the conditions read of one live subscription: no counts (a backlog is never counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSubject {
    pub name: String,
    pub kind: String,
    pub origin: String,
    pub paused: bool,
    /// When the open breaker probes next (`None`: closed).
    pub probe_at: Option<i64>,
    /// When its oldest due event became due (events not fanned out yet included).
    pub oldest_due_at: Option<i64>,
}

impl AlertSubject {
    /// Whether a circuit breaker can open (see [`crate::subscriptions::Kind::has_breaker`]).
    pub fn has_breaker(&self) -> bool {
        crate::subscriptions::Kind::parse(&self.kind)
            .is_some_and(crate::subscriptions::Kind::has_breaker)
    }

    /// How long its oldest due event has waited (s; 0 with none).
    pub fn lag_seconds(&self, now_ms: i64) -> f64 {
        self.oldest_due_at
            .map_or(0.0, |due| (now_ms - due).max(0) as f64 / 1000.0)
    }

    /// The oldest event not fanned out yet waits for every kind a fan-out gives a state.
    pub fn with_unrouted(mut self, unrouted: Option<i64>) -> AlertSubject {
        let waits = crate::subscriptions::Kind::parse(&self.kind)
            .is_some_and(crate::subscriptions::Kind::waits_on_fan_out);
        if waits {
            self.oldest_due_at = match (self.oldest_due_at, unrouted) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        self
    }
}

/// [`AlertStore::subjects`] on both stores: per live subscription, one seek of `events_due
/// (sub, next_attempt_at)` for its oldest due event. Plans (`tests/api/alerts_plans.rs`): SQLite
/// `SCAN u` then `SEARCH s USING COVERING INDEX events_due (sub=?)` per subscription, no temp
/// b-tree;
/// PostgreSQL an `Index Only Scan` (or `Index Scan`) `using events_due` with `Limit 1` per
/// subscription.
pub const SUBJECTS: &str = "SELECT u.name, u.kind, u.origin, u.paused, u.probe_at,
       (SELECT s.next_attempt_at FROM event_state s
         WHERE s.status = 'pending' AND s.sub = u.id
         ORDER BY s.next_attempt_at LIMIT 1)
  FROM subscriptions u WHERE u.removed_at IS NULL ORDER BY u.id";

/// [`AlertStore::failed_since`] on both stores (`$1` binds by position on SQLite too): the
/// failing attempts of the window, through the partial index `event_attempts_failing
/// (finished_at)` (written only by failing attempts: a successful finish writes no entry), each
/// counted if it is its state's last attempt (one seek of the attempts' key) and the state
/// failed (one seek of the state's key). Plans (`tests/api/alerts_plans.rs`): SQLite `SEARCH a
/// USING INDEX event_attempts_failing (finished_at>?)`, `SEARCH b USING PRIMARY KEY (event_seq=?
/// AND sub=?)`, `SEARCH s USING INDEX sqlite_autoindex_event_state_1 (seq=? AND sub=?)`;
/// PostgreSQL `Index Scan using event_attempts_failing` with `Index Cond: (finished_at >= ..)`,
/// then a seek per attempt (`event_attempts_pkey` backward for the last, the state by `seq`).
pub const FAILED_SINCE: &str = "SELECT u.name, count(*) FROM event_attempts a
  JOIN event_state s ON s.seq = a.event_seq AND s.sub = a.sub
  JOIN subscriptions u ON u.id = a.sub
 WHERE a.finished_at >= $1
   AND (a.result = 'retryable_error' OR a.result = 'permanent_error'
        OR a.result = 'lease_expired')
   AND a.attempt = (SELECT max(b.attempt) FROM event_attempts b
                     WHERE b.event_seq = a.event_seq AND b.sub = a.sub)
   AND s.status = 'failed' AND u.removed_at IS NULL
 GROUP BY u.name ORDER BY u.name";
