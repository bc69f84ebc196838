//! Group flush: commits are made durable by a shared fsync of the WAL file, outside the write
//! lock (consumer transactions), and commits SQLite synced itself are recorded (ingest and ops
//! writes, at `synchronous = FULL`).
//!
//! A consumer transaction commits with `synchronous = NORMAL`: in WAL mode a commit then
//! appends its frames to the `-wal` file with `write()` and returns without an fsync, so the
//! write lock is free again at once. A caller that must not go on before its commit is durable
//! (calling a downstream system, reporting a retry) then waits here, and one `fdatasync` of the
//! WAL file covers every commit written before it began. While one consumer batch waits for the
//! disk, the next one already runs, and commits that queued up meanwhile share the next fsync.
//!
//! Why this is as durable as `synchronous = FULL`: FULL makes exactly this fsync, of the same
//! file, inside the commit. Checkpoints and WAL restarts sync in NORMAL mode as in FULL (only
//! `OFF` skips them). A commit is acted on only after an fsync that began after its frames were
//! written; Linux `fsync` of any descriptor flushes the file's data, whoever wrote it. A FULL
//! commit's own fsync began after every earlier commit was written, so it makes them durable
//! too ([`WalSync::synced_by_commit`]). Only a commit that wrote a frame syncs: SQLite writes
//! and syncs nothing for a transaction that changed nothing, whatever `synchronous` says, so
//! such a commit marks nothing durable and waits for the commits before it ([`WalSync::last`]).
//!
//! Ingest commits at FULL because it measured faster so (docs/performance.md, eleventh round):
//! the writer thread commits, syncs and answers in turn anyway, and the in-commit fsync cost
//! less kernel time than the separate `fdatasync` and its checks.
//!
//! A failed fsync poisons the store: Linux may have dropped the dirty pages, so a later fsync
//! that succeeds proves nothing. Every later wait fails (503) and readiness goes false until the
//! process restarts and SQLite recovers the WAL from the disk. So does a WAL file found
//! deleted or replaced after a sync: what was synced is then not what a restart reads.

use std::fs::File;
use std::path::{Path, PathBuf};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::store::{StoreError, StoreResult};

/// A commit's place in the order of commits made through the writer connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(pub(super) u64);

pub struct WalSync {
    wal: PathBuf,
    /// Report commits durable without the fdatasync: only for the power-loss test, which must
    /// see acknowledged deliveries lost this way (see [`WalSync::without_fsync`]).
    skip_fsync: bool,
    state: Mutex<State>,
    done: Condvar,
    /// A slow disk, for tests: while a test holds it for writing, every fdatasync waits.
    #[cfg(test)]
    pub(super) hold: parking_lot::RwLock<()>,
}

struct State {
    /// Commits written to the WAL so far (the last ticket handed out).
    written: u64,
    /// Commits known durable.
    synced: u64,
    /// An fsync is running (by one of the waiters).
    syncing: bool,
    file: Option<File>,
    poisoned: Option<String>,
    /// fsyncs made (for tests and metrics).
    syncs: u64,
}

impl WalSync {
    /// `wal` is the `-wal` file of the database. It is opened now if it exists (the writer
    /// connection creates it on its first read), so that a write-back error reported before
    /// the first sync reaches this descriptor too; else at the first sync.
    pub fn new(wal: PathBuf) -> WalSync {
        let file = open(&wal).ok();
        WalSync {
            wal,
            skip_fsync: false,
            state: Mutex::new(State {
                written: 0,
                synced: 0,
                syncing: false,
                file,
                poisoned: None,
                syncs: 0,
            }),
            done: Condvar::new(),
            #[cfg(test)]
            hold: parking_lot::RwLock::new(()),
        }
    }

    /// Unsafe, for the power-loss test only (docs/power-loss.md): `wait` skips the fdatasync,
    /// so a power cut loses commits that were acted on. The test proves with it that it would
    /// notice the fdatasync missing.
    pub fn without_fsync(mut self) -> WalSync {
        self.skip_fsync = true;
        self
    }

    /// Record a commit. Call it after the commit returned and before the write lock is
    /// released, so that tickets follow the order of the frames in the WAL.
    pub fn committed(&self) -> Ticket {
        let mut st = self.state.lock();
        st.written += 1;
        Ticket(st.written)
    }

    /// The ticket of the last commit recorded: what a transaction that wrote nothing waits
    /// for, since its answer rests on those commits.
    pub fn last(&self) -> Ticket {
        Ticket(self.state.lock().written)
    }

