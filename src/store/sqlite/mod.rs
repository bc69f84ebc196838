//! The embedded default store: SQLite through rusqlite (bundled) and an r2d2 pool.
//!
//! Durability settings live in the connection init so that no connection can miss them: WAL,
//! `synchronous = FULL` (any connection may run a checkpoint, which syncs by its own setting),
//! `foreign_keys`, and a busy timeout that bounds every wait for the write lock. The one write
//! connection makes each commit durable in one of two ways ([`Durability`]): ingest and ops
//! writes commit at `synchronous = FULL`, so SQLite fsyncs the WAL inside `COMMIT` as the
//! reference group commit does; consumer transactions commit at `synchronous = NORMAL` and wait
//! for a shared fsync outside the write lock (`durable`), so that the next transaction runs
//! while the disk works. Either way a 2xx is only sent after a commit that survives power loss.
//! Every write transaction is `BEGIN IMMEDIATE`: a deferred one that reads then writes can fail
//! with `SQLITE_BUSY_SNAPSHOT`, which the busy timeout does not retry.

mod alerts;
pub mod backup;
mod breaker;
mod checkpoint;
mod claimed_events;
mod consume;
mod consumer_turns;
mod copy;
mod customers;
mod dialect;
mod durable;
mod events;
mod fan_out;
mod finish;
mod ingest;
mod leases;
mod migrations;
mod operations;
mod ordering;
mod purge;
mod registry;
mod secrets;
mod subscriptions;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::FairMutex;
use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use super::{StoreError, StoreResult};
use checkpoint::Checkpointer;

pub use consume::claim_sql;
pub use fan_out::{IN_PROCESS_CLAIMS_NOW, fan_out_sql};

/// The fan-out statement for the subscriptions a database holds now (for the query-plan
/// tests): [`fan_out_sql`] over their routes.
pub fn fan_out_statement(conn: &Connection) -> anyhow::Result<String> {
    use anyhow::Context;
    let routes = subscriptions::load(conn)?;
    fan_out_sql(&routes.live, IN_PROCESS_CLAIMS_NOW).context("no live subscription")
}
use durable::{Ticket, WalSync};
pub use events::STATUS_COUNTS;
pub use migrations::MIGRATIONS;

/// Set to `1`, the store skips the fdatasync that makes commits durable: for the power-loss
/// test only (docs/power-loss.md), never for users. Not a setting, so not in the config.
pub const UNSAFE_SKIP_WAL_FSYNC: &str = "WEBHOOK_INBOX_UNSAFE_SKIP_WAL_FSYNC";

/// How long a caller may wait for a pooled connection or the write lock before the request is
/// answered 503: well under any provider's delivery timeout.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(2);

pub struct SqliteStore {
    /// Checkpoints the WAL outside the write lock (see `checkpoint`). First, so that it stops
    /// before the connections close.
    checkpointer: Checkpointer,
    pool: Pool<SqliteConnectionManager>,
    path: PathBuf,
    /// The one connection every write transaction of this process runs on, taken in turn.
    /// One connection keeps its page cache and prepared statements warm: in WAL mode a
    /// connection drops its whole cache whenever another connection has written, so writers on
    /// pooled connections would re-read their pages at every transaction. The lock is fair:
    /// SQLite's busy handler polls with sleeps, so a thread that commits and begins again at
    /// once would win over and over, and one busy consumer could starve ingest. The busy
    /// timeout still bounds waits on other processes.
    /// How each commit on it is made durable: see [`Durability`] and `durable`.
    writer: Arc<FairMutex<Connection>>,
    /// Whether the writer connection is at `synchronous = FULL` now (only read and changed with
    /// the write lock held): see [`Durability`].
    writer_full: AtomicBool,
    sync: WalSync,
    /// Consumer transactions queue here first, so that at most one of them waits for the
    /// writer at a time: ingest then waits behind one consumer transaction, not one per worker,
    /// and keeps most of its speed while the consumers drain a backlog.
    consumer_turn: FairMutex<()>,
    /// Ingest and ops writes waiting for the writer right now. While any wait, consumers claim
    /// smaller batches, so that their transactions stay short and ingest keeps its pace.
    others_waiting: AtomicUsize,
    /// When an ingest or ops write last committed, in ms since `opened` plus one (0: never).
    /// While such writes keep coming, consumers also claim smaller batches: the write lock is
    /// free during each ingest fsync, and a full consumer batch taken then would hold up the
    /// next ingest batch.
    last_other_write: AtomicU64,
    /// When a consumer transaction last committed, on the same clock: ingest shares the
    /// consumers' fsync while they run (see [`SqliteStore::write`]).
    last_consumer_write: AtomicU64,
    opened: Instant,
    wait: Duration,
    /// The live subscriptions' routes, loaded at `migrate` and after each change.
    routes: parking_lot::RwLock<Option<Arc<subscriptions::Routes>>>,
    /// What the fan-outs left out of filtered subscriptions, kept across route reloads.
    left_out: Arc<crate::store::filters::LeftOut>,
    /// Commits that wrote nothing, for the slow-disk test.
    #[cfg(test)]
    no_frame_commits: AtomicU64,
}

