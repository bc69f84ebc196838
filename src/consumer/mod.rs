//! The consumer side: claim a batch, run each event's handler, finish the batch.
//!
//! Delivery to handlers is at-least-once (a lease that runs out makes an event claimable
//! again); the store's fences and unique keys make each effect happen once.

mod failures;
mod pool;
mod rules;

use failures::guarded;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tracing::Instrument as _;

pub use pool::{ConsumerPool, PoolOptions};

use crate::config::ConsumerSettings;
use crate::domain::time::now_ms;
use crate::handlers::{Handled, Registry};
use crate::ingest::Activity;
use crate::metrics::Metrics;
use crate::store::rules::Backoff;
use crate::store::{AttemptResult, Claimed, Finish, Finished, Lane, Next, Store, StoreResult};
use crate::telemetry::traces::{self, Delivery, Traces};

/// Bound on the batches one pass takes before it returns to its caller.
const MAX_ROUNDS: usize = 10_000;

/// The longest rest after a round while ingest is busy (see `Consumer::ingest_first`).
const MAX_REST: Duration = Duration::from_millis(50);

/// While deliveries queue for the writer, the pool rests this many times as long as its round
/// took: ingest keeps about three quarters of the turns, and the drain still scales with the
/// rounds (a fixed rest of `MAX_REST` drained a few hundred events a second whatever the
/// backlog, and a soak at half the maximum fell behind whenever the disk slowed its commits).
const SATURATED_REST_ROUNDS: u32 = 3;

/// Finished attempts waiting to be committed, with the handler each came from (for metrics).
#[derive(Default)]
struct Pending {
    items: Vec<Finish>,
    handlers: Vec<&'static str>,
    /// Each attempt's spans, when its trace is sampled.
    traces: Vec<Option<Delivery>>,
}

impl Pending {
    fn push(&mut self, finish: Finish, handler: &'static str, trace: Option<Delivery>) {
        self.items.push(finish);
        self.handlers.push(handler);
        self.traces.push(trace);
    }
}

/// One claim-handle-finish pass over the store; shared by the pool's workers and by
/// `POST /events/run`.
pub struct Consumer {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    lease_ms: i64,
    max_attempts: u32,
    backoff: Backoff,
    /// Each live subscription's rule, by the store's id, as the registry held them at the
    /// last read.
    rules: parking_lot::RwLock<std::collections::HashMap<i64, Arc<rules::Rule>>>,
    /// The registry's version `rules` were read at.
    rules_version: std::sync::atomic::AtomicI64,
    /// While deliveries are being stored, workers drain one round at a time, and after each
    /// round the pool rests (see `run_until_idle`): ingest comes first (a provider waits for
    /// its answer; the backlog can wait). One round at a time alone was not enough: one
    /// worker at full speed still took a core and the write lock from ingest (measured:
    /// ingest while draining at 0.37 of ingest alone).
    ingest_first: parking_lot::Mutex<()>,
    ingest: Arc<Activity>,
    /// Spans of each attempt (`[telemetry]`).
    traces: Traces,
}

impl Consumer {
    pub fn new(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        settings: &ConsumerSettings,
    ) -> Consumer {
        let implicit = crate::subscriptions::implicit_with(settings, registry.downstream().mode());
        Consumer {
            store,
            registry,
            metrics,
            lease_ms: settings.lease_ms(),
            max_attempts: settings.max_attempts,
            backoff: Backoff::new(settings.backoff_base_ms, settings.backoff_max_ms),
            rules: Default::default(),
            rules_version: std::sync::atomic::AtomicI64::new(i64::MIN),
            ingest_first: parking_lot::Mutex::new(()),
            ingest: Arc::default(),
            traces: Traces::off(),
        }
        .with_subscriptions(&implicit)
    }

    /// The store it consumes.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Pace the workers by this ingest writer's commits (see `ingest_first`).
    pub fn paced_by(mut self, ingest: Arc<Activity>) -> Consumer {
        self.ingest = ingest;
        self
    }

    /// Make spans of the attempts whose events are traced.
    pub fn traced_by(mut self, traces: Traces) -> Consumer {
        self.traces = traces;
        self
    }

    /// One pass for `POST /events/run`: claim up to `limit` due in-process events and
    /// process them, then call-out events one at a time while the limit allows. `stopping` is
    /// asked before each handler starts: once it says yes, the remaining claims are released
    /// untouched. Returns the number claimed. Blocking: call it from a blocking thread.
    pub fn run_once(
        &self,
        worker: &str,
        limit: usize,
        stopping: &dyn Fn() -> bool,
    ) -> StoreResult<usize> {
        let started = SystemTime::now();
        let claimed = self
            .store
            .claim(worker, Lane::InProcess, limit, self.lease_ms, now_ms())?;
        let mut count = claimed.len();
        let mut pending = self.handle_batch((claimed, (started, SystemTime::now())), stopping)?;
        self.flush(&mut pending)?;
        while count < limit && !stopping() {
            let n = self.call_out_once(worker, stopping)?;
            if n == 0 {
                break;
            }
            count += n;
        }
        Ok(count)
    }

