//! A forwarder's loop: rounds of one write each (commit the answers that came back, claim as
//! many events as there are free places), and the calls in between, all on one thread.
//!
//! Why one thread: forwarding used to run its calls as tasks of the node's shared runtime,
//! and each call crossed threads several times (the call's task, the connection's task, the
//! commit task, the claim loop), so that most of a forwarded event's CPU was the kernel waking
//! threads (docs/performance.md, "Forwarding"). On a current-thread runtime those hand-offs
//! are a push onto a local queue; only the store's writes leave the thread.
//!
//! Why rounds: one write at a time, and the answers that arrive while it runs wait for the
//! next one, so the size of a commit follows the load by itself (one answer when idle, dozens
//! when busy) and a busy forwarder claims once for many calls in the same transaction as it
//! commits. The claims run up to a batch ahead of the calls (`super::ahead`), and are shaped
//! ahead of them, so that neither a round's write nor a transform's runs are what a freed
//! place waits for.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::ahead::Ahead;
use super::{Done, Forwarder, MAX_FINISH_BATCH};
use crate::domain::DeliveryMode;
use crate::domain::time::now_ms;
use crate::store::{Finish, Finished, Gate, StoreError, StoreResult, SubscriptionClaim};

/// Writes running at once: a claim may start while the write before it waits for the disk.
const MAX_WRITES: usize = 2;

/// What one round's write gave back.
struct Round {
    /// The claim, when one was asked for.
    written: StoreResult<Option<SubscriptionClaim>>,
    answers: usize,
    /// How many events were asked for.
    limit: usize,
    /// When the write ran (for the traces).
    at: (SystemTime, SystemTime),
    /// The loop's epoch when the write started.
    epoch: u64,
}

