//! All SQL lives behind [`Store`], so that a PostgreSQL store can stand beside SQLite without
//! touching routes or consumers.
//!
//! The trait is synchronous: rusqlite blocks, and so would a `postgres` client. Callers on the
//! async side go through `spawn_blocking`. Every method that changes state is one transaction;
//! invariants (one row per event key, one credit per order, fenced completion) are enforced by
//! the database inside that transaction, never by a read followed by a write.

pub mod alerts;
mod claims;
pub mod copy;
mod error;
pub mod filters;
pub mod postgres;
pub mod registry;
mod rejection;
mod request_types;
pub mod routes;
pub mod rules;
pub mod secrets;
pub mod sql;
pub mod sqlite;
mod types;

use std::sync::Arc;

pub use claims::*;
pub use error::{StoreError, StoreResult, Unavailable};
pub use rejection::*;
pub use request_types::*;
pub use types::*;

use crate::domain::Database;
use crate::subscriptions::{HttpSettings, Subscription};
use copy::{Cell, Row, Table};
use postgres::{PostgresOptions, PostgresStore};
use sqlite::{SqliteOptions, SqliteStore};

/// Open the store `database` names, without migrating: the one place that picks a store.
pub fn open(database: &Database) -> anyhow::Result<Arc<dyn Store>> {
    match database {
        Database::Sqlite(path) => Ok(Arc::new(SqliteStore::open(path, SqliteOptions::default())?)),
        Database::Postgres(url) => Ok(Arc::new(PostgresStore::open(
            url,
            PostgresOptions::default(),
        )?)),
    }
}

/// Decides, per expired claim, what the sweeper does with it (the rule lives above the store).
pub type DecideExpiry<'a> = &'a (dyn Fn(&ExpiredClaim) -> Expiry + Sync);