    /// Process in-process batches until nothing is due or `stopping` says yes. While ingest is
    /// quiet, each batch's completion and the next claim share one transaction: one commit per
    /// batch instead of two, which is what the worker pool's throughput is bound by; while the
    /// pool takes turns beside ingest, a turn claims, handles and completes its own batch.
    /// Returns the number claimed.
    pub fn run_until_idle(
        &self,
        worker: &str,
        limit: usize,
        stopping: &dyn Fn() -> bool,
    ) -> StoreResult<usize> {
        let lane = Lane::InProcess;
        // Claimed by the last round's commit, or `None`: claim at the start of this one.
        let mut claimed = None;
        let mut total = 0;
        for _ in 0..MAX_ROUNDS {
            // While ingest is busy the pool takes turns, and a batch is claimed only once its
            // worker holds the turn: a batch claimed with the last round's commit would age
            // while the other workers take theirs (measured in a soak: the oldest event, the
            // lag, was a claimed one in every sample).
            let one_at_a_time = self.ingest.recent().then(|| self.ingest_first.lock());
            let round = Instant::now();
            let batch = match claimed.take() {
                Some(batch) => batch,
                None => {
                    let started = SystemTime::now();
                    let batch = self
                        .store
                        .claim(worker, lane, limit, self.lease_ms, now_ms())?;
                    (batch, (started, SystemTime::now()))
                }
            };
            if batch.0.is_empty() {
                return Ok(total);
            }
            total += batch.0.len();
            // A claim of at least an eighth of the batch (what a store hands out beside
            // ingest) says a backlog is waiting. Resting then lets steady ingest grow it
            // without end (measured: at 4,000 deliveries/s, a tenth of the maximum, the pool
            // drained 1,500/s and the lag grew by a minute a minute), so while behind the pool
            // rests only if deliveries queue for the writer (ingest saturated: providers first).
            let behind = batch.0.len() >= limit.div_ceil(8);
            let mut pending = self.handle_batch(batch, stopping)?;
            if stopping() {
                self.flush(&mut pending)?;
                return Ok(total);
            }
            if one_at_a_time.is_some() {
                self.flush(&mut pending)?;
                // Still holding the turn, so the whole pool rests: while deliveries queue for
                // the writer, three rounds' time (providers first, the backlog still drains);
                // while the pool keeps up, as long as the round took; while it is behind, not
                // at all.
                let rest = if self.ingest.saturated() {
                    round.elapsed() * SATURATED_REST_ROUNDS
                } else if !behind {
                    round.elapsed()
                } else {
                    Duration::ZERO
                };
                std::thread::sleep(rest.min(MAX_REST));
            } else {
                let started = SystemTime::now();
                let (results, next) = self.store.finish_and_claim(
                    &pending.items,
                    worker,
                    lane,
                    limit,
                    self.lease_ms,
                    now_ms(),
                )?;
                let at = (started, SystemTime::now());
                self.record_all(&mut pending, results, at);
                claimed = Some((next, at));
            }
        }
        // The bound on rounds: finish what is claimed, claim nothing more.
        let now = SystemTime::now();
        let claimed = claimed.unwrap_or((Vec::new(), (now, now)));
        total += claimed.0.len();
        let mut pending = self.handle_batch(claimed, stopping)?;
        self.flush(&mut pending)?;
        Ok(total)
    }

    /// Process call-out events one at a time until none is due or `stopping` says yes. Each
    /// claim takes one event with a fresh lease, so that the lease covers the one call it
    /// leads to (the handler checks that before calling). Returns the number claimed.
    pub fn run_call_outs(&self, worker: &str, stopping: &dyn Fn() -> bool) -> StoreResult<usize> {
        let mut total = 0;
        for _ in 0..MAX_ROUNDS {
            if stopping() {
                break;
            }
            let n = self.call_out_once(worker, stopping)?;
            if n == 0 {
                break;
            }
            total += n;
        }
        Ok(total)
    }

    fn call_out_once(&self, worker: &str, stopping: &dyn Fn() -> bool) -> StoreResult<usize> {
        let started = SystemTime::now();
        let claimed = self
            .store
            .claim(worker, Lane::CallOut, 1, self.lease_ms, now_ms())?;
        let count = claimed.len();
        let mut pending = self.handle_batch((claimed, (started, SystemTime::now())), stopping)?;
        self.flush(&mut pending)?;
        Ok(count)
    }

