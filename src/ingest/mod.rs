//! Group commit: one writer thread batches concurrent deliveries into one transaction (one
//! fsync), and each delivery is answered only after the commit that holds it.
//!
//! Batching is natural rather than timed: while the writer commits one batch, new deliveries
//! queue up, and the next batch takes all of them (up to `max_batch`). A lone delivery is
//! committed at once. The queue is bounded: when it is full, the delivery is answered 503
//! straight away (backpressure) instead of waiting without limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use crate::store::{InsertOutcome, NewDelivery, Store, StoreError};

#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Most deliveries in one transaction.
    pub max_batch: usize,
    /// Deliveries waiting for the writer before new ones are refused.
    pub queue: usize,
    /// Longest a delivery may wait in the queue; one still waiting then is answered 503 by the
    /// writer and never written. Its commit may take the store's bounded wait on top.
    pub wait: Duration,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            max_batch: 256,
            queue: 8192,
            wait: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("the ingest queue is full")]
    QueueFull,
    #[error("the commit did not finish in time")]
    Timeout,
    #[error("the ingest writer has stopped")]
    Stopped,
    #[error("the commit failed: {0}")]
    Store(String),
}

struct Job {
    delivery: NewDelivery,
    reply: oneshot::Sender<Result<InsertOutcome, IngestError>>,
    /// Past this, the writer answers 503 instead of writing the delivery.
    deadline: Instant,
}

/// How long a caller waits for the writer beyond its job's deadline: the store's own bounded
/// wait for the write lock, plus a margin. Only a stuck writer makes a caller give up first.
const BACKSTOP: Duration = Duration::from_secs(5);

/// The handle routes use; cheap to clone.
#[derive(Clone)]
pub struct Ingestor {
    jobs: mpsc::SyncSender<Job>,
    wait: Duration,
    activity: Arc<Activity>,
}

/// How long after a commit ingest still counts as active.
const RECENT: Duration = Duration::from_millis(20);

/// When the writer last committed deliveries. While they keep coming, consumers drain one
/// round at a time so that ingest keeps the CPU and the write lock it needs: pacing that
/// belongs to this process, whatever the store.
pub struct Activity {
    started: Instant,
    /// Milliseconds since `started` of the last commit, plus one (0: never).
    last: AtomicU64,
    /// Deliveries in the last commit: many means they queued for the writer.
    last_batch: AtomicU64,
}

/// A group commit of at least this many deliveries says they waited for the writer: ingest is
/// saturated, and the consumers yield to it (see `Consumer::run_until_idle`).
const SATURATED: u64 = 32;

impl Default for Activity {
    fn default() -> Self {
        Activity {
            started: Instant::now(),
            last: AtomicU64::new(0),
            last_batch: AtomicU64::new(0),
        }
    }
}

impl Activity {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    fn mark(&self, deliveries: usize) {
        self.last.store(self.elapsed_ms() + 1, Ordering::Relaxed);
        self.last_batch.store(deliveries as u64, Ordering::Relaxed);
    }

    /// Whether the last commit was recent and its deliveries had queued for the writer.
    pub fn saturated(&self) -> bool {
        self.recent() && self.last_batch.load(Ordering::Relaxed) >= SATURATED
    }

    /// Whether deliveries were committed within the last few milliseconds.
    pub fn recent(&self) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last != 0 && self.elapsed_ms() + 1 - last <= RECENT.as_millis() as u64
    }
}

impl Ingestor {
    /// Start the writer thread. It stops when the last `Ingestor` is dropped. `queued` is
    /// notified after each commit that queued a new event, so idle consumers wake up.
    pub fn start(store: Arc<dyn Store>, options: IngestOptions, queued: Arc<Notify>) -> Ingestor {
        let (tx, rx) = mpsc::sync_channel(options.queue.max(1));
        let max_batch = options.max_batch.max(1);
        let activity = Arc::new(Activity::default());
        let marks = Arc::clone(&activity);
        std::thread::Builder::new()
            .name("ingest-writer".into())
            .spawn(move || writer(store, rx, max_batch, queued, &marks))
            .expect("spawning the ingest writer thread");
        Ingestor {
            jobs: tx,
            wait: options.wait,
            activity,
        }
    }

    /// When this writer last committed, for the consumers' pacing.
    pub fn activity(&self) -> Arc<Activity> {
        Arc::clone(&self.activity)
    }

    /// Store one delivery: the future answers after the transaction holding it has committed.
    /// The delivery is handed to the writer here, before the future is first polled, so that
    /// the future does not carry it while it waits.
    pub fn ingest(
        &self,
        delivery: NewDelivery,
    ) -> impl Future<Output = Result<InsertOutcome, IngestError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let deadline = Instant::now() + self.wait;
        let sent = self
            .jobs
            .try_send(Job {
                delivery,
                reply,
                deadline,
            })
            .map_err(|e| match e {
                mpsc::TrySendError::Full(_) => IngestError::QueueFull,
                mpsc::TrySendError::Disconnected(_) => IngestError::Stopped,
            });
        let backstop = self.wait + BACKSTOP;
        async move {
            sent?;
            // The writer's answer is authoritative: a 503 from it means the delivery was not
            // written. Only if the writer itself is stuck does the caller give up (503); the
            // delivery may then still be committed, and the provider's retry is a duplicate.
            match tokio::time::timeout(backstop, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(IngestError::Stopped),
                Err(_) => Err(IngestError::Timeout),
            }
        }
    }
}

fn writer(
    store: Arc<dyn Store>,
    rx: mpsc::Receiver<Job>,
    max_batch: usize,
    queued: Arc<Notify>,
    activity: &Activity,
) {
    let mut jobs = Vec::with_capacity(max_batch);
    while let Ok(first) = rx.recv() {
        jobs.push(first);
        while jobs.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        // Deliveries that waited past their deadline are answered 503 and not written. A 503
        // still means only "not acknowledged": a batch whose commit landed but whose fsync
        // failed, or that the caller's backstop gave up on, may be stored after all, and the
        // provider's retry is then answered `duplicate`.
        let now = Instant::now();
        let (batch, replies): (Vec<NewDelivery>, Vec<_>) = jobs
            .drain(..)
            .filter_map(|j| {
                if j.deadline < now || j.reply.is_closed() {
                    let _ = j.reply.send(Err(IngestError::Timeout));
                    None
                } else {
                    Some((j.delivery, j.reply))
                }
            })
            .unzip();
        if batch.is_empty() {
            continue;
        }
        let started = Instant::now();
        let stored = store.insert_deliveries(&batch);
        activity.mark(batch.len());
        tracing::debug!(
            batch = batch.len(),
            us = started.elapsed().as_micros() as u64,
            "group commit"
        );
        match stored {
            Ok(outcomes) => {
                if outcomes.contains(&InsertOutcome::Queued) {
                    queued.notify_waiters();
                }
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                let message = match &e {
                    StoreError::Unavailable(u) => u.chain(),
                    StoreError::Internal(err) => format!("{err:#}"),
                };
                tracing::error!(error = %message, batch = batch.len(), "group commit failed");
                for reply in replies {
                    let _ = reply.send(Err(IngestError::Store(message.clone())));
                }
            }
        }
    }
}
