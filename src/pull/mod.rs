//! Subscriptions of kind `pull` (SPEC section 13): the user's workers claim events over HTTP
//! with leases and acknowledge them, as an SQS or pgmq consumer does.
//!
//! A claim is the same claim as a forwarder's (`Store::claim_subscription`: one transaction,
//! fenced by a fresh claim token, which also fans new events out). What a client holds is a
//! token that names the claim: the event's sequence, its attempt and budget, the store's claim
//! token, and a MAC under the subscription's claims key (kept in the store, shared by every
//! node: `store::secrets`). So an ack needs no read before its fenced write, a token that was
//! never issued (or was altered) is refused before anything changes, and any node reads any
//! node's tokens. The bearer token is checked against the digests the store keeps
//! (`secrets::Live`), so a rotated one works on every node without a restart.
//!
//! Long polls wait on the same wake-up as idle workers (ingest in this process; `LISTEN` on
//! PostgreSQL), with a short poll for work that becomes due by time (retries). A claim made for
//! a client that is gone by the time it commits is given back at once.

pub mod body;
mod claim;
pub mod session;

pub use claim::claim_once;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::{Notify, watch};

use crate::domain::time::now_ms;
use crate::store::rules::Backoff;
use crate::store::{AttemptResult, ClaimRef, Claimed, Next, Outcome, Store};
use crate::subscriptions::Subscription;

/// The most events one claim returns.
pub const MAX_CLAIM: usize = 1_000;
/// Leases a client may ask for: at least a second, at most 12 hours.
pub const LEASE_MS: std::ops::RangeInclusive<i64> = 1_000..=43_200_000;
/// The longest long poll.
pub const MAX_WAIT_MS: u64 = 60_000;
/// How often a long poll looks again without being woken: work that becomes due by time (a
/// retry's backoff) wakes nobody.
const POLL: Duration = Duration::from_secs(1);
/// How often a waiting client is sent a byte of whitespace (see [`Waited::Heartbeat`]).
const HEARTBEAT: Duration = Duration::from_millis(100);

/// One `pull` subscription as its routes serve it.
pub struct Puller {
    pub id: i64,
    pub sub: Subscription,
    tokens: crate::secrets::Live,
    key: [u8; 32],
    backoff: Backoff,
    /// `webhook_inbox_pulls_total` of this subscription, by action.
    counters: Vec<(&'static str, prometheus_client::metrics::counter::Counter)>,
    /// A `listen` session's: its claims keep it alive.
    pub session: Option<session::Seen>,
    /// The worker processes its `transform` runs in (none: claims are handed out as stored).
    transforms: Option<Arc<crate::transform::Pool>>,
    transform_counters: crate::forward::shape::Counters,
}

/// The actions of `webhook_inbox_pulls_total`.
const ACTIONS: [&str; 6] = ["claimed", "done", "retry", "fail", "release", "lease_lost"];

/// What a client says of one claimed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AckOutcome {
    /// Handled: completed.
    Done,
    /// Not handled: again after the subscription's backoff (or `retry_after_ms`), until its
    /// `max_attempts`.
    Retry,
    /// Will never be handled: failed now, for ops to see and retry.
    Fail,
    /// Not started (a client shutting down): back to pending, due now, without backoff.
    Release,
}

impl AckOutcome {
    fn action(self) -> &'static str {
        match self {
            AckOutcome::Done => "done",
            AckOutcome::Retry => "retry",
            AckOutcome::Fail => "fail",
            AckOutcome::Release => "release",
        }
    }
}

/// A claim named by a client's token, as far as finishing it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub claim: ClaimRef,
    pub budget_used: i64,
}

type Mac256 = Hmac<Sha256>;

impl Puller {
    /// `None` for a subscription that is not of kind `pull`. `key` MACs its claim tokens;
    /// `tokens` checks its bearer tokens.
    pub fn new(
        id: i64,
        sub: Subscription,
        metrics: &crate::metrics::Metrics,
        key: [u8; 32],
        tokens: crate::secrets::Live,
    ) -> Option<Puller> {
        if sub.kind != crate::subscriptions::Kind::Pull {
            return None;
        }
        let counters = ACTIONS
            .iter()
            .map(|a| (*a, metrics.pull_counter(&sub.name, a)))
            .collect();
        Some(Puller {
            transforms: None,
            transform_counters: crate::forward::shape::Counters::new(metrics, &sub.name),
            id,
            backoff: Backoff::new(sub.backoff_base_ms, sub.backoff_max_ms),
            sub,
            tokens,
            key,
            counters,
            session: None,
        })
    }