    /// Run each claimed event's handler. The completions of handlers that call out are
    /// committed at once; the rest are returned for the caller to commit. Once `stopping`
    /// says yes, the claims not yet started are released.
    /// `claimed`: the claims and when their claim started and ended (for their spans).
    fn handle_batch(
        &self,
        (claimed, claim_times): (Vec<Claimed>, (SystemTime, SystemTime)),
        stopping: &dyn Fn() -> bool,
    ) -> StoreResult<Pending> {
        // The claim has just checked the store's view against the registry: rules that moved
        // with it are read again before any of its events is handled.
        if !claimed.is_empty() {
            self.rules_current();
        }
        let mut pending = Pending::default();
        let mut events = claimed.into_iter();
        while let Some(event) = events.next() {
            if stopping() {
                let rest: Vec<_> = std::iter::once(event)
                    .chain(events)
                    .map(|e| e.claim)
                    .collect();
                let released = self.store.release(&rest, now_ms())?;
                tracing::info!(released, "released unstarted claims at shutdown");
                break;
            }
            let rule = self.rule_of(
                event.claim.subscription,
                &event.claim.source,
                &event.event_type,
            );
            let handler = Arc::clone(&rule.handler);
            let trace = self.traces.deliver(&event, &rule.name, claim_times);
            let step = trace
                .as_ref()
                .map(|t| t.step("webhook.handle", opentelemetry::trace::SpanKind::Internal));
            let calls_out = handler.call_timeout().is_some();
            let started = Instant::now();
            // A handler that calls out runs in a span naming the event, for the lines its
            // client may log. In-process handlers name the event on their own lines: a span's
            // fields are formatted for every event, logged or not (about 5,000 instructions a
            // credit, 4% of the drain).
            let handled = if calls_out {
                tracing::info_span!(
                    "handle",
                    source = %event.claim.source,
                    event_id = %event.claim.event_id,
                    attempt = event.claim.attempt,
                )
                .in_scope(|| guarded(handler.as_ref(), &event))
            } else {
                guarded(handler.as_ref(), &event)
            };
            self.metrics
                .observe_processing(started.elapsed().as_secs_f64());
            let next = self.next_state(&event, handled);
            if let Some(step) = step {
                step.end(traces::planned(&next));
            }
            pending.push(
                Finish {
                    claim: event.claim,
                    next,
                },
                handler.name(),
                trace,
            );
            if calls_out {
                self.flush(&mut pending)?;
            }
        }
        Ok(pending)
    }

    fn next_state(&self, event: &Claimed, handled: Handled) -> Next {
        let rule = self.rule_of(
            event.claim.subscription,
            &event.claim.source,
            &event.event_type,
        );
        let (max_attempts, backoff) = (rule.max_attempts, &rule.backoff);
        match handled {
            Handled::Complete { effect, outcome } => Next::Complete { effect, outcome },
            Handled::Permanent(error) => Next::Fail {
                error,
                result: AttemptResult::PermanentError,
                abandoned: false,
            },
            Handled::Abandoned(error) => Next::Fail {
                error,
                result: AttemptResult::PermanentError,
                abandoned: true,
            },
            // Nothing was called: due again at once, under a fresh claim and lease.
            Handled::NotStarted(error) => Next::Retry {
                at: now_ms(),
                error,
            },
            Handled::Retryable(error) => {
                backoff.retry_or_give_up(event.budget_used, max_attempts, error, None, now_ms())
            }
        }
    }

    fn flush(&self, pending: &mut Pending) -> StoreResult<()> {
        if pending.items.is_empty() {
            return Ok(());
        }
        let started = SystemTime::now();
        let results = self.store.finish(&pending.items, now_ms())?;
        self.record_all(pending, results, (started, SystemTime::now()));
        Ok(())
    }

    /// Record what the commit at `at` (its start and end) made of each pending attempt.
    fn record_all(
        &self,
        pending: &mut Pending,
        results: Vec<Finished>,
        at: (SystemTime, SystemTime),
    ) {
        for (((finish, handler), trace), result) in pending
            .items
            .drain(..)
            .zip(pending.handlers.drain(..))
            .zip(pending.traces.drain(..))
            .zip(results)
        {
            if let Some(trace) = trace {
                trace.acked(at, traces::outcome(&finish.next, &result));
            }
            self.record(&finish, handler, result);
        }
    }

    fn record(&self, finish: &Finish, handler: &'static str, result: Finished) {
        let attempt_result = match (&finish.next, result) {
            (_, Finished::LeaseLost) => {
                tracing::warn!(
                    source = %finish.claim.source,
                    event_id = %finish.claim.event_id,
                    "lease lost before completion: nothing applied, the event will be retried"
                );
                self.metrics.attempt(handler, "lease_lost");
                return;
            }
            (_, Finished::Completed { outcome, result }) => {
                self.metrics.processed(handler, outcome.as_str());
                result
            }
            (_, Finished::Retrying) => AttemptResult::RetryableError,
            (Next::Fail { result, error, .. }, Finished::Failed) => {
                tracing::warn!(
                    source = %finish.claim.source,
                    event_id = %finish.claim.event_id,
                    %error,
                    "event failed"
                );
                *result
            }
            (_, Finished::Failed) => AttemptResult::PermanentError,
        };
        self.metrics.attempt(handler, attempt_result.as_str());
    }

    /// Run `run_once` on a blocking thread, keeping the caller's span.
    pub async fn run_once_blocking(
        self: &Arc<Self>,
        worker: String,
        limit: usize,
    ) -> StoreResult<usize> {
        let consumer = Arc::clone(self);
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            span.in_scope(|| consumer.run_once(&worker, limit, &|| false))
        })
        .instrument(tracing::Span::current())
        .await
        .map_err(|e| crate::store::StoreError::Internal(anyhow::anyhow!("consumer task: {e}")))?
    }
}
