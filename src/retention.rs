//! Retention (SPEC section 12): terminal events past their age lose their body and history and
//! keep a tombstone, so a late redelivery is still a duplicate and never a second effect.
//!
//! A purge is a walk over the event table in small batches ([`Store::purge_batch`]), each one
//! short write transaction, with a pause between batches that purged something so that ingest
//! always gets the writer between them. The background task runs one walk every
//! `every` with the `[retention]` ages; `POST /events/purge` runs one with the times it is
//! given.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::RetentionSettings;
use crate::domain::time::now_ms;
use crate::metrics::Metrics;
use crate::store::{PurgeCutoffs, Store, StoreResult};

/// Events per write transaction: a few milliseconds of the writer at most.
pub const BATCH: usize = 100;
/// The writer is left to others at least this long after each batch that purged something.
pub const PAUSE: Duration = Duration::from_millis(5);
/// After a batch that purged something, the walk sleeps this many times as long as the batch
/// took, so it holds at most a tenth of the time (CPU and writer alike) and backs off by itself
/// when ingest keeps the writer busy. Measured with scripts/bench-purge: with only `PAUSE`,
/// ingest while purging kept a median 0.49 of ingest alone on 2 shared cores.
pub const YIELD_FACTOR: u32 = 9;
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

/// One background walk (blocking), from `after` (0: the oldest event): see
/// [`Walked::tombstones_through`] for where the next one may start. `stop` is checked between
/// batches.
pub fn purge_pass(
    store: &dyn Store,
    cutoffs: &PurgeCutoffs,
    now: i64,
    after: i64,
    stop: &dyn Fn() -> bool,
) -> StoreResult<Walked> {
    let walk = Walk {
        after,
        limit: None,
        pause: PAUSE,
        settle: true,
    };
    purge_walk(store, cutoffs, now, &walk, stop)
}

/// Where a walk starts and how far it may go.
#[derive(Debug, Clone, Copy)]
pub struct Walk {
    /// The `seq` after which the walk starts (0: the oldest event).
    pub after: i64,
    /// At most this many tombstones in this walk (`None`: no limit).
    pub limit: Option<usize>,
    /// The least sleep after each batch that purged something (see [`YIELD_FACTOR`]).
    pub pause: Duration,
    /// Find [`Walked::tombstones_through`] (one more read per batch while every event walked
    /// so far is a tombstone).
    pub settle: bool,
}

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    pub purged: usize,
    /// Where to go on from (`Walk::after` of the next walk); `None`: the walk reached the
    /// newest event.
    pub resume_after: Option<i64>,
    /// With `Walk::settle`: every event from the walk's start up to this `seq` is a tombstone,
    /// and a tombstone never changes again (a retry, a backfill and a purge all need its
    /// body), so the next walk may start here instead of rereading them (months of tombstones
    /// made every walk long again). Else the walk's start.
    pub tombstones_through: i64,
}

/// A walk from `walk.after` (blocking), ended early by `walk.limit` or by `stop` (checked
/// between batches, so at least one batch always runs and every walk moves on).
pub fn purge_walk(
    store: &dyn Store,
    cutoffs: &PurgeCutoffs,
    now: i64,
    walk: &Walk,
    stop: &dyn Fn() -> bool,
) -> StoreResult<Walked> {
    if cutoffs.completed_before.is_none() && cutoffs.failed_before.is_none() {
        return Ok(Walked {
            purged: 0,
            resume_after: None,
            tombstones_through: walk.after,
        });
    }
    let mut after = walk.after;
    let mut total = 0;
    let (mut settling, mut through) = (walk.settle, walk.after);
    // Each batch moves `after` forward (or ends the walk): the loop is bounded by the table.
    loop {
        let room = walk.limit.map_or(BATCH, |l| BATCH.min(l - total));
        let started = Instant::now();
        let batch = store.purge_batch(cutoffs, after, room, now)?;
        let took = started.elapsed();
        total += batch.purged;
        let next = match batch.next_after {
            Some(next) if next > after => next,
            _ => {
                return Ok(Walked {
                    purged: total,
                    resume_after: None,
                    tombstones_through: through,
                });
            }
        };
        if settling {
            settling = store.tombstones_through(after, next)?;
            if settling {
                through = next;
            }
        }
        after = next;
        if walk.limit == Some(total) || stop() {
            return Ok(Walked {
                purged: total,
                resume_after: Some(after),
                tombstones_through: through,
            });
        }
        if batch.purged > 0 {
            std::thread::sleep(walk.pause.max(took * YIELD_FACTOR));
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
    // Where the next walk starts: after the tombstones every walk so far found first. Kept in
    // memory: a restarted node walks them once again.
    let mut start = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        let cutoffs = configured_cutoffs(&retention, now_ms());
        let (store, stop) = (Arc::clone(&store), shutdown.clone());
        let started = std::time::Instant::now();
        let pass = tokio::task::spawn_blocking(move || {
            purge_pass(store.as_ref(), &cutoffs, now_ms(), start, &|| {
                *stop.borrow()
            })
        });
        let pass = pass.await;
        tracing::debug!(
            ms = started.elapsed().as_millis() as u64,
            from = start,
            "retention walk"
        );
        match pass.map(|walked| {
            walked.map(|w| {
                start = w.tombstones_through;
                w.purged
            })
        }) {
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
