//! Retention (SPEC section 12): terminal events past their age lose their body and history and
//! keep a tombstone, so a late redelivery is still a duplicate and never a second effect.
//!
//! A purge is a walk over the event table in small batches ([`Store::purge_batch`]), each one
//! short write transaction, with a pause between batches that purged something so that ingest
//! always gets the writer between them. The background task runs one walk every
//! `every` with the `[retention]` ages; `POST /events/purge` runs one with the times it is
//! given.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::RetentionSettings;
use crate::domain::time::now_ms;
use crate::metrics::Metrics;
use crate::store::{PurgeCutoffs, Store, StoreResult};

/// Events per write transaction: a few milliseconds of the writer at most.
pub const BATCH: usize = 100;
/// The writer is left to others this long after each batch that purged something.
pub const PAUSE: Duration = Duration::from_millis(5);
/// How often the background purge walks the table, unless told otherwise.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(600);

const DAY_MS: i64 = 86_400_000;

/// The cutoffs `[retention]` gives at `now`; 0 days keeps that kind forever.
pub fn configured_cutoffs(retention: &RetentionSettings, now: i64) -> PurgeCutoffs {
    let before = |days: u32| (days > 0).then(|| now - i64::from(days) * DAY_MS);
    PurgeCutoffs {
        completed_before: before(retention.completed_days),
        failed_before: before(retention.failed_days),
    }
}

/// One walk over the whole table (blocking). `stop` is checked between batches. Returns how
/// many events became tombstones.
pub fn purge_pass(
    store: &dyn Store,
    cutoffs: &PurgeCutoffs,
    now: i64,
    pause: Duration,
    stop: &dyn Fn() -> bool,
) -> StoreResult<usize> {
    if cutoffs.completed_before.is_none() && cutoffs.failed_before.is_none() {
        return Ok(0);
    }
    let mut after = 0;
    let mut total = 0;
    // Each batch moves `after` forward (or ends the walk): the loop is bounded by the table.
    loop {
        let batch = store.purge_batch(cutoffs, after, BATCH, now)?;
        total += batch.purged;
        match batch.next_after {
            Some(next) if next > after && !stop() => after = next,
            _ => return Ok(total),
        }
        if batch.purged > 0 {
            std::thread::sleep(pause);
        }
    }
}

/// The background purge: a walk at every tick of `every` until `shutdown` turns true.
pub async fn run_background(
    store: Arc<dyn Store>,
    retention: RetentionSettings,
    metrics: Arc<Metrics>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        let cutoffs = configured_cutoffs(&retention, now_ms());
        let (store, stop) = (Arc::clone(&store), shutdown.clone());
        let pass = tokio::task::spawn_blocking(move || {
            purge_pass(store.as_ref(), &cutoffs, now_ms(), PAUSE, &|| {
                *stop.borrow()
            })
        });
        match pass.await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => {
                metrics.purged(n);
                tracing::info!(purged = n, "retention purge");
            }
            // Unavailable: the writer was busy for seconds; the next tick tries again.
            Ok(Err(e)) => tracing::warn!(error = %e, "retention purge stopped"),
            Err(e) => tracing::error!(error = %e, "retention purge task failed"),
        }
    }
}
