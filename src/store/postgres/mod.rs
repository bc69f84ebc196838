//! The PostgreSQL store, for several receiver nodes sharing one queue (SPEC section 8).
//!
//! The [`Store`] trait is synchronous, and r2d2 is already the pool: so the `postgres` client
//! (blocking) through `r2d2_postgres`. Each pooled connection keeps its own prepared statements
//! ([`session::Conn`]), so that a statement costs one round trip instead of two.
//!
//! Nothing here depends on a node's clock or a node-local lock for correctness: leases and due
//! times are compared with the database's clock ([`NOW_MS`]), claims take rows with
//! `FOR UPDATE SKIP LOCKED` in one statement, and every later transition is fenced by the claim
//! token, as on SQLite. Times that only record what happened (received, completed, attempt
//! start and end) are the caller's, as on SQLite.
//!
//! Every method is one transaction on one pooled connection; a commit is durable
//! (`synchronous_commit = on`, set in the connection options) before the method returns.

mod breaker;
mod consume;
mod copy;
mod errors;
mod events;
mod fan_out;
mod finish;
mod hold;
mod ingest;
mod leases;
mod listen;
mod migrations;
mod ordering;
mod purge;
mod rejections;
mod requests;
mod rows;
mod session;
mod subscriptions;
mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use r2d2::Pool;

use super::copy::{Cell, Row, Table};
use super::{
    AddDocument, ClaimFor, ClaimRef, Claimed, DecideExpiry, DocumentContent, EventDetail,
    EventFilter, EventRecord, ExportedEvent, Finish, Finished, HeldKey, Hold, Holder,
    InsertOutcome, Lane, LifecycleCounts, LoyaltyAccount, NewDelivery, NewDocument, NewRejection,
    Page, PurgeBatch, PurgeCutoffs, Readiness, RejectionFilter, RejectionRecord, RequestRecord,
    RetryOutcome, SkipOutcome, StatusCounts, Store, StoreError, StoreResult, SubmitOutcome,
    SubscriptionClaim, SubscriptionInfo,
};
use crate::config::redact_credentials;
use crate::subscriptions::Subscription;
pub use migrations::MIGRATIONS;
use session::{Db, Manager};

/// The database's clock in unix milliseconds, for every comparison that decides whether a
/// lease has run out or an event is due: nodes with skewed clocks then agree. `clock_timestamp`
/// rather than `now()` (the transaction's start), so that a long transaction does not see
/// leases as younger than they are.
pub const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The channel a commit that queued work notifies (see [`listen`]).
pub const QUEUED_CHANNEL: &str = "webhook_inbox_queued";

/// How long a caller may wait for a pooled connection, as SQLite's `DEFAULT_WAIT`: well under
/// any provider's delivery timeout.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(2);

/// Options of [`PostgresStore::open`].
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub pool_size: u32,
    pub wait: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            pool_size: 16,
            wait: DEFAULT_WAIT,
        }
    }
}

pub struct PostgresStore {
    /// `Option` only so that `Drop` can close the connections off any async runtime.
    pool: Option<Pool<Manager>>,
    connect: session::Connect,
    /// Stops the LISTEN thread (if any) when the store goes.
    stopping: Arc<AtomicBool>,
    /// The live subscriptions' routes, read once from the table and after each change.
    routes: parking_lot::RwLock<Option<Arc<subscriptions::Routes>>>,
}

impl PostgresStore {
    /// Open a pool on `url` without connecting yet (a database that is down at this moment
    /// makes the first statement fail with `Unavailable`, not this call) and without migrating.
    pub fn open(url: &str, options: PostgresOptions) -> anyhow::Result<PostgresStore> {
        let connect = session::Connect::from_url(url, options.wait)
            .with_context(|| format!("the PostgreSQL URL {}", redact_credentials(url)))?;
        let manager = Manager::new(&connect);
        let pool = Pool::builder()
            .max_size(options.pool_size)
            .min_idle(Some(1))
            .connection_timeout(options.wait)
            // Checked out connections are tested (one empty query): after a server restart,
            // each stale connection is replaced there instead of failing one request.
            .test_on_check_out(true)
            .error_handler(Box::new(r2d2::NopErrorHandler))
            .build_unchecked(manager);
        Ok(PostgresStore {
            pool: Some(pool),
            connect,
            stopping: Arc::new(AtomicBool::new(false)),
            routes: parking_lot::RwLock::new(None),
        })
    }

