//! Handlers: one file per effect, routed by source and event type.
//!
//! A handler decides what an event means; the store applies it. Effects that must happen once
//! (the loyalty credit) are returned as an [`Effect`] so that the store commits them in the
//! same transaction as the event's completion, fenced by the claim.

mod audit;
pub mod downstream;
mod loyalty;

use std::sync::Arc;
use std::time::Duration;

use crate::domain::{DeliveryMode, ORDER_COMPLETED, REQUEST_SUBMITTED, RESERVED_SOURCE};
use crate::store::{Claimed, Effect, Outcome, Store};

pub use audit::AuditLog;
pub use downstream::{
    CallFailure, DownstreamError, DownstreamSystem, HttpDownstream, SubmitRequest,
};
pub use loyalty::LoyaltyCredit;

/// What a handler made of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Complete the event, applying `effect` in the completing transaction.
    Complete {
        effect: Option<Effect>,
        outcome: Outcome,
    },
    /// Worth another attempt after backoff (a downstream timeout).
    Retryable(String),
    /// Retrying cannot help (a payload without `order_id`): failed at once.
    Permanent(String),
    /// An at-most-once call whose outcome is unknown (a timeout, a connection lost after the
    /// request was sent, a 5xx): the downstream may have acted. Failed and `abandoned`, so
    /// that only a forced retry calls it again.
    Abandoned(String),
    /// The call was not started (the claim's lease no longer covers its timeout): the claim
    /// is released, and the event is claimed again with a fresh lease.
    NotStarted(String),
}

pub trait Handler: Send + Sync {
    /// Stable name: the `processed_events.consumer` value and the metrics label.
    fn name(&self) -> &'static str;
    /// What the sweeper does when this handler's lease expires.
    fn mode(&self) -> DeliveryMode;
    /// For a handler that calls an external system, the bound on one call. Its events are in
    /// the call-out lane: claimed one at a time, each completion committed straight after its
    /// call, and the call started only while the claim's lease still covers this whole bound.
    fn call_timeout(&self) -> Option<Duration> {
        None
    }
    fn handle(&self, event: &Claimed) -> Handled;
}

/// The store, the system and the call timeout a downstream handler is built from.
type DownstreamParts = (Arc<dyn Store>, Arc<dyn DownstreamSystem>, Duration);

/// Routing table of SPEC section 4.
pub struct Registry {
    loyalty: Arc<dyn Handler>,
    audit: Arc<dyn Handler>,
    downstream: Arc<dyn Handler>,
    /// What a downstream handler of another mode is built from (a subscription's own `mode`).
    downstream_parts: Option<DownstreamParts>,
}

impl Registry {
    pub fn new(
        store: Arc<dyn Store>,
        downstream: Arc<dyn DownstreamSystem>,
        mode: DeliveryMode,
        timeout: Duration,
    ) -> Registry {
        let mut registry = Registry::from_parts(
            Arc::new(LoyaltyCredit),
            Arc::new(AuditLog),
            Arc::new(SubmitRequest::new(
                Arc::clone(&store),
                Arc::clone(&downstream),
                mode,
                timeout,
            )),
        );
        registry.downstream_parts = Some((store, downstream, timeout));
        registry
    }

    /// The routing table with other handlers in its three places (tests wrap the real ones to
    /// count calls or inject failures).
    pub fn from_parts(
        loyalty: Arc<dyn Handler>,
        audit: Arc<dyn Handler>,
        downstream: Arc<dyn Handler>,
    ) -> Registry {
        Registry {
            loyalty,
            audit,
            downstream,
            downstream_parts: None,
        }
    }

    /// The handler of a subscription: its kind's, and for a `downstream` subscription whose
    /// `mode` is not `[downstream].mode`, one of its own mode (what an outcome-unknown call
    /// becomes is the handler's decision, and the subscription's to make).
    pub fn for_subscription(
        &self,
        kind: crate::subscriptions::Kind,
        mode: DeliveryMode,
    ) -> Arc<dyn Handler> {
        match (&self.downstream_parts, kind) {
            (Some((store, system, timeout)), crate::subscriptions::Kind::Downstream)
                if mode != self.downstream.mode() =>
            {
                Arc::new(SubmitRequest::new(
                    Arc::clone(store),
                    Arc::clone(system),
                    mode,
                    *timeout,
                ))
            }
            _ => Arc::clone(self.for_kind(kind)),
        }
    }

    pub fn route(&self, source: &str, event_type: &str) -> &Arc<dyn Handler> {
        if source == RESERVED_SOURCE && event_type == REQUEST_SUBMITTED {
            &self.downstream
        } else if event_type == ORDER_COMPLETED && source != RESERVED_SOURCE {
            &self.loyalty
        } else {
            &self.audit
        }
    }

    /// The handler of a subscription kind. The kinds that reach the user's own code (`http`,
    /// `pull`) have no handler here: their events are claimed by their forwarders and clients,
    /// never by the workers that call these.
    pub fn for_kind(&self, kind: crate::subscriptions::Kind) -> &Arc<dyn Handler> {
        use crate::subscriptions::Kind;
        match kind {
            Kind::LoyaltyCredit => &self.loyalty,
            Kind::Downstream => &self.downstream,
            Kind::Audit | Kind::Http | Kind::Nats | Kind::Amqp | Kind::Pull => &self.audit,
        }
    }

    pub fn loyalty(&self) -> &Arc<dyn Handler> {
        &self.loyalty
    }

    pub fn audit(&self) -> &Arc<dyn Handler> {
        &self.audit
    }

    pub fn downstream(&self) -> &Arc<dyn Handler> {
        &self.downstream
    }

    pub fn mode(&self, source: &str, event_type: &str) -> DeliveryMode {
        self.route(source, event_type).mode()
    }
}
