//! WAL checkpoints on a thread of their own, outside the write lock.
//!
//! SQLite's automatic checkpoint runs inside the `COMMIT` that takes the WAL past 1,000 frames,
//! so on the writer connection it runs while this process's write lock is held: about 1,000
//! pages written into the database file and an fsync of it (3 to 7 ms on this machine's disk,
//! longer while the disk is busy), during which nothing commits and every delivery waits. The
//! writer connection here only records how many frames each commit left in the WAL
//! (`wal_hook`, which replaces the automatic checkpoint), and every 1,000 new frames it kicks
//! the checkpoint thread, which runs a passive checkpoint on its own connection while writers
//! go on: it copies every frame committed so far into the database file and fsyncs it. Once
//! the WAL holds 4,000 frames the thread runs a second passive checkpoint with the write lock
//! held, for the few frames appended meanwhile: that completes the checkpoint, and the next
//! write transaction starts the WAL again from its beginning. Without it a passive checkpoint
//! under steady writes never catches up with the last frames, and the WAL grows without bound
//! (measured, docs/performance.md); with it the WAL stays near 4,000 frames (16 MB of 4 KiB
//! pages). Should the thread fall behind (the lock did not come in time) or be gone, a due
//! checkpoint runs inline once the WAL holds 8,000 frames, or at once if the thread cannot be
//! reached.
//!
//! Measured (docs/performance.md, "The tail"): with the checkpoints of ingest inline, as
//! SQLite does it, the p99 of 64 providers was 17-20 ms against 7-8 ms on the thread, at the
//! same throughput (0.99); on a draining backlog the thread drained 1.27 to 1.33 times as fast.
//!
//! Durability does not change: a checkpoint syncs the WAL before it copies anything (in
//! `NORMAL` as in `FULL`), copies only committed frames, and fsyncs the database file before
//! the WAL may be reused; commits are still acknowledged only after their own fsync
//! (`durable`). Another process writing the same file keeps SQLite's automatic checkpoint.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::FairMutex;
use rusqlite::Connection;
use rusqlite::hooks::Wal;

/// New WAL frames after which a checkpoint starts: SQLite's own automatic threshold.
const CHECKPOINT_FRAMES: c_int = 1000;
/// WAL frames after which a checkpoint finishes under the write lock, so that the WAL restarts.
const RESTART_FRAMES: i64 = 4 * CHECKPOINT_FRAMES as i64;
/// WAL frames past which a due checkpoint runs inline whatever the load: the thread has not
/// managed to restart the WAL (it could not get the write lock in time, or it is gone).
const BACKSTOP_FRAMES: c_int = 2 * RESTART_FRAMES as c_int;

thread_local! {
    /// Frames in the WAL after the last commit made on this thread (set by the WAL hook, which
    /// SQLite calls inside `COMMIT`, on the committing thread; not for a commit that wrote
    /// nothing, such as a claim that found no work).
    static WAL_FRAMES: Cell<Option<c_int>> = const { Cell::new(None) };
}

fn record_frames(_wal: &Wal, frames: c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(Some(frames)));
    Ok(())
}

/// The frames the WAL held after the last commit on this thread that wrote any, and forget
/// them: `None` if no commit since the last call wrote a frame. SQLite calls the WAL hook only
/// for a commit that appended frames, and a commit at `synchronous = FULL` syncs the WAL
/// exactly then: so `None` also says that no fsync ran inside that commit.
pub(super) fn take_frames() -> Option<c_int> {
    WAL_FRAMES.with(Cell::take)
}

/// On the writer connection: commits record their WAL size instead of checkpointing.
pub(super) fn install(writer: &Connection) {
    writer.wal_hook(Some(record_frames));
}

/// The checkpoint thread; stopped and joined on drop.
pub(super) struct Checkpointer {
    kick: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Frames in the WAL after the last commit, and the count at which the next checkpoint is
    /// due (both only touched with the write lock held).
    frames: AtomicI32,
    due: AtomicI32,
    /// The WAL's size when its growth was last logged (0 since it restarted).
    warned: AtomicI32,
}

