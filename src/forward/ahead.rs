//! Events claimed ahead of their calls: a forwarder keeps up to a batch of claimed events not
//! started yet, so that a place freed by an answer starts the next call at once instead of
//! waiting for a claim's write (and its fsync) to come back. At `concurrency` 64 against a
//! fast endpoint a call lasts about as long as a claim's write, and without a queue half of the
//! places stood empty (docs/performance.md, "Delivery out of the node").
//!
//! With a transform, a claimed batch is shaped ahead too: its runs go to the transform pool at
//! once and the batch waits here ([`Shaping`]) while the loop goes on committing answers and
//! starting calls, so that the pool's round trip is not what a freed place waits for (it was:
//! the loop awaited each batch's runs, and the places its calls freed meanwhile stood empty).
//! A batch shaped ahead is queued like any other, and its events counted in the same room.
//!
//! A queued event, shaped or not, is no attempt yet: whatever stops the calls (the breaker
//! opening, a 410 or the API pausing the subscription, a change or removal of the
//! subscription, the forwarder stopping, a lease that no longer covers a call) gives it back
//! untried, its budget whole; a batch still being shaped goes back the same way, its runs'
//! outcomes dropped. What happens elsewhere (a pause through the API, another node's breaker)
//! is seen by the next claim's gate, at most a round later. A forwarder's transform is the one
//! of the registry's version its node made it for, and a claim that saw a later version is
//! given back before it is shaped (`Forwarder::given_back`); one that comes later is seen
//! before any queued call starts. Ordering per key is the claim's: it never hands out an event
//! while an earlier one of its key is unfinished, and a queued event is unfinished.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use tokio::sync::mpsc;

use super::call::Answer;
use super::shape::{self, Shaped};
use super::{Done, Forwarder, Untried};
use crate::store::{Claimed, Gate};
use crate::transform::Ran;

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

/// A claimed batch whose runs are in the transform pool.
pub(super) struct Shaping {
    events: Vec<Claimed>,
    probe: bool,
    claimed_at: (SystemTime, SystemTime),
    started: SystemTime,
    ran: Pin<Box<dyn Future<Output = Vec<Ran>> + Send>>,
}

/// The queue (a batch's events in claim order, batches as their shaping ends), and the
/// batches being shaped.
pub(super) struct Ahead {
    queued: VecDeque<Queued>,
    /// Usually one; a second when a claim came back while the first was in the pool.
    shaping: Vec<Shaping>,
    /// How many events it may hold beyond the calls in flight.
    pub room: usize,
}

impl Ahead {
    pub fn new(room: usize) -> Ahead {
        Ahead {
            queued: VecDeque::with_capacity(room),
            shaping: Vec::new(),
            room,
        }
    }

    /// The events held, shaped or not.
    pub fn len(&self) -> usize {
        self.queued.len() + self.shaping.iter().map(|s| s.events.len()).sum::<usize>()
    }

    /// Whether an event is ready for a call.
    pub fn ready(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Whether a batch is being shaped.
    pub fn shaping(&self) -> bool {
        !self.shaping.is_empty()
    }

    pub fn pop(&mut self) -> Option<Queued> {
        self.queued.pop_front()
    }

    /// Everything held, to be given back (the runs of a batch being shaped are dropped).
    pub fn untried(&mut self) -> Vec<Untried> {
        let shaping = self.shaping.drain(..).flat_map(Shaping::untried);
        self.queued
            .drain(..)
            .map(Queued::untried)
            .chain(shaping)
            .collect()
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
                let (probes, shaping): (Vec<_>, Vec<_>) =
                    self.shaping.drain(..).partition(|s| s.probe);
                self.shaping = probes;
                let shaping = shaping.into_iter().flat_map(Shaping::untried);
                before
                    .into_iter()
                    .map(Queued::untried)
                    .chain(shaping)
                    .collect()
            }
            Gate::Open | Gate::Probe => Vec::new(),
        }
    }

    /// Queue the first batch whose runs are done (in claim order within it), each event with
    /// what its run made of it: ready once one is.
    pub fn poll_shaped(&mut self, cx: &mut Context<'_>, counters: &shape::Counters) -> Poll<()> {
        let done =
            self.shaping
                .iter_mut()
                .enumerate()
                .find_map(|(i, s)| match s.ran.as_mut().poll(cx) {
                    Poll::Ready(ran) => Some((i, ran)),
                    Poll::Pending => None,
                });
        let Some((i, ran)) = done else {
            return Poll::Pending;
        };
        let mut batch = self.shaping.swap_remove(i);
        let shaped = shape::apply(&mut batch.events, ran, counters);
        let shaped_at = (batch.started, SystemTime::now());
        for (event, shaped) in batch.events.into_iter().zip(shaped) {
            let unshaped = match shaped {
                Shaped::Deliver => None,
                Shaped::Filtered => Some(Answer::Filtered),
                Shaped::Failed(message) => Some(Answer::Unshaped(message)),
            };
            self.queued.push_back(Queued {
                event,
                unshaped,
                probe: batch.probe,
                claimed_at: batch.claimed_at,
                shaped_at,
            });
        }
        Poll::Ready(())
    }
}

impl Shaping {
    fn untried(self) -> impl Iterator<Item = Untried> {
        let probe = self.probe;
        self.events.into_iter().map(move |e| (e.claim, probe))
    }
}