pub trait Store: Send + Sync + 'static {
    /// Apply pending migrations (idempotent).
    fn migrate(&self) -> StoreResult<Vec<u32>>;
    /// Whether the store can serve: reachable, migrations applied, writable, writes durable.
    fn ready(&self) -> StoreResult<Readiness>;
    /// Wake `wake` whenever another process queues work, so that idle consumers on every node
    /// start at once (PostgreSQL's LISTEN/NOTIFY). Polling stays the fallback; a store whose
    /// writers are all in this process (SQLite) has nothing to add.
    fn on_queued(&self, _wake: Arc<tokio::sync::Notify>) {}

    // Subscriptions (SPEC section 13).
    /// Make the store's subscriptions the config's, by name: a new one gets an id and takes
    /// the events stored after now; one no longer named is marked removed (its work stops, its
    /// history stays); one named again comes back. Returns the ids in `subs`' order.
    fn sync_subscriptions(&self, subs: &[Subscription], now: i64) -> StoreResult<Vec<i64>>;
    /// This node is alive and its config names these subscriptions (see `store::registry`):
    /// at start, before `sync_subscriptions`, and every `registry::HEARTBEAT` after.
    fn node_seen(&self, node: &str, subscriptions: &[String], now: i64) -> StoreResult<()>;
    /// This node stops: its config keeps no subscription alive any more.
    fn node_gone(&self, node: &str) -> StoreResult<()>;
    /// Remove the subscriptions from configs that no live node's config names any more (the
    /// last node that named one stopped or crashed), finishing their work; how many. Each
    /// node's heartbeat runs it. It also finishes what removed subscriptions still hold (a
    /// node that died between a removal and its finishing left it: `registry::LEFT_UNFINISHED_SQL`).
    /// It also removes the `listen` sessions not seen (claiming) since `sessions_idle_before`,
    /// as `remove_subscription` does.
    fn prune_subscriptions(&self, now: i64, sessions_idle_before: i64) -> StoreResult<usize>;
    /// A `listen` session (origin `session`) claimed: not idle (see `prune_subscriptions`).
    /// Anything else is left alone.
    fn session_seen(&self, sub: i64, now: i64) -> StoreResult<()>;
    // Secrets (`store::secrets`): values are kept as given (sealed, or digests: `crate::secrets`).
    /// Every secret of subscription `name` valid at `now` (current ones first, then older ones
    /// in a rotation's grace, newest first).
    fn subscription_secrets(&self, name: &str, now: i64)
    -> StoreResult<Vec<secrets::StoredSecret>>;
    /// The secret of `name` for `purpose` that every node shares: `value` becomes it if there
    /// is none yet; the current one either way, whichever node made it.
    fn keep_secret(
        &self,
        name: &str,
        purpose: secrets::Purpose,
        value: &str,
        now: i64,
    ) -> StoreResult<secrets::StoredSecret>;
    /// A node's config gives these secrets: they replace every kept one of that purpose (the
    /// first current, the others valid while a config lists them). Moves the registry's version.
    fn put_config_secrets(
        &self,
        name: &str,
        purpose: secrets::Purpose,
        values: &[String],
        now: i64,
    ) -> StoreResult<()>;
    /// `value` becomes the current secret of `name` for `purpose`; the one before stays valid
    /// until `now + grace_ms`, then is dropped. Refused for a secret a config gives. Moves the
    /// registry's version, so that every node reads the secrets again.
    fn rotate_secret(
        &self,
        name: &str,
        purpose: secrets::Purpose,
        value: &str,
        grace_ms: i64,
        now: i64,
    ) -> StoreResult<secrets::Rotation>;
    /// The subscriptions not removed, as `(id, name)`.
    fn subscription_ids(&self) -> StoreResult<Vec<(i64, String)>>;
    /// The live subscriptions with their kinds and rules, as the registry holds them now (the
    /// cached view, read again when the registry changed).
    fn registry(&self) -> StoreResult<Vec<routes::Live>>;
    /// [`Store::registry`] with the registry's version it was read at.
    fn registry_at(&self) -> StoreResult<(i64, Vec<routes::Live>)>;
    /// The registry's version of the store's cached view (`None` before it read one): no
    /// read of the database.
    fn registry_version_seen(&self) -> Option<i64>;
    /// How many events this node's fan-outs left out of each filtered subscription, by name
    /// (`webhook_inbox_filtered_out_total`; no read of the database).
    fn filtered_out(&self) -> Vec<(String, u64)>;
    /// Add a subscription through the API (`origin` `api`, which no config's sync or prune
    /// removes, or `session`, a `listen` session's, which the prune removes when idle; see
    /// `store::registry`): it takes the events stored after now. A name removed earlier comes
    /// back as a new subscription, its history kept. `secrets` are kept with it, in its
    /// transaction, in the form the store keeps them (`crate::secrets::Vault::kept_forms`),
    /// replacing any an earlier subscription of that name left: it is never served without them.
    fn create_subscription(
        &self,
        sub: &Subscription,
        secrets: &[(secrets::Purpose, String)],
        origin: &str,
        now: i64,
    ) -> StoreResult<registry::Created>;
    /// Change a live subscription through the API by `change`, which sees it as the registry
    /// holds it in the writing transaction; it becomes origin `api`, a session staying one (its secrets change by
    /// rotation: `crate::secrets`).
    fn update_subscription(
        &self,
        name: &str,
        change: registry::Change<'_>,
    ) -> StoreResult<registry::Updated>;
    /// Remove a live subscription, whatever its origin (a session only, with `sessions_only`:
    /// what a listen token may remove, decided in the removing statement), finishing its
    /// unfinished states (completed, outcome `removed`) and forgetting its secrets: how many
    /// states it finished, `None` when no live subscription (session) has that name.
    fn remove_subscription(
        &self,
        name: &str,
        sessions_only: bool,
        now: i64,
    ) -> StoreResult<Option<usize>>;
    /// Every subscription, removed ones last, with counts by status. `completed` counts are
    /// read from the whole history (a scan on SQLite): `false` leaves them 0, for `/metrics`.
    fn subscriptions(&self, completed: bool) -> StoreResult<Vec<SubscriptionInfo>>;
    /// Pause (nothing is claimed for it; its events wait) or resume. `false`: no live
    /// subscription has that name.
    fn set_paused(&self, name: &str, paused: bool) -> StoreResult<bool>;
    /// Pause subscription `sub` for its endpoint's 410, only while it still delivers by
    /// `settings` (as for [`Store::open_breaker`]): whether it paused it.
    fn pause_gone(&self, sub: i64, settings: &HttpSettings) -> StoreResult<bool>;
    /// Hand a subscription the events it matches that were stored at or after `since` (unix
    /// ms) and that it has no state for (stored before it was added): pending, due now.
    /// `None`: no live subscription has that name.
    fn backfill(&self, name: &str, since: i64, now: i64) -> StoreResult<Option<usize>>;

    // Forwarding (`http` subscriptions: `crate::forward`).
    /// Claim up to `limit` due events of one subscription, fanning new events out as the
    /// consumer workers' claim does (this subscription's rows start claimed), in one
    /// transaction. Nothing while it is paused or removed, or while its circuit breaker waits
    /// for the next probe; once a probe is due, one event, and the probe after it waits for
    /// `lease_ms` (so that one node at a time probes, until [`Store::open_breaker`] or
    /// [`Store::close_breaker`] says how it went).
    fn claim_subscription(
        &self,
        worker: &str,
        sub: i64,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<SubscriptionClaim>;
    /// A forwarder's round: commit its answers (`finish`), then, with `claim`, claim up to that
    /// many events of its subscription (`claim_subscription`), in one transaction (a busy
    /// forwarder writes once a round).
    fn finish_and_claim_subscription(
        &self,
        items: &[Finish],
        worker: &str,
        sub: i64,
        claim: Option<usize>,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<(Vec<Finished>, Option<SubscriptionClaim>)>;
    /// Open the circuit breaker: after a run of failures of a closed breaker, the next probe
    /// comes `first_ms` later (a breaker open already is left as it is); after a failed probe
    /// (`after_probe`), twice the last wait later, at most `max_ms`. Only while the
    /// subscription still delivers by `settings` (the failing forwarder's): the failures of a
    /// target a change replaced say nothing of the new one, whose breaker the change closed.
    /// `None` for a subscription whose target is not in its row (the node's `[downstream]`):
    /// no fence.
    fn open_breaker(
        &self,
        sub: i64,
        settings: Option<&HttpSettings>,
        after_probe: bool,
        first_ms: i64,
        max_ms: i64,
        now: i64,
    ) -> StoreResult<()>;
    /// A call went through: claims flow again (only while the subscription still delivers by
    /// `settings`, as for [`Store::open_breaker`]).
    fn close_breaker(&self, sub: i64, settings: Option<&HttpSettings>) -> StoreResult<()>;
    /// Move the lease of each claim still held to `lease_ms` from now, and say until when
    /// (unix ms); `None` for a claim no longer held (finished, swept, or its lease ran out),
    /// fenced as a worker's own transitions are. For `pull` clients that need longer.
    fn extend_claims(
        &self,
        claims: &[ClaimRef],
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<Vec<Option<i64>>>;

    // Ingest.
    /// Insert deliveries in one transaction (one fsync); each gets its own outcome. Later items
    /// see earlier ones, so duplicates within a batch are answered correctly.
    fn insert_deliveries(&self, batch: &[NewDelivery]) -> StoreResult<Vec<InsertOutcome>>;

    // Reading events.
    fn event(&self, source: &str, event_id: &str) -> StoreResult<Option<EventDetail>>;
    fn list_events(&self, filter: &EventFilter, page: Page) -> StoreResult<Vec<EventRecord>>;
    fn status_counts(&self) -> StoreResult<StatusCounts>;
    /// Events (not subscription states) by their summary status ([`sql::stats::event_counts_sql`]): what the
    /// overview shows. `pending` leaves out the events not fanned out yet (see
    /// [`StatusCounts::fan_out_waiting`]); `oldest_due_at` is not read.
    fn event_counts(&self) -> StoreResult<StatusCounts>;
    /// Events first received at or after `since` (unix ms), counted per whole minute:
    /// `(minute start in unix ms, count)`, oldest first. For the dashboard's overview.
    fn received_per_minute(&self, since: i64) -> StoreResult<Vec<(i64, i64)>>;
    /// Like `list_events`, with each event's stored body (for export and replay).
    fn export_events(&self, filter: &EventFilter, page: Page) -> StoreResult<Vec<ExportedEvent>>;

    // Consuming.
    /// Move up to `limit` due pending events of `lane` to `claimed` in one statement, count
    /// the attempt and open its history row, all in one transaction.
    fn claim(
        &self,
        worker: &str,
        lane: Lane,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<Vec<Claimed>>;
    /// Apply finished attempts in one transaction, each fenced by its claim token. An effect
    /// the database refuses fails that event alone; the others commit.
    fn finish(&self, items: &[Finish], now: i64) -> StoreResult<Vec<Finished>>;
    /// `finish`, then `claim`, in one transaction: a busy worker commits once per batch.
    fn finish_and_claim(
        &self,
        items: &[Finish],
        worker: &str,
        lane: Lane,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<(Vec<Finished>, Vec<Claimed>)>;
    /// Give back claims whose handler never started (shutdown).
    fn release(&self, claims: &[ClaimRef], now: i64) -> StoreResult<usize>;
    /// Give back claims that were no attempt at all (nothing was sent): pending, due now, with
    /// the claim's attempt taken back from the count and the history.
    fn give_back(&self, claims: &[ClaimRef], now: i64) -> StoreResult<usize>;
    /// [`Store::give_back`] for the breaker's probe (a claim its gate allowed alone): the next
    /// probe, which its claim set a lease away, is due now, unless the breaker closed
    /// meanwhile. `false`: the claim was no longer held.
    fn give_back_probe(&self, claim: &ClaimRef, now: i64) -> StoreResult<bool>;
    /// Expired leases: back to pending, or failed for at-most-once handlers and spent budgets.
    /// Apply `decide` to every claim whose lease has run out, each transition fenced by its
    /// claim token, in one transaction.
    fn sweep(&self, now: i64, decide: DecideExpiry<'_>) -> StoreResult<usize>;

    // Ops.
    /// Retry one event: the state of `subscription`, or each failed state of the event.
    fn retry(
        &self,
        source: &str,
        event_id: &str,
        subscription: Option<&str>,
        force: bool,
        now: i64,
    ) -> StoreResult<RetryOutcome>;
    fn retry_failed(&self, filter: &EventFilter, now: i64) -> StoreResult<usize>;
    /// Skip `subscription`'s state of an event (one that holds its key in an ordered
    /// subscription): a failed or pending state becomes completed with outcome `skipped`, with
    /// an attempt by `ops` in its history, so that the later events of its key go on.
    fn skip(
        &self,
        source: &str,
        event_id: &str,
        subscription: &str,
        now: i64,
    ) -> StoreResult<SkipOutcome>;
    /// The keys of an ordered subscription held by a failed event, the oldest first.
    fn held_keys(&self, subscription: &str, limit: usize) -> StoreResult<Vec<HeldKey>>;
    /// The balance and one page of credits, newest first, paged like events.
    fn loyalty(&self, customer_id: &str, page: Page) -> StoreResult<LoyaltyAccount>;

    // Retention (SPEC section 12).
    /// One small batch of the purge: up to `limit` terminal events after `seq` `after` that
    /// became terminal before their cutoff lose their body and history and keep a tombstone.
    /// Finding them holds no write lock; the write is one short transaction in the writer's
    /// queue like any other. Walk the table with `next_after` until it is `None`.
    fn purge_batch(
        &self,
        cutoffs: &PurgeCutoffs,
        after: i64,
        limit: usize,
        now: i64,
    ) -> StoreResult<PurgeBatch>;
    /// Whether every event with a `seq` in `(after, through]` is a tombstone (its body purged)
    /// and no event can still be given a `seq` there. Such events never change again: a retry,
    /// a backfill and a purge all need the body.
    fn tombstones_through(&self, after: i64, through: i64) -> StoreResult<bool>;
    fn lifecycle_counts(&self) -> StoreResult<LifecycleCounts>;

    // Submission API.
    fn create_request(&self, id: &str, now: i64) -> StoreResult<RequestRecord>;
    fn request(&self, id: &str) -> StoreResult<Option<RequestRecord>>;
    fn add_document(
        &self,
        request_id: &str,
        doc: &NewDocument,
        now: i64,
    ) -> StoreResult<AddDocument>;
    fn submit_request(&self, id: &str, now: i64) -> StoreResult<SubmitOutcome>;
    fn request_documents(&self, id: &str) -> StoreResult<Vec<DocumentContent>>;

    // Deliveries refused at the edge (bounded; see `crate::rejections`).
    /// Store a batch of refused deliveries and trim, in one transaction, to the newest `keep`
    /// and none received before `since` (unix ms).
    fn record_rejections(&self, batch: &[NewRejection], keep: u64, since: i64) -> StoreResult<()>;
    /// Refused deliveries, newest first, paged like events (by id).
    fn rejections(&self, filter: &RejectionFilter, page: Page)
    -> StoreResult<Vec<RejectionRecord>>;

    // Moving a database between stores (`webhook-inbox copy`, see `copy`).
    /// Up to `limit` rows of `table` whose key comes after `after` (empty: from the first), in
    /// key order, with the columns `table` names.
    fn copy_out(&self, table: &Table, after: &[Cell], limit: usize) -> StoreResult<Vec<Row>>;
    fn copy_count(&self, table: &Table) -> StoreResult<u64>;
    /// Write rows as they are, in one durable transaction, and say how many were written;
    /// rows already present are skipped (`copy::copy_all` checks first that each is the
    /// source's own).
    fn copy_in(&self, table: &Table, rows: &[Row]) -> StoreResult<u64>;
    /// Delete the seeded row ([`Table::seeded`](copy::Table::seeded)) of `key` (its first
    /// column): the source has none (a subscription made by the first migration and dropped
    /// by a node that never used it). Any other row is left alone.
    fn copy_forget(&self, table: &Table, key: i64) -> StoreResult<()>;
    /// After the last `copy_in`, in one transaction: the fan-out cursor set to the source's
    /// `cursor` ([`Store::fan_out_cursor`]), whatever the store derives from the rows (a
    /// sequence moved past the copied keys), and the registry's version moved on, so that a
    /// node reads the copied registry whatever it held before.
    fn copy_finished(&self, cursor: i64) -> StoreResult<()>;
    /// The `seq` up to which webhooks' events have their states (the fan-out's cursor).
    fn fan_out_cursor(&self) -> StoreResult<i64>;
    /// Mark a copy into this database as started (unix ms), or clear the mark (`None`).
    fn mark_copy(&self, started_at: Option<i64>) -> StoreResult<()>;
    /// When a copy into this database started that has not finished, if one has not.
    fn unfinished_copy(&self) -> StoreResult<Option<i64>>;

    /// Hold the database as `holder` for as long as the returned [`Hold`] lives: the nodes
    /// that serve it share it, a copy into it holds it alone. `None` while the other kind
    /// holds it: a node does not start while a copy fills its database, and a copy does not
    /// race live nodes' ingest and claims for the same keys.
    fn hold(&self, holder: Holder) -> StoreResult<Option<Hold>>;

    /// Alert state and notices (`crate::alerts`), shared by the nodes of one database.
    fn alerts(&self) -> &dyn alerts::AlertStore;
}

/// Who holds a database (see [`Store::hold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Node,
    Copy,
}

/// A hold on a database, let go when dropped. (Behind a mutex only so that it is `Sync`: a
/// PostgreSQL client is not, and nothing uses the hold but its drop.)
pub struct Hold {
    _held: std::sync::Mutex<Box<dyn Send>>,
}

impl Hold {
    pub fn new(held: impl Send + 'static) -> Hold {
        Hold {
            _held: std::sync::Mutex::new(Box::new(held)),
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hold")
    }
}
