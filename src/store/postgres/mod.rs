//! The PostgreSQL store, for several receiver nodes sharing one queue (SPEC section 8).
//!
//! The [`Store`](crate::store::Store) trait is synchronous, and r2d2 is already the pool: so the `postgres` client
//! (blocking) through `r2d2_postgres`. Each pooled connection keeps its own prepared statements
//! ([`session::Conn`]), so that a statement costs one round trip instead of two.
//!
//! Nothing here depends on a node's clock or a node-local lock for correctness: leases and due
//! times are compared with the database's clock ([`NOW_MS`]), claims take rows with
//! `FOR UPDATE SKIP LOCKED` in one statement, and every later transition is fenced by the claim
//! token, as on SQLite. Times that only record what happened (received, completed, attempt
//! start and end) are the caller's, as on SQLite.
//!
//! Every method is one transaction on one pooled connection (an in-process claim reads how
//! far it may fan out first, in a statement of its own on the same connection); a commit is
//! durable (`synchronous_commit = on`, set in the connection options) before the method
//! returns, but for the in-process lane's claims, whose effects commit in the same
//! transactions (see [`consume::commit_unflushed`]).

mod alerts;
mod breaker;
mod consume;
mod copy;
mod dialect;
mod errors;
mod events;
mod fan_out;
mod fence;
mod finish;
mod hold;
mod ingest;
mod leases;
mod listen;
mod loyalty;
mod migrations;
mod operations;
mod purge;
mod routes;
mod session;
mod subscriptions;
mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use r2d2::Pool;

use super::{StoreError, StoreResult};
use crate::domain::redact_credentials;
pub use migrations::MIGRATIONS;
use session::{Conn, Db, Manager};

/// The database's clock in unix milliseconds, for every comparison that decides whether a
/// lease has run out or an event is due: nodes with skewed clocks then agree. `clock_timestamp`
/// rather than `now()` (the transaction's start), so that a long transaction does not see
/// leases as younger than they are.
pub const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The statements that run for every batch or every scrape, as a node on `url` writes them,
/// by name: the fan-out of the in-process subscriptions, a batch's completions, the counts of
/// `/metrics` and the fan-out's backlog. For `tests/api/plans.rs`, which checks their plans.
pub fn statements_for_plans(url: &str) -> anyhow::Result<Vec<(&'static str, String)>> {
    let connect = session::Connect::from_url(url, DEFAULT_WAIT)?;
    let mut conn = session::Conn::new(connect.connect()?);
    let mut db = conn.begin()?;
    let routes = subscriptions::load(&mut db)?;
    Ok(vec![
        (
            "fan-out",
            fan_out::fan_out_sql(&routes, consume::IN_PROCESS_CLAIMS_NOW),
        ),
        ("complete", finish::complete_sql()),
        ("status counts", events::STATUS_COUNTS.to_string()),
        ("waiting", events::WAITING.to_string()),
    ])
}

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
    /// The live subscriptions' routes, read again whenever the registry's version moved.
    routes: subscriptions::RouteCache,
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
            routes: subscriptions::RouteCache::default(),
        })
    }

    /// The routes as the registry holds them now (a read of its version, and of the routes
    /// when it moved): for ops and writes whose view may be a moment old. Claims check theirs
    /// in their own transaction (`consume::claim`).
    fn routes(&self) -> StoreResult<Arc<subscriptions::Routes>> {
        self.tx(|db| self.routes.current(db))
    }

    /// Removed means finished (see `subscriptions::finish_removed`): after the removal's
    /// commit, one transaction per subscription.
    fn finish_removed(&self, removed: &[i64], now: i64) -> StoreResult<()> {
        for &id in removed {
            let finished = self.tx(|db| subscriptions::finish_removed(db, id, now))?;
            tracing::info!(
                subscription = id,
                finished,
                "a removed subscription's work finished"
            );
        }
        Ok(())
    }

    /// See `Store::prune_subscriptions`: each removal commits, then its states are finished
    /// (see [`Self::finish_removed`]).
    fn prune(&self, now: i64, sessions_idle_before: i64) -> StoreResult<usize> {
        let removed = self.tx(|db| subscriptions::prune(db, now))?;
        self.finish_removed(&removed, now)?;
        // Idle sessions, each removed as a `DELETE` removes it (a node that dies in between
        // leaves its states to the pass below, at the next beat).
        let idle = self.tx(|db| super::sql::registry::idle_sessions(db, sessions_idle_before))?;
        let mut sessions = 0;
        for name in &idle {
            if super::Store::remove_subscription(self, name, true, now)?.is_some() {
                sessions += 1;
            }
        }
        // What a node that died between a removal's commit and its finishing left pending.
        let left = self.tx(|db| super::sql::registry::left_unfinished(db))?;
        self.finish_removed(&left, now)?;
        self.tx(|db| super::sql::secrets::drop_expired(db, now))?;
        Ok(removed.len() + sessions)
    }

    /// Run `f` with a pooled connection.
    fn conn<T: Send>(&self, f: impl FnOnce(&mut Conn) -> StoreResult<T> + Send) -> StoreResult<T> {
        off_async(|| {
            let pool = self
                .pool
                .as_ref()
                .expect("the pool lives as long as the store");
            let mut conn = pool
                .get()
                .map_err(|e| StoreError::unavailable_because("no database connection", e))?;
            f(&mut conn)
        })
    }

    /// Run `f` in one transaction on a pooled connection and commit.
    fn tx<T: Send>(&self, f: impl FnOnce(&mut Db<'_>) -> StoreResult<T> + Send) -> StoreResult<T> {
        self.conn(|conn| in_tx(conn, f))
    }

    /// A consumer's transaction, on one pooled connection: for a claim that may fan events out
    /// (`fans_out`), first how far it may (see `fan_out::fan_out_limit`: a statement of its
    /// own, before the transaction), handed to `f`. A transaction that finishes a batch runs
    /// first without savepoints, and again with a savepoint per event only if the database
    /// refused an effect (see [`finish::finish_all`]): `f`'s last argument.
    fn consuming<T: Send>(
        &self,
        fans_out: bool,
        f: impl Fn(&mut Db<'_>, Option<i64>, bool) -> StoreResult<T> + Send + Sync,
    ) -> StoreResult<T> {
        self.conn(|conn| {
            let to = match fans_out {
                true => fan_out::fan_out_limit(conn)?,
                false => None,
            };
            match in_tx(conn, |db| f(db, to, false)) {
                Err(e) if errors::refused_by_a_constraint(&e) => in_tx(conn, |db| f(db, to, true)),
                other => other,
            }
        })
    }
}

/// Run `f` in one transaction on `conn` and commit.
fn in_tx<T>(conn: &mut Conn, f: impl FnOnce(&mut Db<'_>) -> StoreResult<T>) -> StoreResult<T> {
    let mut db = conn.begin()?;
    let value = f(&mut db)?;
    db.commit()?;
    Ok(value)
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