impl Checkpointer {
    /// `own` is a connection of its own (for step 1); `writer` is the write lock (step 2).
    pub(super) fn start(
        own: Connection,
        writer: Arc<FairMutex<Connection>>,
        wait: Duration,
    ) -> std::io::Result<Checkpointer> {
        let (kick, kicks) = sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("wal-checkpoint".into())
            .spawn(move || run(&own, &writer, &kicks, wait))?;
        Ok(Checkpointer {
            kick: Some(kick),
            thread: Some(thread),
            frames: AtomicI32::new(0),
            due: AtomicI32::new(CHECKPOINT_FRAMES),
            warned: AtomicI32::new(0),
        })
    }

    /// After a commit on the writer connection, with the write lock still held: whether a
    /// checkpoint is due ([`CHECKPOINT_FRAMES`] new frames since the last one), and where.
    /// `frames` is what [`take_frames`] returned for that commit.
    pub(super) fn committed(&self, frames: Option<c_int>) -> Due {
        let Some(frames) = frames else {
            // The commit wrote no frame: the WAL is as it was.
            return Due::No;
        };
        if frames < self.frames.swap(frames, Ordering::Relaxed) {
            // The WAL was restarted from its beginning.
            self.due.store(CHECKPOINT_FRAMES, Ordering::Relaxed);
            self.warned.store(0, Ordering::Relaxed);
        }
        let warned = self.warned.load(Ordering::Relaxed);
        if frames >= 2 * BACKSTOP_FRAMES && frames >= warned.saturating_mul(2) {
            // Each doubling once: a WAL that does not restart makes every later read and
            // checkpoint longer.
            self.warned.store(frames, Ordering::Relaxed);
            tracing::warn!(
                wal_frames = frames,
                wal_mb = i64::from(frames) * 4096 / 1_000_000,
                "the WAL keeps growing: checkpoints have not managed to restart it"
            );
        }
        if frames < self.due.load(Ordering::Relaxed) {
            return Due::No;
        }
        self.due
            .store(frames.saturating_add(CHECKPOINT_FRAMES), Ordering::Relaxed);
        if frames >= BACKSTOP_FRAMES {
            Due::Inline
        } else {
            Due::Yes
        }
    }

    /// Checkpoint on the thread, outside the write lock; returns at once. False if the thread
    /// is gone (then the caller checkpoints inline: a WAL nobody checkpoints only grows).
    pub(super) fn kick(&self) -> bool {
        match &self.kick {
            // Full: a kick is already waiting, which covers this one.
            Some(kick) => !matches!(kick.try_send(()), Err(TrySendError::Disconnected(()))),
            None => false,
        }
    }