/// How a commit on the writer connection is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// `synchronous = NORMAL`, then the shared fsync of `durable`, made after the write lock is
    /// released: consumer transactions, so that the next one runs while this one's fsync does.
    Shared,
    /// `synchronous = FULL`: SQLite fsyncs the WAL inside `COMMIT`, the write lock held, and
    /// that fsync also covers every commit before it. Ingest and ops writes while no consumer
    /// runs, as the reference group commit does it: ingest alone measured 1.16 times as fast as
    /// with the shared flush. Beside a drain it is slower (ingest there fell to 0.70 of ingest
    /// alone, against 0.88 sharing): it holds the lock through the fsync, and its fsyncs do not
    /// combine with the consumers' (docs/performance.md, eleventh round).
    InCommit,
}

/// How long after an ingest or ops write consumers keep their transactions short.
const RECENT_WRITE: Duration = Duration::from_millis(20);

/// Options of [`SqliteStore::open`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    pub pool_size: u32,
    pub wait: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            pool_size: 16,
            wait: DEFAULT_WAIT,
        }
    }
}

fn init_connection(conn: &mut Connection, wait: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(wait)?;
    // Room for every statement the store prepares (rusqlite keeps 16 by default): the writer
    // runs ingest (14 multi-row inserts among them), claim, finish, sweep and ops statements
    // in turn, and an evicted statement is parsed and planned again on its next use.
    conn.set_prepared_statement_cache_capacity(96);
    // Takes effect on a new, empty database only (see `purge::give_back_free_pages`). Asked
    // first: setting it on a database that has it already writes page 1 (a commit and an
    // fsync, the write lock taken) on every new pooled connection.
    let auto_vacuum: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    if auto_vacuum != 2 {
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")?;
    }
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    // A larger page cache keeps the indexes' hot pages in memory under write load, and memory
    // mapping saves a copy per page read (measured: about 10% faster draining).
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA cache_size = -16384;
         PRAGMA mmap_size = 268435456;",
    )
}