    /// How far an in-process claim may fan events out (see `fan_out::fan_out_limit`).
    fn fan_out_limit(&self, lane: Lane) -> StoreResult<Option<i64>> {
        match lane {
            Lane::InProcess => self.tx(fan_out::fan_out_limit),
            Lane::CallOut => Ok(None),
        }
    }

    fn routes(&self) -> StoreResult<Arc<subscriptions::Routes>> {
        if let Some(routes) = self.routes.read().clone() {
            return Ok(routes);
        }
        let routes = Arc::new(self.tx(subscriptions::load)?);
        *self.routes.write() = Some(Arc::clone(&routes));
        Ok(routes)
    }

    /// Run `f` in one transaction on a pooled connection and commit.
    fn tx<T: Send>(&self, f: impl FnOnce(&mut Db<'_>) -> StoreResult<T> + Send) -> StoreResult<T> {
        off_async(|| {
            let pool = self
                .pool
                .as_ref()
                .expect("the pool lives as long as the store");
            let mut conn = pool
                .get()
                .map_err(|e| StoreError::Unavailable(format!("no database connection: {e}")))?;
            let mut db = conn.begin()?;
            let value = f(&mut db)?;
            db.commit()?;
            Ok(value)
        })
    }

    /// A consumer transaction that finishes a batch: run first without savepoints, and again
    /// with a savepoint per event only if the database refused an effect (see
    /// [`finish::finish_all`]).
    fn finishing<T: Send>(
        &self,
        f: impl Fn(&mut Db<'_>, bool) -> StoreResult<T> + Send + Sync,
    ) -> StoreResult<T> {
        match self.tx(|db| f(db, false)) {
            Err(e) if errors::refused_by_a_constraint(&e) => self.tx(|db| f(db, true)),
            other => other,
        }
    }
}

/// Run `f` where the blocking client may block. The `postgres` client drives its connection
/// with a runtime of its own, which Tokio refuses to start on a thread that already runs async
/// tasks: callers inside a runtime (the server's startup, tests) get a scoped thread; others
/// (the ingest writer, `spawn_blocking`) pay one thread start per transaction at most.
fn off_async<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Closing a client blocks on its connection: off any async runtime too.
        if let Some(pool) = self.pool.take() {
            off_async(move || drop(pool));
        }
    }
}

impl Store for PostgresStore {
    fn migrate(&self) -> StoreResult<Vec<u32>> {
        off_async(|| {
            let pool = self
                .pool
                .as_ref()
                .expect("the pool lives as long as the store");
            let mut conn = pool
                .get()
                .map_err(|e| StoreError::Unavailable(format!("no database connection: {e}")))?;
            migrations::apply(&mut conn)
        })
        .inspect(|_| *self.routes.write() = None)
    }

    fn ready(&self) -> StoreResult<Readiness> {
        self.tx(|db| {
            // A standby (or a primary that lost its disk) answers reads but refuses writes.
            let read_only: bool = db
                .query_one(
                    "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
                    &[],
                )?
                .try_get(0)?;
            Ok(if read_only {
                Readiness::NotWritable
            } else if !migrations::is_current(db)? {
                Readiness::NotMigrated
            } else {
                Readiness::Ready
            })
        })
    }

    fn on_queued(&self, wake: Arc<tokio::sync::Notify>) {
        listen::start(self.connect.clone(), wake, Arc::clone(&self.stopping));
    }

    fn insert_deliveries(&self, batch: &[NewDelivery]) -> StoreResult<Vec<InsertOutcome>> {
        let routes = self.routes()?;
        self.tx(|db| ingest::insert_all(db, batch, &routes))
    }

    fn event(&self, source: &str, event_id: &str) -> StoreResult<Option<EventDetail>> {
        let routes = self.routes()?;
        self.tx(|db| events::detail(db, &routes, source, event_id))
    }

    fn list_events(&self, filter: &EventFilter, page: Page) -> StoreResult<Vec<EventRecord>> {
        let routes = self.routes()?;
        self.tx(|db| events::list(db, &routes, filter, page))
    }

