//! What a delivery does with a transform's outcome: the one step every delivering kind shares
//! (the forwarder's `http`, `nats` and `amqp`, and any kind it serves; a pull claim), so that a
//! new kind gets it by being one of them. The pull routes read it from here: `transform` below
//! runs programs and knows no claim.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;

use crate::domain::time::now_ms;
use crate::store::{AttemptResult, Claimed, Finish, Next, Outcome, Store, StoreResult};
use crate::transform::{Pool, Ran, Transform};

/// What becomes of a claimed event once its subscription's transform ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shaped {
    /// Deliver it: its payload is now the output (or as stored, without a transform).
    Deliver,
    /// No output: completed with outcome `filtered`, nothing delivered.
    Filtered,
    /// Failed permanently with this message (ops fix the program, then retry).
    Failed(String),
}

impl Shaped {
    /// The state it leaves, when it is not delivered.
    pub fn next(&self) -> Option<Next> {
        match self {
            Shaped::Deliver => None,
            Shaped::Filtered => Some(filtered()),
            Shaped::Failed(message) => Some(failed(message)),
        }
    }
}

/// The state of an event its transform gave no output for: completed, and the history says why.
pub fn filtered() -> Next {
    Next::Complete {
        effect: None,
        outcome: Outcome::Filtered,
    }
}

/// The state of an event its transform failed on: failed at once, whatever the budget left (the
/// same program fails the same way on the same body), with the program's message.
pub fn failed(message: &str) -> Next {
    Next::Fail {
        error: format!("transform: {message}"),
        result: AttemptResult::PermanentError,
        abandoned: false,
    }
}

/// `webhook_inbox_transform_failures_total` and `webhook_inbox_transform_filtered_total` of
/// one subscription.
#[derive(Clone)]
pub struct Counters {
    failures: Counter,
    filtered: Counter,
}

impl Counters {
    pub fn new(metrics: &crate::metrics::Metrics, subscription: &str) -> Counters {
        Counters {
            failures: metrics.transform_counter(subscription, true),
            filtered: metrics.transform_counter(subscription, false),
        }
    }
}

/// Run `transform` (if any) on each claimed event, as one batch of the pool: what becomes of
/// each, in order; the payload of each to deliver is now its output, JSON.
pub async fn shape_all(
    pool: &Pool,
    transform: Option<&Transform>,
    events: &mut [Claimed],
    counters: &Counters,
) -> Vec<Shaped> {
    let Some(transform) = transform else {
        return vec![Shaped::Deliver; events.len()];
    };
    let ran = pool
        .submit(transform, events.iter().map(|e| &e.payload[..]))
        .await;
    apply(events, ran, counters)
}

/// What the runs of a batch (`ran`, in the order of `events`) make of each event; the payload
/// of each to deliver is now its output, JSON.
pub fn apply(events: &mut [Claimed], ran: Vec<Ran>, counters: &Counters) -> Vec<Shaped> {
    events
        .iter_mut()
        .zip(ran)
        .map(|(event, ran)| match ran {
            Ran::One(output) => {
                event.payload = output;
                event.content_type = Some("application/json".into());
                Shaped::Deliver
            }
            Ran::Nothing => {
                counters.filtered.inc();
                Shaped::Filtered
            }
            Ran::Failed(message) => {
                counters.failures.inc();
                Shaped::Failed(message)
            }
        })
        .collect()
}

/// A pull claim's events, shaped: those to hand out, with their outputs. The others are
/// finished here (fenced by their claims, as an ack is): never handed out.
pub async fn shape_claims(
    pool: &Pool,
    store: &Arc<dyn Store>,
    transform: Option<&Transform>,
    counters: &Counters,
    mut claims: Vec<Claimed>,
) -> StoreResult<Vec<Claimed>> {
    if transform.is_none() {
        return Ok(claims);
    }
    let shaped = shape_all(pool, transform, &mut claims, counters).await;
    let mut kept = Vec::with_capacity(shaped.len());
    let mut finished = Vec::new();
    for (claim, shaped) in claims.into_iter().zip(shaped) {
        match shaped.next() {
            None => kept.push(claim),
            Some(next) => finished.push(Finish {
                claim: claim.claim,
                next,
            }),
        }
    }
    if !finished.is_empty() {
        let store = Arc::clone(store);
        tokio::task::spawn_blocking(move || store.finish(&finished, now_ms()))
            .await
            .map_err(|e| {
                crate::store::StoreError::Internal(anyhow::anyhow!("finishing claims: {e}"))
            })??;
    }
    Ok(kept)
}
