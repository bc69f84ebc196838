//! Deliveries refused at the edge (unknown source, bad signature, stale timestamp, oversize,
//! bad body, forbidden sender), kept where ops can read them (`GET /rejections`), so that "why
//! does the provider say our endpoint fails?" has an answer in the product.
//!
//! The route hands each refusal to a bounded queue and answers at once; a background task
//! writes what it finds there in one transaction per batch, trims the table to
//! `[rejections] keep_count` and `keep_days` in the same transaction, and waits a little before
//! the next batch. A flood therefore costs at most a few short write transactions a second, and
//! what the queue cannot hold is dropped and counted
//! (`webhook_inbox_rejections_dropped_total`), never queued without bound.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::RejectionSettings;
use crate::domain::time::now_ms;
use crate::metrics::Metrics;
use crate::store::{NewRejection, Store};

/// Refusals waiting for the writer; more are dropped (counted).
const QUEUE: usize = 512;
/// Most refusals one transaction writes.
const BATCH: usize = 256;
/// The writer's pause after each batch: at most four write transactions and about a thousand
/// refusals a second, whatever the flood (measured: recording every refusal the queue took, at
/// ten batches of 512 a second, cost accepted deliveries a quarter of their rate beside a
/// flood; docs/performance.md).
const PAUSE: Duration = Duration::from_millis(250);

/// The route's side: record a refusal without waiting.
pub struct Rejections {
    queue: Option<mpsc::Sender<NewRejection>>,
    metrics: Arc<Metrics>,
}

/// The writer's side, run by [`Writer::run`] until every [`Rejections`] is gone.
pub struct Writer {
    queue: mpsc::Receiver<NewRejection>,
    store: Arc<dyn Store>,
    settings: RejectionSettings,
}

impl Rejections {
    /// `None` for the writer when `keep_count` is 0: nothing is recorded.
    pub fn new(
        store: Arc<dyn Store>,
        settings: &RejectionSettings,
        metrics: Arc<Metrics>,
    ) -> (Rejections, Option<Writer>) {
        if settings.keep_count == 0 {
            return (
                Rejections {
                    queue: None,
                    metrics,
                },
                None,
            );
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = Writer {
            queue: rx,
            store,
            settings: settings.clone(),
        };
        (
            Rejections {
                queue: Some(tx),
                metrics,
            },
            Some(writer),
        )
    }

    /// Queue a refusal; it is built only once it has a place in the queue, so that a flood
    /// the writer cannot keep up with costs a counter increment per refusal, not a record.
    pub fn record(&self, rejection: impl FnOnce() -> NewRejection) {
        let Some(queue) = &self.queue else { return };
        match queue.try_reserve() {
            Ok(place) => place.send(rejection()),
            Err(_) => self.metrics.rejection_dropped(),
        }
    }
}

impl Writer {
    pub async fn run(mut self) {
        let keep = self.settings.keep_count;
        let age_ms = i64::from(self.settings.keep_days) * 86_400_000;
        while let Some(first) = self.queue.recv().await {
            let mut batch = vec![first];
            while batch.len() < BATCH {
                match self.queue.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let store = Arc::clone(&self.store);
            let since = now_ms().saturating_sub(age_ms);
            let written =
                tokio::task::spawn_blocking(move || store.record_rejections(&batch, keep, since))
                    .await;
            match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "refused deliveries not recorded"),
                Err(e) => tracing::warn!(error = %e, "the rejection writer's task failed"),
            }
            tokio::time::sleep(PAUSE).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{QUEUE, Rejections};
    use crate::config::RejectionSettings;
    use crate::metrics::Metrics;
    use crate::store::sqlite::{SqliteOptions, SqliteStore};
    use crate::store::{NewRejection, StatusCounts};

    fn refusal() -> NewRejection {
        NewRejection {
            received_at: 1,
            source: "shop".into(),
            peer: None,
            reason: "invalid_signature".into(),
            status: 401,
            message: "no".into(),
            headers: "{}".into(),
            body_bytes: None,
            body_sha256: None,
        }
    }

    /// A flood while the writer is busy: the queue holds what it can, the rest is dropped and
    /// counted, and recording never waits.
    #[test]
    fn a_full_queue_drops_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let metrics = Arc::new(Metrics::new());
        let (rejections, writer) = Rejections::new(
            Arc::new(store),
            &RejectionSettings::default(),
            Arc::clone(&metrics),
        );
        for _ in 0..QUEUE + 3 {
            rejections.record(refusal);
        }
        let text = metrics.render(&StatusCounts::default(), 0);
        assert!(
            text.contains("webhook_inbox_rejections_dropped_total 3"),
            "{text}"
        );
        drop(writer);
        // keep_count 0 records nothing and builds nothing.
        let off = RejectionSettings {
            keep_count: 0,
            ..RejectionSettings::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let (rejections, writer) = Rejections::new(Arc::new(store), &off, Arc::clone(&metrics));
        assert!(writer.is_none());
        rejections.record(|| unreachable!("not built when nothing is kept"));
    }
}
