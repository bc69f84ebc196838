//! Subscriptions of kind `http` (SPEC section 13): each matching event is POSTed to the user's
//! endpoint, signed as a Standard Webhooks sender signs, until a 2xx. Kinds `nats` and `amqp`
//! are the same forwarder with a publish to a JetStream subject or a RabbitMQ exchange instead
//! of the POST ([`Via`]): claims, breaker, retries, pause, ordering and commits are shared.
//!
//! One forwarder per subscription and node. It claims due events of its subscription in
//! batches (one statement; the claim also fans new events out), starts each call as a task,
//! with at most `concurrency` in flight, and commits the answers in batches: under load, a
//! claim and a commit cover many calls. Each call starts only while its claim's lease covers
//! its whole timeout, and its completion is fenced by the claim: a call that outlived its lease
//! changes nothing (the event is forwarded again, and the receiver's dedup on `webhook-id`
//! makes that safe; an at-most-once subscription abandons it instead).
//!
//! The circuit breaker lives in the database, so that every node and a restart see it: after
//! a run of failed calls the subscription claims nothing until its next probe, one event,
//! whose success closes it (see `Store::claim_subscription`).

mod amqp;
pub mod call;
mod nats;

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, Semaphore, mpsc, watch};

use crate::consumer::Backoff;
use crate::domain::time::now_ms;
use crate::metrics::Metrics;
use crate::store::{Claimed, Gate, Store, StoreResult};
use crate::subscriptions::{HttpTarget, Subscription};
use call::Answer;

/// Failed calls in a row that open the breaker.
pub const FAILURES_TO_OPEN: u32 = 5;

/// A call starts only while its lease has at least this much left beyond the call's timeout.
const LEASE_MARGIN_MS: i64 = 1_000;

/// The most answers committed in one transaction.
const MAX_FINISH_BATCH: usize = 512;

/// How the forwarders of one node run.
mod answers;

#[derive(Debug, Clone)]
pub struct ForwardOptions {
    pub lease_ms: i64,
    /// How often an idle forwarder looks again without being woken.
    pub idle_poll: Duration,
    /// Prefix of worker names (`host-pid`).
    pub name: String,
    /// Spans of each claim, call and answer (`[telemetry]`).
    pub traces: crate::telemetry::Traces,
    /// The worker processes that run transforms (also the pull routes' and the preview's).
    pub transforms: Arc<crate::transform::Pool>,
}

/// How a forwarder delivers an event.
enum Via {
    Http(reqwest::Client),
    Nats(Box<nats::Publisher>),
    Amqp(Box<amqp::Publisher>),
}

/// The forwarder of one `http`, `nats` or `amqp` subscription.
pub struct Forwarder {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    sub_id: i64,
    sub: Subscription,
    target: HttpTarget,
    /// The secrets it signs with, from the store (a rotation is seen without a restart).
    secrets: crate::secrets::Live,
    via: Via,
    backoff: Backoff,
    options: ForwardOptions,
    worker: String,
    /// Failed calls in a row on this node (any success resets it).
    failures: AtomicU32,
    /// `webhook_inbox_forwards_total` of this subscription, by result.
    counters: Vec<(&'static str, prometheus_client::metrics::counter::Counter)>,
    transform_counters: crate::transform::Counters,
    /// The registry's version its node serves, and how to ask the node to read the registry
    /// now (see [`Forwarder::fenced_by`]).
    applied: Option<(watch::Receiver<i64>, Arc<Notify>)>,
}

/// The results of `webhook_inbox_forwards_total`.
const RESULTS: [&str; 10] = [
    "2xx",
    // A `nats` or `amqp` publish acked, or refused by the broker (no stream takes its subject,
    // no queue its routing key).
    "acked",
    "refused",
    "3xx",
    "4xx",
    "5xx",
    "410",
    "timeout",
    "connection",
    "not_sent",
];

/// One call's answer, on its way to be committed.
struct Done {
    event: Claimed,
    /// `None`: not started (the lease no longer covered the call).
    answer: Option<Answer>,
    /// Its spans, when its trace is sampled.
    trace: Option<crate::telemetry::traces::Delivery>,
}

impl Forwarder {
    /// The forwarder of `sub` (of kind `http`, `nats` or `amqp`), signing an `http` one's calls with
    /// the secrets `secrets` reads.
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        sub_id: i64,
        sub: Subscription,
        secrets: crate::secrets::Live,
        options: ForwardOptions,
    ) -> anyhow::Result<Forwarder> {
        let target = sub
            .http
            .clone()
            .ok_or_else(|| anyhow::anyhow!("subscription `{}` has no target", sub.name))?;
        let via = match sub.kind {
            crate::subscriptions::Kind::Nats => {
                Via::Nats(Box::new(nats::Publisher::new(target.clone())))
            }
            crate::subscriptions::Kind::Amqp => {
                Via::Amqp(Box::new(amqp::Publisher::new(target.clone())))
            }
            _ => Via::Http(call::client(&target)?),
        };
        let counters = RESULTS
            .iter()
            .map(|r| (*r, metrics.forward_counter(&sub.name, r)))
            .collect();
        Ok(Forwarder {
            counters,
            transform_counters: crate::transform::Counters::new(&metrics, &sub.name),
            backoff: Backoff::new(sub.backoff_base_ms, sub.backoff_max_ms),
            worker: format!("{}-{}", options.name, sub.name),
            store,
            metrics,
            sub_id,
            sub,
            target,
            secrets,
            via,
            options,
            failures: AtomicU32::new(0),
            applied: None,
        })
    }

