//! The values that cross the [`Store`](super::Store) boundary. Times are unix milliseconds.

use serde::Serialize;

/// What `/readyz` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// The schema is older than the binary: run `migrate`.
    NotMigrated,
    /// A write could not be made durable (a failed fsync): writes are refused until restart.
    NotDurable,
    /// The database refuses writes (a file made read-only, a filesystem remounted read-only).
    NotWritable,
}

/// A verified delivery, ready to be stored.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub payload: Vec<u8>,
    pub content_type: Option<String>,
    pub sha256: [u8; 32],
    pub received_at: i64,
    /// `on_payload_mismatch = "reject"`: a differing body is refused instead of counted.
    pub reject_mismatch: bool,
    /// Where it came from, which decides when it gets its state rows.
    pub origin: EventOrigin,
    /// The W3C `traceparent` its handling continues (see `telemetry::traces`); `None` when
    /// tracing is off and the provider sent none.
    pub traceparent: Option<String>,
}

/// Where an event came from. A webhook's event is fanned out to its subscriptions by the
/// consumers' claim, after the queue's cursor; a submitted request gets its state rows when it
/// is stored (for the `downstream` kind, which takes only these). Kept in `event_log.lane` as 0
/// and 1: the column keeps its name, since renaming it on PostgreSQL would need every node
/// stopped (docs/guides/operating.md, upgrades) for a name only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOrigin {
    Webhook,
    Submission,
}

impl EventOrigin {
    /// The value stored in `event_log.lane`.
    pub fn as_i64(self) -> i64 {
        match self {
            EventOrigin::Webhook => 0,
            EventOrigin::Submission => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    Queued,
    Duplicate,
    /// Same key, different body: counted, answered as a duplicate.
    Mismatch,
    /// Same key, different body, source in strict mode: answered 409.
    MismatchRejected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Claimed,
    Completed,
    Failed,
    /// An event that no subscription's route matched: stored, deduplicated and listed, with
    /// no subscription state (an event's summary only; never a subscription's status).
    Stored,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Claimed,
        Status::Completed,
        Status::Failed,
        Status::Stored,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Claimed => "claimed",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Stored => "stored",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// What a completed event's handler did (SPEC section 6a).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Credited,
    DuplicateOrder,
    Delivered,
    Logged,
    /// A transform gave no output: nothing was delivered, by the subscription's own rule.
    Filtered,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Credited => "credited",
            Outcome::DuplicateOrder => "duplicate_order",
            Outcome::Delivered => "delivered",
            Outcome::Logged => "logged",
            Outcome::Filtered => "filtered",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        [
            Outcome::Credited,
            Outcome::DuplicateOrder,
            Outcome::Delivered,
            Outcome::Logged,
            Outcome::Filtered,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// How an attempt ended (SPEC section 6a).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptResult {
    Ok,
    AlreadyProcessed,
    RetryableError,
    PermanentError,
    LeaseExpired,
}

impl AttemptResult {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Ok => "ok",
            AttemptResult::AlreadyProcessed => "already_processed",
            AttemptResult::RetryableError => "retryable_error",
            AttemptResult::PermanentError => "permanent_error",
            AttemptResult::LeaseExpired => "lease_expired",
        }
    }
}

/// An event as every route returns it, without payload and history.
#[derive(Debug, Clone)]
pub struct EventRecord {
    pub seq: i64,
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub status: Status,
    pub attempts: i64,
    pub deliveries: i64,
    pub payload_mismatches: i64,
    pub received_at: i64,
    pub last_delivered_at: i64,
    pub next_attempt_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub outcome: Option<String>,
    pub last_error: Option<String>,
    pub abandoned: bool,
    /// When the event became terminal; kept on tombstones (written by the purge).
    pub finished_at: Option<i64>,
    /// Set when the retention purge took the body and history: the row is a tombstone.
    pub purged_at: Option<i64>,
    /// The event's state in each subscription that took it (SPEC section 13). `status` is
    /// their summary; the other fields above are the state that decides it (the first failed,
    /// else claimed, pending, completed one). Filled by `event` and `list_events`.
    pub subscriptions: Vec<SubscriptionState>,
}

/// One subscription's state of one event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubscriptionState {
    pub name: String,
    pub status: Status,
    pub attempts: i64,
    pub outcome: Option<String>,
    pub last_error: Option<String>,
    pub abandoned: bool,
    pub next_attempt_at: Option<i64>,
    pub completed_at: Option<i64>,
}