    /// A commit that SQLite synced itself (`synchronous = FULL`): its fsync began after every
    /// earlier commit was written, so these are durable too, once the WAL is known to be
    /// the live file still (as after a shared flush).
    pub fn synced_by_commit(&self, ticket: Ticket) -> StoreResult<()> {
        let mut st = self.state.lock();
        let file = match st.file.take() {
            Some(f) => Ok(f),
            None => open(&self.wal),
        };
        match file.and_then(|f| still_linked(&f).map(|()| f)) {
            Ok(file) => {
                st.file = Some(file);
                st.synced = st.synced.max(ticket.0);
                drop(st);
                self.done.notify_all();
                Ok(())
            }
            Err(e) => {
                let why = format!("syncing {}: {e}", self.wal.display());
                drop(st);
                self.poison(why.clone());
                Err(poisoned(&why))
            }
        }
    }

    /// Whether `wait` skips the fsync (the power-loss test's switch).
    pub fn skips_fsync(&self) -> bool {
        self.skip_fsync
    }

    /// Refuse every later write: a sync made elsewhere failed.
    pub fn poison(&self, why: String) {
        tracing::error!(error = %why, "the WAL could not be made durable; \
            refusing writes until restart");
        self.state.lock().poisoned.get_or_insert(why);
        self.done.notify_all();
    }

    /// Return once the commit of `ticket` is durable: at once if an fsync that began after it
    /// has finished, else after the running fsync or one made here.
    pub fn wait(&self, ticket: Ticket) -> StoreResult<()> {
        let mut st = self.state.lock();
        loop {
            if let Some(why) = &st.poisoned {
                return Err(poisoned(why));
            }
            if st.synced >= ticket.0 {
                return Ok(());
            }
            if st.syncing {
                self.done.wait(&mut st);
                continue;
            }
            st.syncing = true;
            let target = st.written;
            let file = match st.file.take() {
                Some(f) => Ok(f),
                None => open(&self.wal),
            };
            // The fsync runs with the state unlocked: commits go on taking tickets meanwhile.
            let result = MutexGuard::unlocked(&mut st, || {
                let file = file?;
                #[cfg(test)]
                let _slow_disk = self.hold.read();
                if !self.skip_fsync {
                    file.sync_data()?;
                }
                still_linked(&file)?;
                Ok::<File, std::io::Error>(file)
            });
            st.syncing = false;
            st.syncs += 1;
            match result {
                Ok(file) => {
                    st.file = Some(file);
                    st.synced = st.synced.max(target);
                }
                Err(e) => {
                    let why = format!("syncing {}: {e}", self.wal.display());
                    tracing::error!(error = %why, "the WAL could not be made durable; \
                        refusing writes until restart");
                    st.poisoned = Some(why);
                }
            }
            self.done.notify_all();
        }
    }

    /// Why the store refuses writes, if it does.
    #[cfg(test)]
    fn poisoned(&self) -> Option<String> {
        self.state.lock().poisoned.clone()
    }

    /// Refuse a write up front once poisoned: its commit could not be promised.
    pub fn check(&self) -> StoreResult<()> {
        match &self.state.lock().poisoned {
            Some(why) => Err(poisoned(why)),
            None => Ok(()),
        }
    }

    /// Whether an fsync is running now.
    #[cfg(test)]
    pub(super) fn syncing(&self) -> bool {
        self.state.lock().syncing
    }

    /// fsyncs made so far.
    #[cfg(test)]
    pub(super) fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }
}

fn poisoned(why: &str) -> StoreError {
    StoreError::unavailable(format!(
        "the database could not be made durable ({why}); restart the service"
    ))
}

/// Never created here: SQLite creates the WAL, and a missing one is an error.
fn open(wal: &Path) -> std::io::Result<File> {
    File::options().read(true).write(true).open(wal)
}

/// The WAL file must still be linked: if it was deleted or replaced (renamed over), the fsync
/// synced a dead file that no restart will read, and nothing can be promised. One `statx` of
/// the descriptor for its link count alone: no path walk, and no timestamps, whose query makes
/// the kernel stamp the next write to the file with a fine-grained time (multigrain
/// timestamps), so an inode update per commit. (A replacement that leaves the old file linked
/// under another name is not seen.)
#[cfg(target_os = "linux")]
fn still_linked(file: &File) -> std::io::Result<()> {
    use rustix::fs::{AtFlags, StatxFlags, statx};
    let st = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::NLINK)?;
    linked(st.stx_nlink)
}

#[cfg(all(unix, not(target_os = "linux")))]
fn still_linked(file: &File) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    linked(file.metadata()?.nlink())
}

