//! Events claimed ahead of their calls: a forwarder keeps up to a batch of claimed events not
//! started yet, so that a place freed by an answer starts the next call at once instead of
//! waiting for a claim's write (and its fsync) to come back. At `concurrency` 64 against a
//! fast endpoint a call lasts about as long as a claim's write, and without a queue half of the
//! places stood empty (docs/performance.md, "Delivery out of the node").
//!
//! A queued event is no attempt yet: whatever stops the calls (the breaker opening, a 410 or
//! the API pausing the subscription, a change or removal of the subscription, the forwarder
//! stopping, a lease that no longer covers a call) gives it back untried, its budget whole.
//! What happens elsewhere (a pause through the API, another node's breaker) is seen by the next
//! claim's gate, at most a round later. Ordering per
//! key is the claim's: it never hands out an event while an earlier one of its key is
//! unfinished, and a queued event is unfinished.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::mpsc;

use super::call::Answer;
use super::{Done, Forwarder, Untried};
use crate::store::{Claimed, Gate};

/// An event claimed and shaped, its call not started.
pub(super) struct Queued {
    pub event: Claimed,
    /// `Some`: not to be called (filtered out, or its transform failed).
    pub unshaped: Option<Answer>,
    /// Its claim was the breaker's probe.
    pub probe: bool,
    /// When its claim's write ran, and its batch's transform (for the traces).
    pub claimed_at: (SystemTime, SystemTime),
    pub shaped_at: (SystemTime, SystemTime),
}

/// The queue, oldest claim first.
pub(super) struct Ahead {
    queued: VecDeque<Queued>,
    /// How many events it may hold beyond the calls in flight.
    pub room: usize,
}

impl Ahead {
    pub fn new(room: usize) -> Ahead {
        Ahead {
            queued: VecDeque::with_capacity(room),
            room,
        }
    }

    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    pub fn push(&mut self, queued: Queued) {
        self.queued.push_back(queued);
    }

    pub fn pop(&mut self) -> Option<Queued> {
        self.queued.pop_front()
    }

    /// Everything queued, to be given back.
    pub fn untried(&mut self) -> Vec<Untried> {
        self.queued.drain(..).map(Queued::untried).collect()
    }

    /// What a claim's gate says must go back: everything when the subscription was paused or
    /// removed (through the API, or on another node); when the breaker is open, what was
    /// claimed before it opened (another node's run of failures), but not a probe, whose own
    /// claim moved the next probe on.
    pub fn closed_by(&mut self, gate: Gate) -> Vec<Untried> {
        match gate {
            Gate::Shut => self.untried(),
            Gate::WaitUntil(_) => {
                let (probes, before): (VecDeque<_>, VecDeque<_>) =
                    self.queued.drain(..).partition(|q| q.probe);
                self.queued = probes;
                before.into_iter().map(Queued::untried).collect()
            }
            Gate::Open | Gate::Probe => Vec::new(),
        }
    }
}

impl Queued {
    pub fn untried(self) -> Untried {
        (self.event.claim, self.probe)
    }
}

impl Forwarder {
    /// Start `queued`'s call as a task (after `start`, with a rate); its answer comes back
    /// through `done`.
    pub(super) fn spawn_call(
        self: &Arc<Self>,
        queued: Queued,
        start: Option<tokio::time::Instant>,
        done: &mpsc::UnboundedSender<Done>,
    ) {
        let me = Arc::clone(self);
        let done = done.clone();
        tokio::spawn(async move {
            if let Some(start) = start {
                tokio::time::sleep_until(start).await;
            }
            let Queued {
                mut event,
                unshaped,
                probe,
                claimed_at,
                shaped_at,
            } = queued;
            let trace = me.options.traces.deliver(&event, &me.sub.name, claimed_at);
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
            let halted = me.observe(&answer, probe).await;
            let _ = done.send(Done {
                event,
                answer,
                trace,
                halted,
            });
        });
    }
}