/// A subscription as `GET /subscriptions` shows it.
#[derive(Debug, Clone)]
pub struct SubscriptionInfo {
    pub name: String,
    pub kind: String,
    pub route: crate::subscriptions::Route,
    pub paused: bool,
    /// No longer in the config: its work stopped, its history is kept.
    pub removed: bool,
    /// Its state rows by status (`pending` counts what waits in its own rows).
    pub counts: StatusCounts,
    /// When it was added (unix ms); it takes the events stored after that.
    pub created_at: i64,
    /// While its circuit breaker is open (`probing`), when the next probe may start.
    pub probe_at: Option<i64>,
    /// Where it came from: `config`, `api`, `session`.
    pub origin: String,
    /// The live nodes whose config names it (see `store::registry`).
    pub declared_by: Vec<String>,
    /// The rules every node decides its claims by.
    pub mode: crate::domain::DeliveryMode,
    pub max_attempts: u32,
}

impl SubscriptionInfo {
    /// Whether a circuit breaker stops its claims (see [`crate::subscriptions::Kind::has_breaker`]).
    pub fn has_breaker(&self) -> bool {
        crate::subscriptions::Kind::parse(&self.kind)
            .is_some_and(crate::subscriptions::Kind::has_breaker)
    }
}

#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// The subscription the attempt was made for.
    pub subscription: String,
    pub attempt: i64,
    pub worker: String,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub result: Option<String>,
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct EventDetail {
    pub event: EventRecord,
    /// SHA-256 of the first body: kept on tombstones, whose body is gone.
    pub payload_sha256: Vec<u8>,
    /// Empty on a tombstone (see `event.purged_at`), as is `history`.
    pub payload: Vec<u8>,
    pub content_type: Option<String>,
    pub history: Vec<AttemptRecord>,
}

/// An event with the body exactly as received.
#[derive(Debug, Clone)]
pub struct ExportedEvent {
    pub event: EventRecord,
    pub payload: Vec<u8>,
    pub content_type: Option<String>,
}

/// Filters of `GET /events` and bulk retry; every field optional.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub status: Option<Status>,
    pub source: Option<String>,
    pub event_type: Option<String>,
    pub received_after: Option<i64>,
    pub received_before: Option<i64>,
    /// Tombstones only (`status=purged`); otherwise tombstones are left out.
    pub purged: bool,
    /// Events this subscription took; `status` is then that subscription's status.
    pub subscription: Option<String>,
    /// Bulk retry only (a recover): failed states that failed at or after this time (ms), by
    /// [`FAILED_AT`].
    pub failed_since: Option<i64>,
}

/// When the failed state `s` (an `event_state` row) failed: the end of its last attempt (a
/// failure always ends a claimed attempt, in the same transaction); the event's last delivery
/// as a floor should a state have failed with no attempt row. The same SQL on both stores.
pub const FAILED_AT: &str = "coalesce(
    (SELECT max(a.finished_at) FROM event_attempts a WHERE a.event_seq = s.seq AND a.sub = s.sub),
    (SELECT f.last_delivered_at FROM events f WHERE f.seq = s.seq))";

/// Newest first: `before_seq` is the cursor (exclusive), `None` for the first page.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    pub limit: usize,
    pub before_seq: Option<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct StatusCounts {
    pub pending: i64,
    pub claimed: i64,
    pub completed: i64,
    pub failed: i64,
    /// When the longest-waiting unfinished event became due (pending or claimed; a pending
    /// event waiting on its backoff is not due yet), for the `oldest_pending_seconds` gauge.
    /// May lie in the future: then nothing is due.
    pub oldest_due_at: Option<i64>,
    /// Of `pending`: events stored but not yet fanned out to their subscriptions (counted
    /// once each). On PostgreSQL they wait, besides, until every older write transaction of
    /// the cluster has ended.
    pub fan_out_waiting: i64,
}