impl SqliteStore {
    /// Open (creating the file and its directory if needed) without migrating.
    pub fn open(path: &Path, options: SqliteOptions) -> anyhow::Result<SqliteStore> {
        use anyhow::Context;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating database directory {}", dir.display()))?;
        }
        let wait = options.wait;
        // Switch the file to WAL once, on one connection, before the pool opens several at
        // once: concurrent mode switches on a new file fail with "database is locked".
        let mut first = Connection::open(path)
            .with_context(|| format!("opening SQLite database {}", path.display()))?;
        // A first read makes SQLite create the WAL file, which `WalSync` opens at once.
        init_connection(&mut first, wait)
            .and_then(|()| first.execute_batch("PRAGMA synchronous = NORMAL"))
            .and_then(|()| first.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(())))
            .with_context(|| format!("configuring SQLite database {}", path.display()))?;
        checkpoint::install(&first);
        let mut own = Connection::open(path)
            .with_context(|| format!("opening SQLite database {}", path.display()))?;
        init_connection(&mut own, wait)
            .with_context(|| format!("configuring SQLite database {}", path.display()))?;
        let writer = Arc::new(FairMutex::new(first));
        let checkpointer = Checkpointer::start(own, Arc::clone(&writer), wait)
            .context("starting the WAL checkpoint thread")?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let mut sync = WalSync::new(wal.into());
        if std::env::var_os(UNSAFE_SKIP_WAL_FSYNC).is_some_and(|v| v == "1") {
            tracing::warn!(
                "{UNSAFE_SKIP_WAL_FSYNC}=1: commits are NOT made durable; a power cut loses \
                 acknowledged deliveries. This switch exists for the power-loss test only."
            );
            sync = sync.without_fsync();
        }
        let manager =
            SqliteConnectionManager::file(path).with_init(move |c| init_connection(c, wait));
        let pool = Pool::builder()
            .max_size(options.pool_size)
            .min_idle(Some(2))
            .connection_timeout(wait)
            .build(manager)
            .with_context(|| format!("opening SQLite database {}", path.display()))?;
        Ok(SqliteStore {
            checkpointer,
            pool,
            path: path.to_path_buf(),
            writer,
            writer_full: AtomicBool::new(false),
            sync,
            consumer_turn: FairMutex::new(()),
            others_waiting: AtomicUsize::new(0),
            last_other_write: AtomicU64::new(0),
            last_consumer_write: AtomicU64::new(0),
            opened: Instant::now(),
            wait,
            routes: parking_lot::RwLock::new(None),
            left_out: Arc::default(),
            #[cfg(test)]
            no_frame_commits: AtomicU64::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The live subscriptions' routes as the registry holds them now: the cached ones while
    /// the registry's version is theirs, else read again (and kept). Read in the caller's
    /// transaction, so that a claim fans out by the registry it sees (a point read).
    fn routes_in(&self, conn: &Connection) -> StoreResult<Arc<subscriptions::Routes>> {
        let version = subscriptions::registry_version(conn)?;
        let kept = self.routes.read().clone();
        if let Some(routes) = kept
            && routes.version == version
        {
            return Ok(routes);
        }
        let routes = Arc::new(subscriptions::Routes {
            left_out: Arc::clone(&self.left_out),
            ..subscriptions::load(conn)?
        });
        *self.routes.write() = Some(Arc::clone(&routes));
        Ok(routes)
    }

    /// [`Self::routes_in`] on a connection of its own (for reads, and writes whose view of
    /// the registry may be a moment old).
    fn routes(&self) -> StoreResult<Arc<subscriptions::Routes>> {
        self.read(|c| self.routes_in(c))
    }

    fn routes_seen(&self) -> Option<i64> {
        self.routes.read().as_ref().map(|r| r.version)
    }

    /// Forget the routes: the next use reads them again.
    fn routes_changed(&self) {
        *self.routes.write() = None;
    }

    /// A write of the registry: the routes kept are read again after it.
    fn registry_write<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let done = self.write(f);
        self.routes_changed();
        done
    }

    fn conn(&self) -> StoreResult<PooledConnection<SqliteConnectionManager>> {
        self.pool
            .get()
            .map_err(|e| StoreError::unavailable_because("no database connection", e))
    }

    /// Run `f` in a `BEGIN IMMEDIATE` transaction, commit, and return once the commit is durable
    /// (ingest and ops writes). While no consumer transaction runs or has just run, SQLite syncs
    /// the WAL inside `COMMIT` ([`Durability::InCommit`]); beside consumers, the commit shares
    /// their fsync outside the write lock ([`Durability::Shared`]), so that a consumer
    /// transaction runs while this one waits for the disk.
    fn write<T>(&self, f: impl FnOnce(&mut Transaction<'_>) -> StoreResult<T>) -> StoreResult<T> {
        self.others_waiting.fetch_add(1, Ordering::SeqCst);
        let conn = self.lock_writer();
        self.others_waiting.fetch_sub(1, Ordering::SeqCst);
        let durability = if self.consumers_active() {
            Durability::Shared
        } else {
            Durability::InCommit
        };
        let (value, ticket) = self.commit(conn?, durability, f)?;
        self.last_other_write.store(self.tick(), Ordering::SeqCst);
        // At once if SQLite synced it (unless the power-loss test skips fsyncs: then this is
        // the shared flush, which skips it too).
        self.sync.wait(ticket)?;
        // Ingest is active until its commit is durable: the window runs from the end of the
        // fsync too, however long that took.
        self.last_other_write.store(self.tick(), Ordering::SeqCst);
        Ok(value)
    }

    /// Whether a consumer transaction holds or waits for its turn, or committed within
    /// [`RECENT_WRITE`].
    fn consumers_active(&self) -> bool {
        let last = self.last_consumer_write.load(Ordering::SeqCst);
        self.consumer_turn.is_locked()
            || (last > 0 && self.tick().saturating_sub(last) < RECENT_WRITE.as_millis() as u64)
    }

    /// Commit `f`'s transaction and take its ticket, then release the write lock. A poisoned
    /// store writes nothing: it could not promise durability.
    fn commit<T>(
        &self,
        mut conn: parking_lot::FairMutexGuard<'_, Connection>,
        durability: Durability,
        f: impl FnOnce(&mut Transaction<'_>) -> StoreResult<T>,
    ) -> StoreResult<(T, Ticket)> {
        self.sync.check()?;
        let in_commit = durability == Durability::InCommit && !self.sync.skips_fsync();
        if self.writer_full.load(Ordering::Relaxed) != in_commit {
            conn.execute_batch(if in_commit {
                "PRAGMA synchronous = FULL"
            } else {
                "PRAGMA synchronous = NORMAL"
            })?;
            self.writer_full.store(in_commit, Ordering::Relaxed);
        }
        // Whatever an earlier commit on this thread left unread is not this commit's.
        checkpoint::take_frames();
        let changes_before = conn.total_changes();
        let mut tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let value = f(&mut tx)?;
        if let Err(e) = tx.commit() {
            // The fsync inside COMMIT may have failed: as with a failed shared flush, what it
            // covered may be lost whatever a later fsync says.
            if in_commit && e.sqlite_error_code() == Some(ErrorCode::SystemIoFailure) {
                self.sync
                    .poison(format!("committing {}: {e}", self.path.display()));
            }
            return Err(e.into());
        }
        let frames = checkpoint::take_frames();
        // Two witnesses that this commit wrote: the WAL hook (frames appended, and at FULL
        // synced) and the row changes. Each alone could be misled by a statement outside
        // `commit` that left SQLite's WAL callback pending; together they decide only in the
        // safe direction.
        let changed = conn.total_changes() != changes_before;
        self.checkpoint_if_due(&conn, frames);
        #[cfg(test)]
        if frames.is_none() && !changed {
            self.no_frame_commits.fetch_add(1, Ordering::SeqCst);
        }
        if frames.is_none() && !changed {
            // A transaction that changed nothing wrote no frame, so SQLite synced nothing even
            // at FULL: it proves nothing durable. What it answers rests on earlier commits, so
            // it waits for those (at once if they are durable already).
            return Ok((value, self.sync.last()));
        }
        let ticket = self.sync.committed();
        if in_commit && frames.is_some() && changed {
            // The fsync inside this COMMIT began after its frames and every earlier commit's
            // were written.
            self.sync.synced_by_commit(ticket)?;
        }
        Ok((value, ticket))
    }

    /// After a commit on the writer connection, with the write lock held: a checkpoint every
    /// 1,000 new WAL frames on the checkpoint thread, outside the write lock (see
    /// `checkpoint`); inline only once the WAL has grown past twice its restart point, or if
    /// the thread is gone.
    fn checkpoint_if_due(&self, conn: &Connection, frames: Option<std::ffi::c_int>) {
        let inline = match self.checkpointer.committed(frames) {
            checkpoint::Due::No => return,
            checkpoint::Due::Inline => true,
            checkpoint::Due::Yes => !self.checkpointer.kick(),
        };
        if inline {
            checkpoint::inline(conn);
        }
    }

    /// The write lock, waited for at most `wait`.
    fn lock_writer(&self) -> StoreResult<parking_lot::FairMutexGuard<'_, Connection>> {
        self.writer
            .try_lock_for(self.wait)
            .ok_or_else(|| StoreError::unavailable("timed out waiting for the database write lock"))
    }

    /// Milliseconds since the store opened, plus one: 0 in `last_other_write` means never.
    fn tick(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64 + 1
    }

    fn recent_other_write(&self) -> bool {
        let last = self.last_other_write.load(Ordering::SeqCst);
        last > 0 && self.tick().saturating_sub(last) < RECENT_WRITE.as_millis() as u64
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
        let conn = self.conn()?;
        f(&conn)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                StoreError::unavailable_because("database busy", e)
            }
            // A full disk, a file that became read-only or a failed write (a filesystem the
            // kernel turned read-only answers EIO/EROFS) is the machine's state, not a bug: the
            // transaction did not commit, and the same request may succeed once that is fixed.
            Some(ErrorCode::DiskFull | ErrorCode::ReadOnly | ErrorCode::SystemIoFailure) => {
                StoreError::unavailable_because("database not writable", e)
            }
            _ => StoreError::Internal(anyhow::Error::new(e)),
        }
    }
}

#[cfg(test)]
mod tests;
