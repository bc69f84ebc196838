//! The values of claiming and finishing: which work a claim takes, what it hands a worker, and
//! where a finished attempt leaves its event. Times are unix milliseconds.

use super::{AttemptResult, Outcome};

/// Which consumer workers a claim is for. Handlers that call an external system have their own
/// lane: claimed one at a time by their own bounded set of workers, so that a claim's lease
/// covers the one call it leads to, and a slow downstream holds back no in-process effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Effects inside the database (the loyalty credit, the audit log): claimed in batches.
    InProcess,
    /// A call to an external system (the downstream submission): claimed one at a time.
    CallOut,
}

/// Whose due work a claim takes: a lane's workers', or one subscription's (the forwarder of an
/// `http` subscription).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimFor {
    Lane(Lane),
    Subscription(i64),
}

/// What [`crate::store::Store::claim_subscription`] found.
#[derive(Debug)]
pub struct SubscriptionClaim {
    pub claims: Vec<Claimed>,
    pub gate: Gate,
}

/// Whether a subscription's claims flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Claims up to the limit.
    Open,
    /// Paused or removed: nothing is claimed.
    Shut,
    /// The circuit breaker is open: nothing is claimed before this time (unix ms).
    WaitUntil(i64),
    /// The breaker is open and a probe was due: at most one event was claimed.
    Probe,
}

impl Gate {
    /// A subscription's gate, from its row (`None`: no such subscription).
    pub fn of(row: Option<(bool, bool, Option<i64>)>, now: i64) -> Gate {
        match row {
            None | Some((true, _, _)) | Some((_, true, _)) => Gate::Shut,
            Some((_, _, None)) => Gate::Open,
            Some((_, _, Some(at))) if at > now => Gate::WaitUntil(at),
            Some(_) => Gate::Probe,
        }
    }

    /// How many events a claim behind this gate may take: `limit`, one for a probe, or none
    /// (`None`: claim nothing).
    pub fn limit(self, limit: usize) -> Option<usize> {
        match self {
            Gate::Open => Some(limit),
            Gate::Probe => Some(1),
            Gate::Shut | Gate::WaitUntil(_) => None,
        }
    }
}

impl Lane {
    /// The subscriptions a lane's workers claim for: in batches, or one at a time.
    pub fn claimer(self) -> crate::subscriptions::Claimer {
        match self {
            Lane::InProcess => crate::subscriptions::Claimer::Batch,
            Lane::CallOut => crate::subscriptions::Claimer::OneAtATime,
        }
    }
}

/// The key and fence of one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub source: String,
    pub event_id: String,
    /// The event's store sequence: later transitions find the row by it (recent events' rows
    /// are adjacent and cached, unlike lookups by the random event id).
    pub seq: i64,
    /// The store's id of the subscription the claim is for (see `Store::subscription_ids`).
    pub subscription: i64,
    pub claim_token: String,
    pub attempt: i64,
    /// Where the store's claim found the state row, when the store has a locator cheaper than
    /// `(seq, subscription)`: SQLite's rowid, which its finish seeks instead of the key's index
    /// (the fence still checks `seq`, subscription and token, so a stale one only misses).
    /// `None` for PostgreSQL, a pull client's ack and a sweep.
    pub row: Option<i64>,
}

/// An event handed to a worker by [`Store::claim`](super::Store::claim).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub claim: ClaimRef,
    pub event_type: String,
    pub payload: Vec<u8>,
    pub content_type: Option<String>,
    /// When the event was first received (unix ms).
    pub received_at: i64,
    /// Claims used since the last fresh budget, this one included.
    pub budget_used: i64,
    pub claimed_until: i64,
    /// The trace context stored with the event at ingest (see `NewDelivery::traceparent`).
    pub traceparent: Option<String>,
    /// The claim is its subscription's circuit-breaker probe (its breaker was open and a probe
    /// was due): its answer closes the breaker or opens it again for longer. Set by a
    /// one-at-a-time claim; a forwarder's claim says it by its gate (`Gate::Probe`).
    pub probe: bool,
}

/// A claim whose lease has run out, as the sweeper finds it.
#[derive(Debug, Clone)]
pub struct ExpiredClaim {
    pub claim: ClaimRef,
    pub event_type: String,
    /// Claims used since the last fresh budget, the expired one included.
    pub budget_used: i64,
}

/// What becomes of an expired claim: decided above the store (by the handler's mode and the
/// retry budget), applied by it with a transition fenced by the claim token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expiry {
    /// Back to pending, due now.
    Retry { error: String },
    /// Failed; `abandoned` when the handler may have acted (at-most-once).
    Fail { error: String, abandoned: bool },
}

/// A business effect that must commit together with the event's completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Guarded by `processed_events` (consumer, source, event_id) and by `loyalty_credits`
    /// keyed on `order_id`.
    LoyaltyCredit {
        consumer: &'static str,
        order_id: String,
        customer_id: String,
        points: i64,
    },
}

/// Where a finished attempt leaves its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Apply the effect (if any) and complete. Without an effect, `outcome` is final.
    Complete {
        effect: Option<Effect>,
        outcome: Outcome,
    },
    /// Back to pending, due at `at`.
    Retry { at: i64, error: String },
    /// Terminal failure. `abandoned`: an at-most-once call whose outcome is unknown (the
    /// downstream may have acted), so that only a forced retry runs it again.
    Fail {
        error: String,
        result: AttemptResult,
        abandoned: bool,
    },
}

/// What [`Store::finish`](super::Store::finish) did with one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The fence held no row: the lease ran out or another worker owns the event. Nothing
    /// changed, the effect included.
    LeaseLost,
    Completed {
        outcome: Outcome,
        result: AttemptResult,
    },
    Retrying,
    Failed,
}

#[derive(Debug, Clone)]
pub struct Finish {
    pub claim: ClaimRef,
    pub next: Next,
}