    /// Stop and join the thread (what drop does).
    fn stop(&mut self) {
        drop(self.kick.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a commit asks of the checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    No,
    /// 1,000 new frames: inline or on the thread, as the load says.
    Yes,
    /// Due, and the WAL holds [`BACKSTOP_FRAMES`] or more: inline.
    Inline,
}

/// Checkpoint now, on the writer connection with the write lock held: what SQLite's automatic
/// checkpoint does, and the backstop when the thread cannot keep the WAL short.
pub(super) fn inline(writer: &Connection) {
    if let Err(e) = passive(writer, "inline") {
        tracing::warn!(error = %e, "WAL checkpoint failed");
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(own: &Connection, writer: &FairMutex<Connection>, kicks: &Receiver<()>, wait: Duration) {
    while kicks.recv().is_ok() {
        match passive(own, "thread") {
            // Even if it copied every frame it saw when it began: under steady writes there are
            // more by now, and the WAL restarts only once a checkpoint has them all.
            Ok(wal) if wal >= RESTART_FRAMES => {
                // Only if the lock comes within the usual wait: a later kick tries again.
                if let Some(conn) = writer.try_lock_for(wait)
                    && let Err(e) = passive(&conn, "thread, write lock held")
                {
                    tracing::warn!(error = %e, "WAL checkpoint under the write lock failed");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "WAL checkpoint failed"),
        }
        // A kick sent while this one ran is mostly covered by it; the next comes 1,000 frames on.
        while kicks.try_recv().is_ok() {}
    }
}

/// A checkpoint slower than this is logged at `info` (with what it copied): the first sign of a
/// disk that cannot keep up. Every checkpoint is logged at `debug`.
const SLOW: Duration = Duration::from_millis(250);

/// A passive checkpoint; returns the frames the WAL held when it began. `place` names where it
/// ran, for the log.
fn passive(conn: &Connection, place: &'static str) -> rusqlite::Result<i64> {
    let started = std::time::Instant::now();
    let (wal, copied): (i64, i64) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get(1)?, r.get(2)?))
    })?;
    let took = started.elapsed();
    tracing::debug!(
        place,
        wal_frames = wal,
        copied,
        us = took.as_micros() as u64,
        "WAL checkpoint"
    );
    if took >= SLOW {
        tracing::info!(
            place,
            wal_frames = wal,
            copied,
            ms = took.as_millis() as u64,
            "slow WAL checkpoint"
        );
    }
    Ok(wal)
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::super::{SqliteOptions, SqliteStore};
    use super::{CHECKPOINT_FRAMES, RESTART_FRAMES};

    /// Consumers writing without pause get their checkpoints from the thread, outside the write
    /// lock. The thread must still let the WAL restart: without its second step, under the
    /// lock, a passive checkpoint never catches up with writers that never stop, and the WAL
    /// keeps every frame (seen: 38,810 frames with that step ineffective; 1,017 with the hook
    /// not installed, SQLite's automatic checkpoint then restarting it near 1,000).
    #[test]
    fn steady_consumer_writes_keep_the_wal_bounded() {
        let frames = consumer_writes_wal_frames(false);
        assert!(
            frames <= 3 * RESTART_FRAMES as u64,
            "the WAL reached {frames} frames (restarted near {RESTART_FRAMES})"
        );
        // SQLite's own automatic checkpoint would have restarted it near 1,000.
        assert!(
            frames > 2 * CHECKPOINT_FRAMES as u64,
            "{frames} frames: the WAL restarted before {RESTART_FRAMES}, so the store's \
             checkpoints did not run (or the writes did not fill it)"
        );
    }

    /// Without the thread the writer checkpoints inline: the WAL must not grow without bound
    /// (seen: 38,845 frames, every frame written, with a failed hand-off ignored and no
    /// backstop).
    #[test]
    fn without_the_checkpoint_thread_the_writer_checkpoints() {
        let frames = consumer_writes_wal_frames(true);
        assert!(
            frames <= 3 * RESTART_FRAMES as u64,
            "the WAL reached {frames} frames with the checkpoint thread gone"
        );
    }

    /// Three threads of consumer commits (about 39,000 frames) on a new store; returns the size
    /// of the WAL file afterwards, in frames.
    fn consumer_writes_wal_frames(stop_thread: bool) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox.db");
        let mut store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
        if stop_thread {
            store.checkpointer.stop();
        }
        store
            .consumer_write(|tx| {
                tx.execute_batch("CREATE TABLE filler (n INTEGER PRIMARY KEY, body BLOB)")?;
                Ok(())
            })
            .unwrap();
        const THREADS: usize = 3;
        const COMMITS: usize = 800;
        let start = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (store, start) = (&store, &start);
                s.spawn(move || {
                    start.wait();
                    for i in 0..COMMITS {
                        store
                            .consumer_write(|tx| {
                                // 10 rows of 3,000 bytes: about 16 frames a commit.
                                let mut insert =
                                    tx.prepare_cached("INSERT INTO filler VALUES (?1, ?2)")?;
                                for k in 0..10 {
                                    let n = ((t * COMMITS + i) * 10 + k) as i64;
                                    insert.execute(rusqlite::params![n, vec![7_u8; 3000]])?;
                                }
                                Ok(())
                            })
                            .unwrap();
                    }
                });
            }
        });
        let rows: i64 = store
            .read(|c| Ok(c.query_row("SELECT count(*) FROM filler", [], |r| r.get(0))?))
            .unwrap();
        assert_eq!(rows, (THREADS * COMMITS * 10) as i64);
        // The WAL file keeps the size of its longest run (SQLite reuses it from the start); a
        // frame is a 24-byte header and a 4 KiB page.
        const FRAME_BYTES: u64 = 24 + 4096;
        std::fs::metadata(path.with_extension("db-wal"))
            .unwrap()
            .len()
            / FRAME_BYTES
    }
}