impl StatusCounts {
    /// How long the longest-waiting due work has waited, in seconds (`oldest_pending_seconds`):
    /// `None` when nothing is pending or claimed, 0 when all of it waits on a backoff.
    pub fn lag_seconds(&self, now_ms: i64) -> Option<f64> {
        self.oldest_due_at
            .map(|due| (now_ms - due).max(0) as f64 / 1000.0)
    }
}

#[derive(Debug, Clone)]
pub enum SkipOutcome {
    /// No such event, or no state of it in that subscription.
    NotFound,
    /// Completed with outcome `skipped`.
    Skipped(Box<EventRecord>),
    /// Its state is claimed (in flight) or completed already: nothing changed.
    Refused(Status),
}

/// A key of an ordered subscription (`on_failure = "hold"`) held by a failed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    pub key: String,
    pub source: String,
    pub event_id: String,
    /// When it failed (unix ms).
    pub failed_at: Option<i64>,
    /// Later events of the key waiting behind it.
    pub waiting: i64,
}

#[derive(Debug, Clone)]
pub enum RetryOutcome {
    NotFound,
    /// Moved to pending (or unchanged when it already was pending or claimed).
    Retried(EventRecord),
    Unchanged(EventRecord),
    /// Completed (or abandoned at-most-once) and `force` not given.
    NeedsForce(EventRecord),
    /// A tombstone: its body is gone, so it can never run again, forced or not.
    Purged(EventRecord),
    /// An ordered subscription's later event of the same key is in flight: run now, this one
    /// would be handled beside it, out of order. (source, event_id) of the one in flight.
    KeyInFlight(EventRecord, (String, String)),
}

/// What a purge may take (SPEC section 12): terminal events that became terminal before these
/// times (unix ms). `None` leaves that kind alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeCutoffs {
    pub completed_before: Option<i64>,
    pub failed_before: Option<i64>,
}

impl PurgeCutoffs {
    /// Whether events first received at or after `received_at` came after every cutoff:
    /// an event becomes terminal after it is received, so none of them can be due. A walk over
    /// the log in `seq` order stops at the first window received after the cutoffs, instead of
    /// reading every newer event (seen: a walk with nothing to purge read the whole log every
    /// ten minutes and kept the WAL from restarting while it did). Should a clock have stepped
    /// back, an event numbered after such a window but received earlier is purged that much
    /// later, by a later walk: late, never lost or early.
    pub fn after_every_cutoff(&self, received_at: Option<i64>) -> bool {
        let Some(received_at) = received_at else {
            return false;
        };
        [self.completed_before, self.failed_before]
            .into_iter()
            .flatten()
            .all(|cutoff| received_at >= cutoff)
    }
}

/// One purge batch: how many events became tombstones, and where the next batch starts (the
/// last `seq` examined), `None` once the walk reached the newest event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeBatch {
    pub purged: usize,
    pub next_after: Option<i64>,
}

/// The retention gauges of `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LifecycleCounts {
    pub tombstones: i64,
    /// The database file's pages in use and free (the free ones are reused before the file
    /// grows, or given back by an incremental vacuum).
    pub database_bytes: i64,
    pub free_bytes: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoyaltyCredit {
    pub order_id: String,
    pub points: i64,
    pub source: String,
    pub event_id: String,
    #[serde(skip)]
    pub credited_at: i64,
    /// The `seq` of the event that earned the credit: the page order and cursor.
    #[serde(skip)]
    pub seq: i64,
}

#[derive(Debug, Clone)]
pub struct LoyaltyAccount {
    pub customer_id: String,
    pub balance: i64,
    pub credits: Vec<LoyaltyCredit>,
}