    fn status_counts(&self) -> StoreResult<StatusCounts> {
        self.tx(events::status_counts)
    }

    fn received_per_minute(&self, since: i64) -> StoreResult<Vec<(i64, i64)>> {
        self.tx(|db| events::received_per_minute(db, since))
    }

    fn export_events(&self, filter: &EventFilter, page: Page) -> StoreResult<Vec<ExportedEvent>> {
        let routes = self.routes()?;
        self.tx(|db| events::export(db, &routes, filter, page))
    }

    fn claim(
        &self,
        worker: &str,
        lane: Lane,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<Vec<Claimed>> {
        let routes = self.routes()?;
        let to = self.fan_out_limit(lane)?;
        self.tx(|db| {
            let whose = ClaimFor::Lane(lane);
            consume::claim(db, &routes, to, worker, whose, limit, lease_ms, now)
        })
    }

    fn finish(&self, items: &[Finish], now: i64) -> StoreResult<Vec<Finished>> {
        self.finishing(|db, isolate| finish::finish_all(db, items, now, isolate))
    }

    fn finish_and_claim(
        &self,
        items: &[Finish],
        worker: &str,
        lane: Lane,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<(Vec<Finished>, Vec<Claimed>)> {
        let routes = self.routes()?;
        let to = self.fan_out_limit(lane)?;
        self.finishing(|db, isolate| {
            let finished = finish::finish_all(db, items, now, isolate)?;
            let whose = ClaimFor::Lane(lane);
            let claimed = consume::claim(db, &routes, to, worker, whose, limit, lease_ms, now)?;
            Ok((finished, claimed))
        })
    }

    fn release(&self, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
        self.tx(|db| leases::release(db, claims, now))
    }

    fn sweep(&self, now: i64, decide: DecideExpiry<'_>) -> StoreResult<usize> {
        self.tx(|db| leases::sweep(db, now, decide))
    }

    fn retry(
        &self,
        source: &str,
        event_id: &str,
        subscription: Option<&str>,
        force: bool,
        now: i64,
    ) -> StoreResult<RetryOutcome> {
        let routes = self.routes()?;
        let sub = match subscription {
            Some(name) => match routes.named(name) {
                Some(live) => Some(live.id),
                None => return Ok(RetryOutcome::NotFound),
            },
            None => None,
        };
        self.tx(|db| events::retry(db, &routes, source, event_id, sub, force, now))
    }

    fn sync_subscriptions(&self, subs: &[Subscription], now: i64) -> StoreResult<Vec<i64>> {
        let ids = self.tx(|db| subscriptions::sync(db, subs, now))?;
        *self.routes.write() = None;
        Ok(ids)
    }

    fn subscription_ids(&self) -> StoreResult<Vec<(i64, String)>> {
        Ok(self
            .routes()?
            .live
            .iter()
            .map(|s| (s.id, s.name.clone()))
            .collect())
    }

    fn subscriptions(&self, completed: bool) -> StoreResult<Vec<SubscriptionInfo>> {
        self.tx(|db| subscriptions::list(db, completed))
    }

    fn claim_subscription(
        &self,
        worker: &str,
        sub: i64,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<SubscriptionClaim> {
        let routes = self.routes()?;
        let to = self.fan_out_limit(Lane::InProcess)?;
        self.tx(|db| breaker::claim(db, &routes, to, worker, sub, limit, lease_ms, now))
    }

    fn open_breaker(
        &self,
        sub: i64,
        after_probe: bool,
        first_ms: i64,
        max_ms: i64,
        now: i64,
    ) -> StoreResult<()> {
        self.tx(|db| breaker::open(db, sub, after_probe, first_ms, max_ms, now))
    }

    fn close_breaker(&self, sub: i64) -> StoreResult<()> {
        self.tx(|db| breaker::close(db, sub))
    }

    fn extend_claims(
        &self,
        claims: &[ClaimRef],
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<Vec<Option<i64>>> {
        self.tx(|db| leases::extend(db, claims, lease_ms, now))
    }

    fn set_paused(&self, name: &str, paused: bool) -> StoreResult<bool> {
        self.tx(|db| subscriptions::set_paused(db, name, paused))
    }

    fn backfill(&self, name: &str, since: i64, now: i64) -> StoreResult<Option<usize>> {
        let routes = self.routes()?;
        let Some(sub) = routes.named(name) else {
            return Ok(None);
        };
        self.tx(|db| subscriptions::backfill(db, sub, since, now))
            .map(Some)
    }

    fn retry_failed(&self, filter: &EventFilter, now: i64) -> StoreResult<usize> {
        let routes = self.routes()?;
        self.tx(|db| events::retry_failed(db, &routes, filter, now))
    }

    fn skip(&self, source: &str, event_id: &str, sub: &str, _now: i64) -> StoreResult<SkipOutcome> {
        let routes = self.routes()?;
        self.tx(|db| ordering::skip(db, &routes, source, event_id, sub))
    }

    fn held_keys(&self, subscription: &str, limit: usize) -> StoreResult<Vec<HeldKey>> {
        let routes = self.routes()?;
        self.tx(|db| ordering::held_keys(db, &routes, subscription, limit))
    }

    fn loyalty(&self, customer_id: &str, page: Page) -> StoreResult<LoyaltyAccount> {
        self.tx(|db| consume::loyalty(db, customer_id, page))
    }

    fn purge_batch(
        &self,
        cutoffs: &PurgeCutoffs,
        after: i64,
        limit: usize,
        now: i64,
    ) -> StoreResult<PurgeBatch> {
        let (seqs, next_after) = self.tx(|db| purge::candidates(db, cutoffs, after, limit))?;
        let purged = if seqs.is_empty() {
            0
        } else {
            self.tx(|db| purge::purge(db, cutoffs, &seqs, now))?
        };
        Ok(PurgeBatch { purged, next_after })
    }

    fn lifecycle_counts(&self) -> StoreResult<LifecycleCounts> {
        self.tx(purge::counts)
    }

    fn create_request(&self, id: &str, now: i64) -> StoreResult<RequestRecord> {
        self.tx(|db| requests::create(db, id, now))
    }

    fn request(&self, id: &str) -> StoreResult<Option<RequestRecord>> {
        self.tx(|db| requests::get(db, id))
    }

    fn add_document(
        &self,
        request_id: &str,
        doc: &NewDocument,
        now: i64,
    ) -> StoreResult<AddDocument> {
        self.tx(|db| requests::add_document(db, request_id, doc, now))
    }

    fn submit_request(&self, id: &str, now: i64) -> StoreResult<SubmitOutcome> {
        let routes = self.routes()?;
        self.tx(|db| requests::submit(db, &routes, id, now))
    }

    fn request_documents(&self, id: &str) -> StoreResult<Vec<DocumentContent>> {
        self.tx(|db| requests::documents(db, id))
    }

    fn record_rejections(&self, batch: &[NewRejection], keep: u64, since: i64) -> StoreResult<()> {
        self.tx(|db| rejections::record(db, batch, keep, since))
    }

    fn rejections(
        &self,
        filter: &RejectionFilter,
        page: Page,
    ) -> StoreResult<Vec<RejectionRecord>> {
        self.tx(|db| rejections::list(db, filter, page))
    }

    fn copy_out(&self, table: &Table, after: &[Cell], limit: usize) -> StoreResult<Vec<Row>> {
        self.tx(|db| copy::rows(db, table, after, limit))
    }

    fn copy_count(&self, table: &Table) -> StoreResult<u64> {
        self.tx(|db| copy::count(db, table))
    }

    fn copy_in(&self, table: &Table, rows: &[Row]) -> StoreResult<u64> {
        self.tx(|db| copy::insert(db, table, rows))
    }

    fn copy_finished(&self) -> StoreResult<()> {
        self.tx(copy::finished)
    }

    fn mark_copy(&self, started_at: Option<i64>) -> StoreResult<()> {
        self.tx(|db| copy::mark(db, started_at))
    }

    fn unfinished_copy(&self) -> StoreResult<Option<i64>> {
        self.tx(copy::unfinished)
    }

    /// An advisory lock on a connection of its own, outside the pool (see `hold`).
    fn hold(&self, holder: Holder) -> StoreResult<Option<Hold>> {
        off_async(|| hold::take(&self.connect, holder))
    }
}