    /// Claim only while the registry's version seen by the claims is no later than `applied`
    /// (the version the node's forwarders were made for): a claim that saw a later one is given
    /// back, untouched, until the node has caught up, so that once a change through the API is
    /// answered no call goes out with the settings it replaced.
    pub fn fenced_by(mut self, applied: watch::Receiver<i64>, read_now: Arc<Notify>) -> Forwarder {
        self.applied = Some((applied, read_now));
        self
    }

    /// Whether the registry moved past what the node serves (read after a claim, which reads
    /// the version in its own transaction).
    fn stale(&self) -> bool {
        match (&self.applied, self.store.registry_version_seen()) {
            (Some((applied, _)), Some(seen)) => seen > *applied.borrow(),
            // The store forgot its view (a change through this node just committed): the
            // claim may have been made before it, so it is not trusted.
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// Forward until `stopped` says so; then let the calls in flight finish (each is bounded
    /// by its timeout) and commit their answers.
    pub async fn run(self: Arc<Self>, queued: Arc<Notify>, mut stopped: watch::Receiver<bool>) {
        let permits = Arc::new(Semaphore::new(self.target.concurrency));
        let (done, answers) = mpsc::unbounded_channel();
        let finisher = tokio::spawn(Arc::clone(&self).finish_answers(answers));
        let mut pace = Pace::new(self.target.rate_per_second);
        let mut applied = self.applied.clone();
        let mut errors: u32 = 0;
        let mut busy = false;
        loop {
            if *stopped.borrow() {
                break;
            }
            // While busy, wait for a quarter of the permits before claiming: a claim per
            // finished call would be a transaction per event.
            let want = if busy {
                (self.target.concurrency / 4).clamp(1, pace.batch(self.target.concurrency))
            } else {
                1
            };
            let mut held = tokio::select! {
                p = Arc::clone(&permits).acquire_many_owned(want as u32) => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = stopped.changed() => break,
            };
            let more = permits
                .available_permits()
                .min(pace.batch(self.target.concurrency) - want);
            if more > 0
                && let Ok(p) = Arc::clone(&permits).try_acquire_many_owned(more as u32)
            {
                held.merge(p);
            }
            let claim_started = SystemTime::now();
            let claimed = {
                let me = Arc::clone(&self);
                let limit = held.num_permits();
                tokio::task::spawn_blocking(move || me.claim(limit)).await
            };
            let claim_times = (claim_started, SystemTime::now());
            let (claims, gate) = match claimed {
                Ok(Ok(c)) => {
                    errors = 0;
                    (c.claims, c.gate)
                }
                Ok(Err(e)) => {
                    errors = errors.saturating_add(1);
                    tracing::warn!(error = %e, subscription = %self.sub.name, "forwarder claim failed");
                    (Vec::new(), Gate::Open)
                }
                Err(e) => {
                    errors = errors.saturating_add(1);
                    tracing::error!(error = %e, subscription = %self.sub.name, "forwarder claim panicked");
                    (Vec::new(), Gate::Open)
                }
            };
            // A claim that saw a registry the node has not applied yet (another node's start,
            // a change through the API): the node reads it now, and the claims go on if this
            // forwarder's subscription is unchanged (the node stops a changed one's forwarder
            // before it says it has applied the change).
            if !claims.is_empty()
                && self.stale()
                && let Some((applied, read_now)) = applied.as_mut()
            {
                read_now.notify_one();
                let seen = self.store.registry_version_seen().unwrap_or(0);
                let caught_up = applied.wait_for(|v| *v >= seen);
                let _ = tokio::time::timeout(Duration::from_secs(2), caught_up).await;
            }
            // Stopped meanwhile (its subscription changed or went) or still behind: given back
            // for the forwarder the node runs for the registry as it is now.
            if !claims.is_empty() && (*stopped.borrow() || self.stale()) {
                let refs: Vec<_> = claims.iter().map(|c| c.claim.clone()).collect();
                let store = Arc::clone(&self.store);
                let given = tokio::task::spawn_blocking(move || store.give_back(&refs, now_ms()));
                if let Ok(Err(e)) = given.await {
                    tracing::warn!(error = %e, subscription = %self.sub.name, "cannot give back a stale claim: its lease runs out");
                }
                drop(held);
                if let Some((applied, _)) = applied.as_mut() {
                    tokio::select! {
                        _ = stopped.changed() => {}
                        _ = applied.changed() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
                continue;
            }
            busy = claims.len() == held.num_permits();
            if claims.is_empty() {
                drop(held);
                let mut wait = self.options.idle_poll * 2u32.saturating_pow(errors.min(5));
                if let Gate::WaitUntil(at) = gate {
                    let until = u64::try_from(at - now_ms()).unwrap_or(0);
                    wait = wait.min(Duration::from_millis(until.max(1)));
                }
                tokio::select! {
                    _ = stopped.changed() => {}
                    _ = queued.notified(), if errors == 0 && gate == Gate::Open => {}
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            let probe = gate == Gate::Probe;
            // Shaped first, all at once (one batch for the transform's workers), so that each
            // call's lease check covers the call that follows.
            let mut claims = claims;
            let (unshaped, shaped_at) = self.shape_all(&mut claims).await;
            for (event, unshaped) in claims.into_iter().zip(unshaped) {
                // One permit per call (a claim takes at most the permits held).
                let permit = held.split(1);
                pace.wait().await;
                let me = Arc::clone(&self);
                let done = done.clone();
                tokio::spawn(async move {
                    let mut event = event;
                    let trace = me.options.traces.deliver(&event, &me.sub.name, claim_times);
                    let answer = match unshaped {
                        Some(not_delivered) => Some(not_delivered),
                        None => me.call(&mut event, trace.as_ref()).await,
                    };
                    if let Some(trace) = trace.as_ref().filter(|_| me.sub.transform.is_some()) {
                        let outcome = match &answer {
                            Some(Answer::Filtered) => "filtered",
                            Some(Answer::Unshaped(_)) => "failed",
                            _ => "shaped",
                        };
                        let kind = opentelemetry::trace::SpanKind::Internal;
                        trace.done("webhook.transform", kind, shaped_at, Some(outcome));
                    }
                    me.observe(&answer, probe).await;
                    let _ = done.send(Done {
                        event,
                        answer,
                        trace,
                    });
                    drop(permit);
                });
            }
        }
        drop(done);
        if let Err(e) = finisher.await {
            tracing::error!(error = %e, "forwarder's commits ended abnormally");
        }
    }

    fn claim(&self, limit: usize) -> StoreResult<crate::store::SubscriptionClaim> {
        self.store.claim_subscription(
            &self.worker,
            self.sub_id,
            limit,
            self.options.lease_ms,
            now_ms(),
        )
    }

    /// The call, started only while the lease covers all of it, with the event's trace
    /// context: the `webhook.call` span's when traced, else the one stored with the event.
    async fn call(
        &self,
        event: &mut Claimed,
        trace: Option<&crate::telemetry::traces::Delivery>,
    ) -> Option<Answer> {
        let now = now_ms();
        let needed = i64::try_from(self.target.timeout_ms).unwrap_or(i64::MAX) + LEASE_MARGIN_MS;
        if event.claimed_until - now < needed {
            return None;
        }
        // A broker kind signs nothing: the broker's own credentials authenticate it.
        let secrets = match &self.via {
            Via::Http(_) => match self.secrets.signing().await {
                Ok(secrets) if !secrets.is_empty() => secrets,
                Ok(_) => return Some(call::not_sent("no signing secret in the store".into())),
                Err(e) => return Some(call::not_sent(format!("cannot sign: {e:#}"))),
            },
            Via::Nats(_) | Via::Amqp(_) => Vec::new(),
        };
        let started = Instant::now();
        let body = std::mem::take(&mut event.payload);
        let step = trace.map(|t| t.step("webhook.call", opentelemetry::trace::SpanKind::Client));
        let traceparent = match &step {
            Some(step) => step.traceparent(),
            None => event.traceparent.clone(),
        };
        let answer = match &self.via {
            Via::Http(client) => {
                let given = (&*event, traceparent.as_deref());
                call::forward(client, &self.target, &secrets, given, body, now).await
            }
            Via::Nats(publisher) => {
                publisher
                    .publish((event, traceparent.as_deref()), body)
                    .await
            }
            Via::Amqp(publisher) => {
                publisher
                    .publish((event, traceparent.as_deref()), body)
                    .await
            }
        };
        self.metrics
            .observe_processing(started.elapsed().as_secs_f64());
        let result = match &answer {
            Answer::Filtered | Answer::Unshaped(_) => "not_sent",
            Answer::Delivered(_) if !matches!(self.via, Via::Http(_)) => "acked",
            Answer::Delivered(_) => "2xx",
            Answer::Gone => "410",
            Answer::Failed { result, .. } => result,
        };
        if let Some((_, counter)) = self.counters.iter().find(|(r, _)| *r == result) {
            counter.inc();
        }
        if let Some(step) = step {
            step.end(result);
        }
        Some(answer)
    }
}

/// Spacing of call starts for `rate_per_second` (0: none).
struct Pace {
    every: Option<Duration>,
    next: tokio::time::Instant,
}

impl Pace {
    fn new(rate_per_second: u32) -> Pace {
        Pace {
            every: (rate_per_second > 0).then(|| Duration::from_secs(1) / rate_per_second),
            next: tokio::time::Instant::now(),
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

    async fn wait(&mut self) {
        if let Some(every) = self.every {
            let now = tokio::time::Instant::now();
            self.next = self.next.max(now);
            tokio::time::sleep_until(self.next).await;
            self.next += every;
        }
    }
}