    /// Its claims are shaped by its `transform` in `transforms`' workers.
    pub fn shaped_by(mut self, transforms: Arc<crate::transform::Pool>) -> Puller {
        self.transforms = Some(transforms);
        self
    }

    /// A `listen` session's routes (origin `session`): its claims keep it alive.
    pub fn as_session(mut self) -> Puller {
        self.session = Some(session::Seen::default());
        self
    }

    /// Whether `given` is one of this subscription's tokens now (the current one, or one in a
    /// rotation's grace), compared as digests in constant time.
    pub async fn authorizes(&self, given: &str) -> bool {
        self.tokens.authorizes(given).await
    }

    /// Count `n` of one action in `webhook_inbox_pulls_total`.
    pub fn count(&self, action: &str, n: usize) {
        if let Some((_, counter)) = self.counters.iter().find(|(a, _)| *a == action) {
            counter.inc_by(n as u64);
        }
    }

    fn mac(&self, seq: i64, attempt: i64, budget: i64, claim_token: &str) -> Mac256 {
        let mut mac = Mac256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(
            format!(
                "{}\0{seq}\0{attempt}\0{budget}\0{claim_token}",
                self.sub.name
            )
            .as_bytes(),
        );
        mac
    }

    /// The token a client acks `claim` with.
    pub fn token(&self, claim: &Claimed) -> String {
        let c = &claim.claim;
        let mac = self.mac(c.seq, c.attempt, claim.budget_used, &c.claim_token);
        let tag = mac.finalize().into_bytes();
        format!(
            "{}.{}.{}.{}.{}",
            c.seq,
            c.attempt,
            claim.budget_used,
            c.claim_token,
            hex::encode(&tag[..16])
        )
    }

    /// The claim a token names; `None` for a token this subscription never issued.
    pub fn held(&self, token: &str) -> Option<Held> {
        let mut parts = token.split('.');
        let seq = parts.next()?.parse().ok()?;
        let attempt = parts.next()?.parse().ok()?;
        let budget_used = parts.next()?.parse().ok()?;
        let claim_token = parts.next()?;
        let tag = hex::decode(parts.next()?).ok()?;
        if parts.next().is_some() || tag.len() != 16 {
            return None;
        }
        self.mac(seq, attempt, budget_used, claim_token)
            .verify_truncated_left(&tag)
            .ok()?;
        Some(Held {
            claim: ClaimRef {
                // Not needed to finish a claim without an effect: the fence finds the row by
                // its sequence, subscription and claim token.
                source: String::new(),
                event_id: String::new(),
                seq,
                subscription: self.id,
                claim_token: claim_token.to_string(),
                attempt,
                row: None,
            },
            budget_used,
        })
    }

    /// Where an ack leaves its event.
    pub fn next(
        &self,
        held: &Held,
        outcome: AckOutcome,
        error: Option<&str>,
        retry_after_ms: Option<i64>,
        now: i64,
    ) -> Next {
        let error = error.unwrap_or("the client gave no reason");
        match outcome {
            AckOutcome::Done => Next::Complete {
                effect: None,
                outcome: Outcome::Delivered,
            },
            AckOutcome::Release => Next::Retry {
                at: now,
                error: "released by the client before it was handled".into(),
            },
            AckOutcome::Fail => Next::Fail {
                error: format!("failed by the client: {error}"),
                result: AttemptResult::PermanentError,
                abandoned: false,
            },
            AckOutcome::Retry => self.backoff.retry_or_give_up(
                held.budget_used,
                self.sub.max_attempts,
                error.to_string(),
                retry_after_ms,
                now,
            ),
        }
    }

    /// The counter an ack's result adds to.
    pub fn acked(&self, outcome: AckOutcome, applied: bool) {
        self.count(
            if applied {
                outcome.action()
            } else {
                "lease_lost"
            },
            1,
        );
    }
}

/// How a long poll ends early: the service is shutting down.
pub type Stopping = watch::Receiver<bool>;

/// What a waiting claim yields, step by step.
pub enum Waited {
    /// Nothing yet: a byte of whitespace goes to the client, so that a client that has gone
    /// away is noticed (the write fails and the wait is dropped) before work is claimed for it.
    Heartbeat,
    /// The end of the wait: the claims (none at the end of the wait, or at shutdown).
    Claims(Vec<Claimed>),
}

