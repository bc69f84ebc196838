//! The embedded default store: SQLite through rusqlite (bundled) and an r2d2 pool.
//!
//! Durability settings live in the connection init so that no connection can miss them: WAL,
//! `synchronous = FULL` (any connection may run a checkpoint, which syncs by its own setting),
//! `foreign_keys`, and a busy timeout that bounds every wait for the write lock. The one write
//! connection then commits with `synchronous = NORMAL` and makes its commits durable with a
//! shared fsync outside the write lock (`durable`): a 2xx is only sent after a commit that
//! survives power loss. Every write transaction is `BEGIN IMMEDIATE`: a deferred one that reads
//! then writes can fail with `SQLITE_BUSY_SNAPSHOT`, which the busy timeout does not retry.

pub mod backup;
mod checkpoint;
mod consume;
mod copy;
mod customers;
mod durable;
mod events;
mod finish;
mod ingest;
mod migrations;
mod operations;
mod purge;
mod requests;
mod rows;
mod stats;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::FairMutex;
use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use super::{StoreError, StoreResult};
use checkpoint::Checkpointer;

pub use consume::{claim_sql, first_attempts_sql};
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
    /// It commits with `synchronous = NORMAL`, and `sync` makes commits durable with a shared
    /// fsync outside the lock (see `durable`).
    writer: Arc<FairMutex<Connection>>,
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
    opened: Instant,
    wait: Duration,
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
    // Takes effect on a new, empty database only (see `purge::give_back_free_pages`).
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")?;
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
            sync,
            consumer_turn: FairMutex::new(()),
            others_waiting: AtomicUsize::new(0),
            last_other_write: AtomicU64::new(0),
            opened: Instant::now(),
            wait,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> StoreResult<PooledConnection<SqliteConnectionManager>> {
        self.pool
            .get()
            .map_err(|e| StoreError::Unavailable(format!("no database connection: {e}")))
    }

    /// Run `f` in a `BEGIN IMMEDIATE` transaction, commit, and wait until the commit is durable
    /// (ingest and ops writes). Other writers go on while this one waits for the disk.
    fn write<T>(&self, f: impl FnOnce(&mut Transaction<'_>) -> StoreResult<T>) -> StoreResult<T> {
        self.others_waiting.fetch_add(1, Ordering::SeqCst);
        let conn = self.lock_writer();
        self.others_waiting.fetch_sub(1, Ordering::SeqCst);
        let (value, ticket) = self.commit(conn?, f)?;
        self.last_other_write.store(self.tick(), Ordering::SeqCst);
        self.sync.wait(ticket)?;
        // Ingest is active until its commit is durable: the window runs from the end of the
        // fsync too, however long that took.
        self.last_other_write.store(self.tick(), Ordering::SeqCst);
        Ok(value)
    }

    /// Commit `f`'s transaction and take its ticket, then release the write lock (the fsync
    /// happens outside it). A poisoned store writes nothing: it could not promise durability.
    fn commit<T>(
        &self,
        mut conn: parking_lot::FairMutexGuard<'_, Connection>,
        f: impl FnOnce(&mut Transaction<'_>) -> StoreResult<T>,
    ) -> StoreResult<(T, Ticket)> {
        self.sync.check()?;
        let mut tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let value = f(&mut tx)?;
        tx.commit()?;
        self.checkpoint_if_due(&conn);
        Ok((value, self.sync.committed()))
    }

    /// After a commit on the writer connection, with the write lock held: a checkpoint every
    /// 1,000 new WAL frames, inline while ingest or ops writes are running, else on the
    /// checkpoint thread (see `checkpoint`); inline too once the WAL has grown past twice its
    /// restart point, or if the thread is gone.
    fn checkpoint_if_due(&self, conn: &Connection) {
        let inline = match self.checkpointer.committed() {
            checkpoint::Due::No => return,
            checkpoint::Due::Inline => true,
            checkpoint::Due::Yes => {
                self.recent_other_write()
                    || self.others_waiting.load(Ordering::SeqCst) > 0
                    || !self.checkpointer.kick()
            }
        };
        if inline {
            checkpoint::inline(conn);
        }
    }

    /// A consumer transaction that finishes a batch (see [`finish::finish_all`]): run first
    /// without savepoints, and again with a savepoint per event only if the database refused
    /// an effect, the first attempt rolled back.
    fn finishing<T>(
        &self,
        f: impl Fn(&mut Transaction<'_>, bool) -> StoreResult<T>,
    ) -> StoreResult<T> {
        match self.consumer_write(|tx| f(tx, false)) {
            Err(e) if finish::refused_by_a_constraint(&e) => self.consumer_write(|tx| f(tx, true)),
            other => other,
        }
    }

    /// `write` for the consumer side, one consumer transaction in the writer's queue at a time.
    fn consumer_write<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let _turn = self.consumer_turn.try_lock_for(self.wait).ok_or_else(|| {
            StoreError::Unavailable("timed out waiting for a consumer turn".into())
        })?;
        let conn = self.lock_writer()?;
        let (value, ticket) = self.commit(conn, f)?;
        // The next consumer may take its turn while this one waits for the disk.
        drop(_turn);
        self.sync.wait(ticket)?;
        Ok(value)
    }

    /// How many events a consumer may claim now: an eighth of its batch while other writes
    /// wait for the writer or have just committed (decided once the consumer holds it). A
    /// batch's completion holds the write lock in proportion to its size, and a delivery waits
    /// for that lock: with 500,000 events, `batch_size` 256 drained 1.21 times as fast as 128,
    /// while ingest beside a drain had a p99 of 20 to 211 ms with a quarter of 256 against 13
    /// to 15 ms with a quarter of 128, that is 32 (docs/performance.md, fifth round).
    fn claim_limit(&self, limit: usize) -> usize {
        if self.recent_other_write() || self.others_waiting.load(Ordering::SeqCst) > 0 {
            limit.div_ceil(8)
        } else {
            limit
        }
    }

    /// The write lock, waited for at most `wait`.
    fn lock_writer(&self) -> StoreResult<parking_lot::FairMutexGuard<'_, Connection>> {
        self.writer.try_lock_for(self.wait).ok_or_else(|| {
            StoreError::Unavailable("timed out waiting for the database write lock".into())
        })
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
                StoreError::Unavailable(format!("database busy: {e}"))
            }
            // A full disk, a file that became read-only or a failed write (a filesystem the
            // kernel turned read-only answers EIO/EROFS) is the machine's state, not a bug: the
            // transaction did not commit, and the same request may succeed once that is fixed.
            Some(ErrorCode::DiskFull | ErrorCode::ReadOnly | ErrorCode::SystemIoFailure) => {
                StoreError::Unavailable(format!("database not writable: {e}"))
            }
            _ => StoreError::Internal(anyhow::Error::new(e)),
        }
    }
}
