//! `webhook-inbox backup`: a consistent copy of a live database, taken from another process
//! while the server keeps serving.
//!
//! `VACUUM INTO` rather than the online backup API: it copies inside one read transaction, so
//! in WAL mode it sees one snapshot from start to end and never blocks the server's writer,
//! whereas the backup API, stepped page by page for a progress bar, starts again from the
//! beginning whenever another process writes between two steps (under steady ingest it might
//! never finish). The copy is also compact (no free pages). Progress is the copy's size
//! against the live pages of the source, read while the copy grows.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use rusqlite::{Connection, OpenFlags};

/// What a finished backup reports.
#[derive(Debug, Clone)]
pub struct BackupReport {
    pub bytes: u64,
    /// `PRAGMA integrity_check` of the copy: `ok`, or SQLite's first complaint.
    pub integrity: String,
}

/// Copy the database at `source` to `dest` (refused if `dest` exists, unless `overwrite`).
/// The copy is written beside `dest` first, checked, synced, then renamed into place, so an
/// interrupted backup never leaves a half file under the name asked for, nor replaces a good
/// one. `progress(done, total)` is called a few times a second with bytes.
pub fn backup(
    source: &Path,
    dest: &Path,
    overwrite: bool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> anyhow::Result<BackupReport> {
    if dest.exists() && !overwrite {
        bail!("{} exists; pass --force to replace it", dest.display());
    }
    // Read-write without create: a mistyped path is an error, not a new empty database.
    let conn = Connection::open_with_flags(source, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .with_context(|| format!("opening database {}", source.display()))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let total: i64 = conn.query_row(
        "SELECT (page_count - freelist_count) * page_size
           FROM pragma_page_count, pragma_freelist_count, pragma_page_size",
        [],
        |r| r.get(0),
    )?;
    let partial = partial_path(dest);
    match std::fs::remove_file(&partial) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", partial.display()));
        }
        _ => {}
    }
    let target = partial
        .to_str()
        .with_context(|| format!("{} is not valid UTF-8", partial.display()))?;
    let (done, ticks) = mpsc::channel::<()>();
    let watched = &partial;
    let copied = std::thread::scope(|scope| {
        scope.spawn(move || {
            let total = total.max(0) as u64;
            // Ends when the copy is done (message or sender dropped).
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                ticks.recv_timeout(Duration::from_millis(200))
            {
                let len = std::fs::metadata(watched).map(|m| m.len()).unwrap_or(0);
                progress(len.min(total), total);
            }
        });
        let copied = conn
            .execute("VACUUM INTO ?1", [target])
            .with_context(|| format!("copying the database into {}", partial.display()));
        drop(done);
        copied
    });
    copied?;
    let integrity = check(&partial)?;
    if integrity != "ok" {
        bail!(
            "the copy in {} failed its integrity check: {integrity}",
            partial.display()
        );
    }
    std::fs::File::open(&partial)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", partial.display()))?;
    std::fs::rename(&partial, dest)
        .with_context(|| format!("renaming {} to {}", partial.display(), dest.display()))?;
    // The rename is durable once the directory is synced.
    if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).ok();
    }
    let bytes = std::fs::metadata(dest)?.len();
    progress(bytes, bytes);
    Ok(BackupReport { bytes, integrity })
}

fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".partial");
    name.into()
}

/// `PRAGMA integrity_check` of a database file: `ok` or the first complaint.
pub fn check(path: &Path) -> anyhow::Result<String> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok(conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
}
