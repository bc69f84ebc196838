//! Subscriptions of kind `http` (SPEC section 13): each matching event is POSTed to the user's
//! endpoint, signed as a Standard Webhooks sender signs, until a 2xx. Kinds `nats` and `amqp`
//! are the same forwarder with a publish to a JetStream subject or a RabbitMQ exchange instead
//! of the POST ([`Via`]): claims, breaker, retries, pause, ordering and commits are shared.
//!
//! One forwarder per subscription and node, on a thread of its own ([`run`]). It claims due
//! events of its subscription in batches (one statement; the claim also fans new events out),
//! up to a batch ahead of its calls ([`ahead`]), starts each call as a task, with at most
//! `concurrency` in flight, and commits the answers in batches, in the same transaction as the
//! next claim: under load, one write covers many calls. Each call starts only while its
//! claim's lease covers its whole timeout, and its completion is fenced by the claim: a call
//! that outlived its lease changes nothing (the event is forwarded again, and the receiver's
//! dedup on `webhook-id` makes that safe; an at-most-once subscription abandons it instead).
//!
//! The circuit breaker lives in the database, so that every node and a restart see it: after
//! a run of failed calls the subscription claims nothing until its next probe, one event,
//! whose success closes it (see `Store::claim_subscription`).

mod ahead;
mod amqp;
mod answers;
pub mod call;
mod client;
mod nats;
mod proxied;
mod run;
pub mod shape;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use crate::domain::time::now_ms;
use crate::metrics::Metrics;
use crate::store::rules::Backoff;
use crate::store::{ClaimRef, Claimed, Store};
use crate::subscriptions::{HttpSettings, HttpTarget, Subscription};
use call::Answer;

/// Failed calls in a row that open the breaker.
pub const FAILURES_TO_OPEN: u32 = 5;

/// A call starts only while its lease has at least this much left beyond the call's timeout.
const LEASE_MARGIN_MS: i64 = 1_000;

/// The most answers committed in one transaction.
const MAX_FINISH_BATCH: usize = 512;

/// How the forwarders of one node run.
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
    Http(client::Endpoint),
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
    /// Its settings as the registry's row holds them: the breaker moves only while the row
    /// still says these (an answer from the target a change replaced says nothing of the new).
    settings: HttpSettings,
    /// The secrets it signs with, from the store (a rotation is seen without a restart).
    secrets: crate::secrets::Live,
    via: Via,
    backoff: Backoff,
    options: ForwardOptions,
    worker: String,
    /// Failed calls in a row on this node (any success resets it).
    failures: AtomicU32,
    /// Breaker or pause writes under way (a call's answer opened the breaker, or a 410): no
    /// queued call starts and nothing is claimed until the loop has seen their answers.
    halting: AtomicUsize,
    /// `webhook_inbox_forwards_total` of this subscription, by result.
    counters: Vec<(&'static str, prometheus_client::metrics::counter::Counter)>,
    transform_counters: shape::Counters,
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
    /// Its answer opened the breaker or paused the subscription (written already): the
    /// events claimed ahead go back.
    halted: bool,
}

/// A claim given back untried, and whether it was the breaker's probe.
type Untried = (ClaimRef, bool);

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
            _ => Via::Http(client::Endpoint::new(&target)?),
        };
        let counters = RESULTS
            .iter()
            .map(|r| (*r, metrics.forward_counter(&sub.name, r)))
            .collect();
        Ok(Forwarder {
            counters,
            transform_counters: shape::Counters::new(&metrics, &sub.name),
            backoff: Backoff::new(sub.backoff_base_ms, sub.backoff_max_ms),
            worker: format!("{}-{}", options.name, sub.name),
            store,
            metrics,
            sub_id,
            sub,
            settings: HttpSettings::of(&target),
            target,
            secrets,
            via,
            options,
            failures: AtomicU32::new(0),
            halting: AtomicUsize::new(0),
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

    /// Give back claims that saw a registry the node has not applied yet (another node's
    /// start, a change through the API), or that came once the forwarder was told to stop:
    /// `true` when they were given back. The node reads the registry now, and the claims go on
    /// if this forwarder's subscription is unchanged (the node stops a changed one's forwarder
    /// before it says it has applied the change); otherwise they are for the forwarder the
    /// node runs for the registry as it is now.
    async fn given_back(
        &self,
        claims: impl FnOnce() -> Vec<Untried>,
        applied: &mut Option<(watch::Receiver<i64>, Arc<Notify>)>,
        stopped: &watch::Receiver<bool>,
    ) -> bool {
        if self.stale()
            && let Some((applied, read_now)) = applied.as_mut()
        {
            read_now.notify_one();
            let seen = self.store.registry_version_seen().unwrap_or(0);
            let caught_up = applied.wait_for(|v| *v >= seen);
            let _ = tokio::time::timeout(Duration::from_secs(2), caught_up).await;
        }
        if !*stopped.borrow() && !self.stale() {
            return false;
        }
        self.give_back(claims()).await;
        if let Some((applied, _)) = applied.as_mut() {
            let mut stopped = stopped.clone();
            tokio::select! {
                _ = stopped.changed() => {}
                _ = applied.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        true
    }

    /// Give claims back untried: pending, due now, no attempt counted. A probe given back
    /// makes the next probe due now, not a lease after its claim.
    async fn give_back(&self, claims: Vec<Untried>) {
        if claims.is_empty() {
            return;
        }
        let store = Arc::clone(&self.store);
        let given = tokio::task::spawn_blocking(move || {
            let now = now_ms();
            let (probes, plain): (Vec<_>, Vec<_>) = claims.into_iter().partition(|c| c.1);
            let plain: Vec<ClaimRef> = plain.into_iter().map(|c| c.0).collect();
            if !plain.is_empty() {
                store.give_back(&plain, now)?;
            }
            for (probe, _) in probes {
                store.give_back_probe(&probe, now)?;
            }
            Ok::<_, crate::store::StoreError>(())
        });
        match given.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, subscription = %self.sub.name, "cannot give claims back: their leases run out")
            }
            Err(e) => tracing::error!(error = %e, "giving claims back panicked"),
        }
    }

    /// Whether the claim's lease still covers a whole call started now.
    fn covers(&self, event: &Claimed) -> bool {
        let needed = i64::try_from(self.target.timeout_ms).unwrap_or(i64::MAX) + LEASE_MARGIN_MS;
        event.claimed_until - now_ms() >= needed
    }

    /// The call, started only while the lease covers all of it, with the event's trace
    /// context: the `webhook.call` span's when traced, else the one stored with the event.
    async fn call(
        &self,
        event: &mut Claimed,
        trace: Option<&crate::telemetry::traces::Delivery>,
    ) -> Option<Answer> {
        if !self.covers(event) {
            return None;
        }
        let now = now_ms();
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
            Via::Http(endpoint) => {
                let given = (&*event, traceparent.as_deref());
                call::forward(endpoint, &secrets, given, body, now).await
            }
            // Boxed: the brokers' clients' futures are kilobytes, and every call's task would
            // be as large as the largest (and copied as often as it moves).
            Via::Nats(publisher) => {
                Box::pin(publisher.publish((event, traceparent.as_deref()), body)).await
            }
            Via::Amqp(publisher) => {
                Box::pin(publisher.publish((event, traceparent.as_deref()), body)).await
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