/// A long poll's request, for [`wait_for_claims`].
pub struct Wait {
    pub store: Arc<dyn Store>,
    pub puller: Arc<Puller>,
    pub worker: String,
    pub max: usize,
    pub lease_ms: i64,
    pub until: tokio::time::Instant,
    pub queued: Arc<Notify>,
    pub stopping: Stopping,
}

struct WaitState {
    wait: Wait,
    /// Registered before each claim, so that work queued meanwhile wakes this poll.
    woken: Pin<Box<tokio::sync::futures::OwnedNotified>>,
    claim_next: bool,
    last_claim: tokio::time::Instant,
    done: bool,
    /// The claims of the answer just yielded, until the server has written it.
    given: Option<Given>,
}

/// Claims yielded to a long poll's client and not yet known to be written: dropped while
/// armed (the write failed and the stream was dropped), they go back at once, due now, rather
/// than wait out their leases (for an at-most-once subscription: be abandoned, never
/// delivered).
struct Given {
    store: Arc<dyn Store>,
    refs: Vec<ClaimRef>,
}

impl Drop for Given {
    fn drop(&mut self) {
        if self.refs.is_empty() {
            return;
        }
        let refs = std::mem::take(&mut self.refs);
        let store = Arc::clone(&self.store);
        tracing::info!(
            claims = refs.len(),
            "a long poll's answer could not be written: its claims go back"
        );
        let give_back = move || {
            if let Err(e) = store.release(&refs, now_ms()) {
                tracing::warn!(error = %e, "cannot give back a gone client's claims");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(give_back)),
            Err(_) => give_back(),
        }
    }
}

/// A long poll as a stream of steps, to be written to the client as they come: a heartbeat
/// at least every [`HEARTBEAT`], and a claim after each wake-up (work committed in this process
/// or, on PostgreSQL, in another), every [`POLL`] (work due by time), and at the end.
///
/// After a wake-up the stream first yields a heartbeat and claims only when polled again, that
/// is once the server has written the heartbeat: a client gone by then fails that write, the
/// stream is dropped, and nothing is claimed for it. (A handler that is not streaming is not
/// told of a disconnect at all.)
pub fn wait_for_claims(wait: Wait) -> impl futures_util::Stream<Item = Waited> {
    let woken = Box::pin(Arc::clone(&wait.queued).notified_owned());
    let state = WaitState {
        last_claim: tokio::time::Instant::now(),
        wait,
        woken,
        claim_next: false,
        done: false,
        given: None,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        if s.done {
            if let Some(mut given) = s.given.take() {
                // One turn for the server to write the answer: it writes what the stream has
                // yielded when the stream is pending, and drops the stream (and `given`, which
                // gives the claims back) if that write fails. Polled again, it was written.
                tokio::task::yield_now().await;
                given.refs.clear();
            }
            return None;
        }
        let now = tokio::time::Instant::now();
        let stopping = *s.wait.stopping.borrow();
        if stopping {
            s.done = true;
            return Some((Waited::Claims(Vec::new()), s));
        }
        let last = now >= s.wait.until;
        if s.claim_next || last || now - s.last_claim >= POLL {
            s.claim_next = false;
            s.last_claim = now;
            s.woken = Box::pin(Arc::clone(&s.wait.queued).notified_owned());
            s.woken.as_mut().enable();
            let w = &s.wait;
            match claim_once(&w.store, &w.puller, &w.worker, w.max, w.lease_ms).await {
                Ok(claims) if !claims.is_empty() || last => {
                    s.done = true;
                    // Only where a second delivery is within the contract: a stream dropped
                    // after its answer was written (a client that closes before the end of
                    // the body) cannot be told from one whose write failed, and an
                    // at-most-once subscription's claim is left to its lease instead.
                    if w.puller.sub.mode == crate::domain::DeliveryMode::AtLeastOnce {
                        s.given = Some(Given {
                            store: Arc::clone(&w.store),
                            refs: claims.iter().map(|c| c.claim.clone()).collect(),
                        });
                    }
                    return Some((Waited::Claims(claims), s));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, subscription = %w.puller.sub.name, "a waiting claim failed");
                    s.done = true;
                    return Some((Waited::Claims(Vec::new()), s));
                }
            }
        }
        let nap = HEARTBEAT.min(s.wait.until.saturating_duration_since(now));
        tokio::select! {
            _ = s.woken.as_mut() => s.claim_next = true,
            _ = tokio::time::sleep(nap) => {}
            _ = s.wait.stopping.changed() => {}
        }
        Some((Waited::Heartbeat, s))
    })
}
