//! Opening the node's database at start: refused when unwritable, waited for when PostgreSQL
//! is not up yet.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::config::{Database, Settings};
use crate::store::{self, Hold, Holder, Store, StoreError};

/// Open the store the settings name and bring its schema up to date.
pub fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn Store>> {
    let database = settings.database()?;
    if let Database::Sqlite(path) = &database {
        refuse_unwritable(path)?;
    }
    let store = store::open(&database)?;
    store.migrate().context("applying migrations")?;
    Ok(store)
}

/// How long `serve` waits for a PostgreSQL server that is not up yet at start (a host's
/// services starting together), trying every [`DATABASE_RETRY`]. Once started, a node rides
/// out an outage by itself (503 meanwhile); at start, past this, it exits.
pub const DATABASE_WAIT: Duration = Duration::from_secs(60);
const DATABASE_RETRY: Duration = Duration::from_secs(2);

/// Open the store and take the node's hold on it. A PostgreSQL server that is unreachable
/// (the store says `Unavailable`) is waited for, up to [`DATABASE_WAIT`], with a log line per
/// try; any other error (a wrong password, a bad URL) ends the start at once.
pub(super) fn open_and_hold(database: &Database) -> anyhow::Result<(Arc<dyn Store>, Option<Hold>)> {
    let started = std::time::Instant::now();
    let mut tries = 0u32;
    loop {
        tries += 1;
        let attempt = store::open(database).and_then(|store| {
            let held = store.hold(Holder::Node)?;
            Ok((store, held))
        });
        let error = match attempt {
            Ok(opened) => return Ok(opened),
            Err(e) => e,
        };
        let unreachable = matches!(database, Database::Postgres(_))
            && error
                .chain()
                .any(|c| matches!(c.downcast_ref(), Some(StoreError::Unavailable(_))));
        if !unreachable || started.elapsed() + DATABASE_RETRY > DATABASE_WAIT {
            return Err(error.context(format!(
                "opening the database {} (tried {tries} time(s) over {} s)",
                database.display(),
                started.elapsed().as_secs()
            )));
        }
        tracing::warn!(
            database = %database.display(),
            attempt = tries,
            error = %format!("{error:#}"),
            "waiting for the database: not reachable yet, trying again in {} s (at most {} s)",
            DATABASE_RETRY.as_secs(),
            DATABASE_WAIT.as_secs()
        );
        std::thread::sleep(DATABASE_RETRY);
    }
}

/// A database this process cannot write would otherwise start, say it is ready, answer 503 to
/// every delivery and 500 elsewhere, and have its consumers fail eight times a second: refuse
/// to start instead, saying what to fix.
pub(super) fn refuse_unwritable(path: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => anyhow::bail!(
            "the database file {} is not writable by this process ({e}): give the user that \
             runs webhook-inbox write access to it and to its directory, or mount its \
             filesystem read-write",
            path.display()
        ),
    }
}
