//! Group commit: one writer thread batches concurrent deliveries into one transaction (one
//! fsync), and each delivery is answered only after the commit that holds it.
//!
//! Batching is natural rather than timed: while the writer commits one batch, new deliveries
//! queue up, and the next batch takes all of them (up to `max_batch`). A lone delivery is
//! committed at once. The queue is bounded: when it is full, the delivery is answered 503
//! straight away (backpressure) instead of waiting without limit.

mod watchdog;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
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
    /// How long past its deadline a delivery may wait for a commit that does not finish: the
    /// store's own bounded wait for the write lock, plus a margin. Only a stuck writer makes
    /// the watchdog answer 503 first.
    pub backstop: Duration,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            max_batch: 256,
            queue: 8192,
            wait: Duration::from_secs(2),
            backstop: Duration::from_secs(5),
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

type Reply = oneshot::Sender<Result<InsertOutcome, IngestError>>;

struct Job {
    delivery: NewDelivery,
    reply: Reply,
    /// Past this, the writer answers 503 instead of writing the delivery.
    deadline: Instant,
}

impl Job {
    /// Whether the writer would answer it 503 now rather than write it.
    fn late(&self, now: Instant) -> bool {
        self.deadline < now || self.reply.is_closed()
    }
}

/// What the writer shares with its watchdog (`watchdog.rs`).
struct Shared {
    jobs: Mutex<mpsc::Receiver<Job>>,
    writing: Mutex<Writing>,
}

#[derive(Default)]
struct Writing {
    /// When the commit under way started; `None` while the writer waits for deliveries.
    since: Option<Instant>,
    /// That commit's replies: the watchdog answers them if the commit outlives the backstop.
    replies: Vec<Reply>,
}

/// A lock whose holder panicked still guards consistent data: every critical section here only
/// moves values in or out.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

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
        let shared = Arc::new(Shared {
            jobs: Mutex::new(rx),
            writing: Mutex::default(),
        });
        watchdog::start(Arc::downgrade(&shared), options.backstop);
        std::thread::Builder::new()
            .name("ingest-writer".into())
            .spawn(move || writer(store, &shared, max_batch, queued, &marks))
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
        async move {
            sent?;
            // The writer's answer is authoritative: a 503 from it means the delivery was not
            // written. Only if the writer itself is stuck does its watchdog answer (503) in its
            // place, within the same bound; the delivery may then still be committed, and the
            // provider's retry is a duplicate. No timer per delivery: registering and removing
            // one cost about 800 instructions a delivery (docs/performance.md, eighth look).
            answer.await.unwrap_or(Err(IngestError::Stopped))
        }
    }
}

fn writer(
    store: Arc<dyn Store>,
    shared: &Shared,
    max_batch: usize,
    queued: Arc<Notify>,
    activity: &Activity,
) {
    let mut jobs = Vec::with_capacity(max_batch);
    loop {
        {
            // Held while the writer waits for deliveries: the watchdog takes the queue only
            // during a commit.
            let rx = lock(&shared.jobs);
            match rx.recv() {
                Ok(first) => jobs.push(first),
                Err(_) => return,
            }
            while jobs.len() < max_batch {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
        }
        // Deliveries that waited past their deadline are answered 503 and not written. A 503
        // still means only "not acknowledged": a batch whose commit landed but whose fsync
        // failed, or that the watchdog gave up on, may be stored after all, and the provider's
        // retry is then answered `duplicate`.
        let now = Instant::now();
        let (batch, replies): (Vec<NewDelivery>, Vec<_>) = jobs
            .drain(..)
            .filter_map(|j| {
                if j.late(now) {
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
        {
            let mut writing = lock(&shared.writing);
            writing.since = Some(started);
            writing.replies = replies;
        }
        let stored = store.insert_deliveries(&batch);
        // Empty if the watchdog answered them: the commit outlived the backstop.
        let replies = {
            let mut writing = lock(&shared.writing);
            writing.since = None;
            std::mem::take(&mut writing.replies)
        };
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