impl Queued {
    pub fn untried(self) -> Untried {
        (self.event.claim, self.probe)
    }
}

impl Forwarder {
    /// Queue a claim's events: at once without a transform; else their runs go to the pool
    /// now, and the batch waits in `ahead` until they are done ([`Ahead::poll_shaped`]).
    pub(super) fn shape_ahead(
        &self,
        ahead: &mut Ahead,
        events: Vec<Claimed>,
        probe: bool,
        claimed_at: (SystemTime, SystemTime),
    ) {
        let started = SystemTime::now();
        let Some(transform) = self.sub.transform.as_ref() else {
            ahead.queued.extend(events.into_iter().map(|event| Queued {
                event,
                unshaped: None,
                probe,
                claimed_at,
                shaped_at: (started, started),
            }));
            return;
        };
        let bodies = events.iter().map(|e| &e.payload[..]);
        let ran = self.options.transforms.submit(transform, bodies);
        ahead.shaping.push(Shaping {
            events,
            probe,
            claimed_at,
            started,
            ran: Box::pin(ran),
        });
    }

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

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};
    use std::time::SystemTime;

    use super::{Ahead, Shaping};
    use crate::store::{ClaimRef, Claimed, Gate};
    use crate::transform::Ran;

    fn claimed(id: &str) -> Claimed {
        Claimed {
            claim: ClaimRef {
                source: "shop".into(),
                event_id: id.into(),
                seq: 1,
                subscription: 1,
                claim_token: format!("t-{id}"),
                attempt: 1,
                row: None,
            },
            event_type: "order.completed".into(),
            payload: b"{}".to_vec(),
            content_type: None,
            received_at: 0,
            budget_used: 1,
            claimed_until: i64::MAX,
            traceparent: None,
            probe: false,
        }
    }

    /// A batch whose runs never end (`ran`: `None`) or are done with `ran`.
    fn shaping(ids: &[&str], probe: bool, ran: Option<Vec<Ran>>) -> Shaping {
        let at = SystemTime::now();
        Shaping {
            events: ids.iter().map(|id| claimed(id)).collect(),
            probe,
            claimed_at: (at, at),
            started: at,
            ran: match ran {
                Some(ran) => Box::pin(std::future::ready(ran)),
                None => Box::pin(std::future::pending()),
            },
        }
    }

    fn ids(untried: Vec<super::Untried>) -> Vec<String> {
        let mut ids: Vec<String> = untried.into_iter().map(|(c, _)| c.event_id).collect();
        ids.sort();
        ids
    }

    /// A batch being shaped is held as the queue is: counted in its room, and given back
    /// untried by whatever gives the queue back (an open breaker keeps a probe's batch).
    #[test]
    fn a_batch_being_shaped_goes_back_with_the_queue() {
        let mut ahead = Ahead::new(64);
        ahead.shaping.push(shaping(&["a", "b"], false, None));
        ahead.shaping.push(shaping(&["p"], true, None));
        assert_eq!(ahead.len(), 3);
        assert!(!ahead.ready() && ahead.shaping());
        assert!(ahead.closed_by(Gate::Open).is_empty());
        assert_eq!(ids(ahead.closed_by(Gate::WaitUntil(0))), ["a", "b"]);
        assert_eq!(ahead.len(), 1, "the probe's batch stays");
        assert_eq!(ids(ahead.closed_by(Gate::Shut)), ["p"]);
        assert_eq!(ahead.len(), 0);

        ahead.shaping.push(shaping(&["c"], false, None));
        ahead.shaping.push(shaping(&["d", "e"], false, None));
        assert_eq!(ids(ahead.untried()), ["c", "d", "e"]);
        assert!(!ahead.shaping());
    }

    /// A batch whose runs are done is queued with each run's outcome: one output to deliver
    /// (the payload replaced), none `filtered`, an error failed with its message.
    #[test]
    fn a_shaped_batch_is_queued_with_each_outcome() {
        let metrics = crate::metrics::Metrics::new();
        let counters = crate::forward::shape::Counters::new(&metrics, "billing");
        let mut ahead = Ahead::new(64);
        ahead.shaping.push(shaping(&["x"], false, None));
        let ran = vec![
            Ran::One(b"{\"v\":1}".to_vec()),
            Ran::Nothing,
            Ran::Failed("no".into()),
        ];
        ahead
            .shaping
            .push(shaping(&["a", "b", "c"], false, Some(ran)));
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(ahead.poll_shaped(&mut cx, &counters), Poll::Ready(()));
        assert_eq!(ahead.poll_shaped(&mut cx, &counters), Poll::Pending);
        assert_eq!(ahead.len(), 4, "the batch still in the pool is held");
        let queued: Vec<_> = std::iter::from_fn(|| ahead.pop()).collect();
        let got: Vec<_> = queued
            .iter()
            .map(|q| (q.event.claim.event_id.as_str(), q.unshaped.clone()))
            .collect();
        use super::Answer;
        assert_eq!(
            got,
            [
                ("a", None),
                ("b", Some(Answer::Filtered)),
                ("c", Some(Answer::Unshaped("no".into())))
            ]
        );
        assert_eq!(queued[0].event.payload, b"{\"v\":1}");
        assert_eq!(
            queued[0].event.content_type.as_deref(),
            Some("application/json")
        );
    }
}