#[cfg(not(unix))]
fn still_linked(_: &File) -> std::io::Result<()> {
    Ok(())
}

#[cfg(unix)]
fn linked(links: impl Into<u64>) -> std::io::Result<()> {
    if links.into() > 0 {
        Ok(())
    } else {
        Err(std::io::Error::other(
            "the WAL file was deleted or replaced",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    /// A WAL file with some frames in a fresh directory, and the `WalSync` that watches it; the
    /// directory lives as long as the returned guard.
    fn wal_sync() -> (tempfile::TempDir, PathBuf, WalSync) {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("db-wal");
        std::fs::write(&wal, b"frames").unwrap();
        let sync = WalSync::new(wal.clone());
        (dir, wal, sync)
    }

    #[test]
    fn concurrent_commits_share_fsyncs_and_each_waits_for_one_after_it() {
        let (_dir, _, sync) = wal_sync();
        let sync = Arc::new(sync);
        let barrier = Arc::new(Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (sync, barrier) = (Arc::clone(&sync), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let ticket = sync.committed();
                    sync.wait(ticket).unwrap();
                    // Durable means: an fsync that began after this commit has finished.
                    assert!(sync.state.lock().synced >= ticket.0);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let shared = sync.syncs();
        assert!((1..=16).contains(&shared), "{shared} fsyncs");
        // Waiting again on a durable ticket costs nothing; a new commit needs a new fsync.
        sync.wait(Ticket(16)).unwrap();
        assert_eq!(sync.syncs(), shared);
        let later = sync.committed();
        sync.wait(later).unwrap();
        assert_eq!(sync.syncs(), shared + 1);
    }

    #[test]
    fn a_commit_synced_by_sqlite_makes_it_and_every_earlier_commit_durable_without_a_flush() {
        let (_dir, _, sync) = wal_sync();
        let (first, second) = (sync.committed(), sync.committed());
        sync.synced_by_commit(second).unwrap();
        sync.wait(first).unwrap();
        sync.wait(second).unwrap();
        assert_eq!(sync.syncs(), 0, "both were durable already");
        // A later commit it did not cover still needs its own fsync.
        let third = sync.committed();
        sync.wait(third).unwrap();
        assert_eq!(sync.syncs(), 1);
        // An older ticket reported late does not move the durable mark back.
        sync.synced_by_commit(first).unwrap();
        sync.wait(third).unwrap();
        assert_eq!(sync.syncs(), 1);
    }

    #[test]
    fn a_failed_commit_fsync_poisons_every_later_write() {
        let (_dir, _, sync) = wal_sync();
        sync.check().unwrap();
        sync.poison("disk I/O error".into());
        assert!(sync.check().is_err());
        assert!(sync.wait(sync.committed()).is_err());
        assert_eq!(sync.syncs(), 0);
    }

    #[test]
    fn a_failed_fsync_poisons_every_later_wait() {
        let dir = tempfile::tempdir().unwrap();
        let sync = WalSync::new(dir.path().join("missing-wal"));
        let ticket = sync.committed();
        let err = sync.wait(ticket).unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
        assert!(sync.poisoned().unwrap().contains("missing-wal"));
        // Even a later file would not help: what the failed sync covered may be lost.
        std::fs::write(dir.path().join("missing-wal"), b"").unwrap();
        assert!(sync.wait(sync.committed()).is_err());
    }

    #[test]
    fn a_deleted_wal_file_poisons() {
        let (_dir, wal, sync) = wal_sync();
        sync.wait(sync.committed()).unwrap();
        std::fs::remove_file(&wal).unwrap();
        assert!(sync.wait(sync.committed()).is_err());
        assert!(sync.poisoned().unwrap().contains("deleted or replaced"));
    }

    #[test]
    fn a_commit_synced_by_sqlite_into_a_deleted_wal_file_poisons() {
        let (_dir, wal, sync) = wal_sync();
        std::fs::remove_file(&wal).unwrap();
        let ticket = sync.committed();
        assert!(sync.synced_by_commit(ticket).is_err());
        assert!(sync.poisoned().unwrap().contains("deleted or replaced"));
        assert!(sync.wait(ticket).is_err(), "never reported durable");
    }

    #[test]
    fn a_replaced_wal_file_poisons() {
        let (dir, wal, sync) = wal_sync();
        std::fs::write(dir.path().join("other"), b"").unwrap();
        std::fs::rename(dir.path().join("other"), &wal).unwrap();
        assert!(sync.wait(sync.committed()).is_err());
    }
}