impl Forwarder {
    /// Run [`Forwarder::run`] on a thread of its own until `stopped` says so; the handle ends
    /// when the thread does.
    pub fn start(
        self: Arc<Self>,
        queued: Arc<Notify>,
        stopped: watch::Receiver<bool>,
    ) -> anyhow::Result<JoinHandle<()>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (ended, end) = tokio::sync::oneshot::channel::<()>();
        // Linux keeps 15 bytes of a thread's name.
        let name: String = format!("fwd-{}", self.sub.name).chars().take(15).collect();
        std::thread::Builder::new().name(name).spawn(move || {
            runtime.block_on(self.run(queued, stopped));
            let _ = ended.send(());
        })?;
        Ok(tokio::spawn(async move {
            if end.await.is_err() {
                tracing::error!("a forwarder's thread ended abnormally");
            }
        }))
    }

    /// Forward until `stopped` says so; then give back what was claimed ahead, let the calls
    /// in flight finish (each is bounded by its timeout) and commit their answers.
    async fn run(self: Arc<Self>, queued: Arc<Notify>, mut stopped: watch::Receiver<bool>) {
        let concurrency = self.target.concurrency;
        let (done, mut answers) = mpsc::unbounded_channel::<Done>();
        let mut pace = Pace::new(self.target.rate_per_second);
        // At most once, an expired lease is abandoned as "may have acted": a claim held ahead
        // of its call when the node dies would be abandoned without ever being sent. So such a
        // subscription claims only for places free now, and each claim's calls start at once.
        let room = match self.sub.mode {
            DeliveryMode::AtMostOnce => 0,
            DeliveryMode::AtLeastOnce => pace.batch(concurrency),
        };
        let mut ahead = Ahead::new(room);
        let mut applied = self.applied.clone();
        // Answers back from their calls, not committed yet.
        let mut returned: Vec<Done> = Vec::new();
        let mut in_flight = 0usize;
        let mut writes: JoinSet<Round> = JoinSet::new();
        // Places held for the claims of the writes running.
        let mut reserved = 0usize;
        // Moves when an answer opened the breaker or paused the subscription: the claims of
        // writes started before it are given back, as the queue is.
        let mut epoch = 0u64;
        let mut halted = false;
        // No claim before this (idle, a closed gate, errors); answers are still committed.
        let mut rest_until: Option<Instant> = None;
        let mut woken_by_events = false;
        let mut errors: u32 = 0;
        let mut busy = false;
        let mut stopping = *stopped.borrow();
        loop {
            let halting = self.halting.load(Ordering::SeqCst) > 0;
            if halting || halted || stopping {
                self.give_back(ahead.untried()).await;
            } else if ahead.ready() && in_flight < concurrency {
                // A change through this node was answered: no queued call goes out with the
                // settings it replaced.
                if self.stale()
                    && self
                        .given_back(|| ahead.untried(), &mut applied, &stopped)
                        .await
                {
                    continue;
                }
                let mut expired = Vec::new();
                while in_flight < concurrency
                    && let Some(next) = ahead.pop()
                {
                    if next.unshaped.is_none() && !self.covers(&next.event) {
                        expired.push(next.untried());
                        continue;
                    }
                    in_flight += 1;
                    self.spawn_call(next, pace.next(), &done);
                }
                self.give_back(expired).await;
            }
            halted = false;
            let free =
                (concurrency + ahead.room).saturating_sub(in_flight + ahead.len() + reserved);
            // While busy, wait for a quarter of the places before claiming: a claim per
            // finished call would be a transaction per event.
            let want = if busy {
                (concurrency / 4).clamp(1, pace.batch(concurrency))
            } else {
                1
            };
            let claim = (!stopping && !halting && free >= want && rest_until.is_none())
                .then(|| free.min(pace.batch(concurrency)));
            // A claim does not wait for the write before it to be durable (the two share its
            // fsync); answers alone do, so that they gather into one commit.
            let write = match writes.len() {
                0 => claim.is_some() || !returned.is_empty(),
                n => n < MAX_WRITES && claim.is_some(),
            };
            if write {
                let take = returned.len().min(MAX_FINISH_BATCH);
                let batch: Vec<Done> = returned.drain(..take).collect();
                reserved += claim.unwrap_or(0);
                let me = Arc::clone(&self);
                writes.spawn_blocking(move || {
                    // Caught, so that the places it holds come back (the hook logs the panic).
                    let write = std::panic::AssertUnwindSafe(|| me.write(batch, claim, epoch));
                    std::panic::catch_unwind(write).unwrap_or_else(|_| Round {
                        written: Err(StoreError::unavailable("the forwarder's write panicked")),
                        answers: 0,
                        limit: claim.unwrap_or(0),
                        at: (SystemTime::now(), SystemTime::now()),
                        epoch,
                    })
                });
            } else if writes.is_empty() && stopping && in_flight == 0 && returned.is_empty() {
                // Nothing is held ahead: it went back at the top of the loop.
                break;
            }
            let round = tokio::select! {
                Some(first) = answers.recv() => {
                    let before = returned.len();
                    returned.push(first);
                    while let Ok(more) = answers.try_recv() {
                        returned.push(more);
                    }
                    in_flight -= returned.len() - before;
                    let halts = returned[before..].iter().filter(|d| d.halted).count();
                    if halts > 0 {
                        // Their writes are committed: claims made from now on see them.
                        epoch += 1;
                        halted = true;
                        self.halting.fetch_sub(halts, Ordering::SeqCst);
                    }
                    continue;
                }
                Some(round) = writes.join_next(), if !writes.is_empty() => round,
                () = std::future::poll_fn(|cx| ahead.poll_shaped(cx, &self.transform_counters)),
                    if ahead.shaping() => continue,
                _ = stopped.changed(), if !stopping => {
                    stopping = true;
                    continue;
                }
                _ = queued.notified(), if rest_until.is_some() && woken_by_events => {
                    rest_until = None;
                    continue;
                }
                _ = tokio::time::sleep_until(rest_until.unwrap_or_else(Instant::now)), if rest_until.is_some() => {
                    rest_until = None;
                    continue;
                }
            };
            let round = match round {
                Ok(round) => round,
                // Only when the runtime shuts down (a write's panic is caught).
                Err(e) => {
                    tracing::error!(error = %e, subscription = %self.sub.name, "a forwarder's write ended abnormally");
                    break;
                }
            };
            reserved -= round.limit;
            let (claims, gate) = match round.written {
                Ok(Some(c)) => {
                    errors = 0;
                    (c.claims, c.gate)
                }
                Ok(None) => continue,
                Err(e) => {
                    // The claims of the answers stay claimed until their leases run out; the
                    // sweeper then hands the events back (or abandons them, at most once).
                    if round.answers > 0 {
                        tracing::warn!(error = %e, subscription = %self.sub.name, "cannot commit forwarded events' answers");
                    } else {
                        tracing::warn!(error = %e, subscription = %self.sub.name, "forwarder claim failed");
                    }
                    if round.limit == 0 {
                        continue;
                    }
                    errors = errors.saturating_add(1);
                    (Vec::new(), Gate::Open)
                }
            };
            self.give_back(ahead.closed_by(gate)).await;
            let probe = gate == Gate::Probe;
            let untried = || claims.iter().map(|c| (c.claim.clone(), probe)).collect();
            if !claims.is_empty()
                && (round.epoch != epoch || self.halting.load(Ordering::SeqCst) > 0)
            {
                // Claimed before the breaker's opening (or the pause) was written.
                self.give_back(untried()).await;
                continue;
            }
            if !claims.is_empty() && self.given_back(untried, &mut applied, &stopped).await {
                continue;
            }
            busy = claims.len() == round.limit;
            if claims.is_empty() {
                let mut wait = self.rest(errors);
                if let Gate::WaitUntil(at) = gate {
                    let until = u64::try_from(at - now_ms()).unwrap_or(0);
                    wait = wait.min(Duration::from_millis(until.max(1)));
                }
                rest_until = Some(Instant::now() + wait);
                woken_by_events = errors == 0 && gate == Gate::Open;
                continue;
            }
            // Shaped as one batch of the transform's workers, while the loop goes on: each
            // call's lease check (at its start) covers the call that follows.
            self.shape_ahead(&mut ahead, claims, probe, round.at);
        }
    }

    /// How long an idle forwarder waits before it claims again, longer after errors in a row.
    fn rest(&self, errors: u32) -> Duration {
        self.options.idle_poll * 2u32.saturating_pow(errors.min(5))
    }

    /// One round's write (blocking): commit `batch`'s answers, and with `claim`, claim up to
    /// that many events, in one transaction where the store can.
    fn write(&self, batch: Vec<Done>, claim: Option<usize>, epoch: u64) -> Round {
        let started = SystemTime::now();
        let now = now_ms();
        let items: Vec<Finish> = batch
            .iter()
            .map(|d| Finish {
                claim: d.event.claim.clone(),
                next: self.next(&d.event, &d.answer, now),
            })
            .collect();
        let written = self.store.finish_and_claim_subscription(
            &items,
            &self.worker,
            self.sub_id,
            claim,
            self.options.lease_ms,
            now,
        );
        let at = (started, SystemTime::now());
        let written = written.map(|(finished, claimed)| {
            self.committed(&items, finished, batch, at);
            claimed
        });
        Round {
            written,
            answers: items.len(),
            limit: claim.unwrap_or(0),
            at,
            epoch,
        }
    }

    fn committed(
        &self,
        items: &[Finish],
        finished: Vec<Finished>,
        batch: Vec<Done>,
        at: (SystemTime, SystemTime),
    ) {
        for ((item, result), done) in items.iter().zip(finished).zip(batch) {
            if let Some(trace) = done.trace {
                trace.acked(at, crate::telemetry::traces::outcome(&item.next, &result));
            }
            self.record(item, result);
        }
    }
}

/// Spacing of call starts for `rate_per_second` (0: none).
struct Pace {
    every: Option<Duration>,
    next: Instant,
}

impl Pace {
    fn new(rate_per_second: u32) -> Pace {
        Pace {
            every: (rate_per_second > 0).then(|| Duration::from_secs(1) / rate_per_second),
            next: Instant::now(),
        }
    }

    /// How many events a claim may take: with a rate, a quarter of a second's worth, so that
    /// the last one claimed starts long before its lease runs out.
    fn batch(&self, concurrency: usize) -> usize {
        match self.every {
            None => concurrency,
            Some(every) => {
                let quarter = Duration::from_millis(250).as_nanos() / every.as_nanos().max(1);
                usize::try_from(quarter)
                    .unwrap_or(usize::MAX)
                    .clamp(1, concurrency)
            }
        }
    }

    /// When the next call may start (`None`: at once).
    fn next(&mut self) -> Option<Instant> {
        let every = self.every?;
        let at = self.next.max(Instant::now());
        self.next = at + every;
        Some(at)
    }
}
