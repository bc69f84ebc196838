//! Each subscription's rule for its claims: its handler, mode, budget and backoff, matched by
//! name to the store's ids.

use std::sync::Arc;

use super::{Backoff, Consumer};
use crate::domain::DeliveryMode;
use crate::handlers::Handler;
use crate::subscriptions::Subscription;

/// How the consumer treats the claims of one subscription: its handler, its mode, its budget
/// and backoff.
pub(super) struct Rule {
    handler: Arc<dyn Handler>,
    mode: DeliveryMode,
    max_attempts: u32,
    backoff: Backoff,
}

impl Consumer {
    /// Serve these subscriptions (the config's), matched by name to the store's ids: their
    /// handlers, modes, budgets and backoffs. A claim of a subscription not named here (one
    /// removed while its claim ran) falls back to the handler the implicit routing picks.
    pub fn with_subscriptions(mut self, subs: &[Subscription]) -> Consumer {
        let ids = match self.store.subscription_ids() {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the subscriptions' ids");
                Vec::new()
            }
        };
        self.rules = ids
            .into_iter()
            .filter_map(|(id, name)| {
                let sub = subs.iter().find(|s| s.name == name)?;
                Some((
                    id,
                    Rule {
                        handler: self.registry.for_subscription(sub.kind, sub.mode),
                        mode: sub.mode,
                        max_attempts: sub.max_attempts,
                        backoff: Backoff::new(sub.backoff_base_ms, sub.backoff_max_ms),
                    },
                ))
            })
            .collect();
        self
    }

    /// The handler of a claim, its mode, budget and backoff.
    pub(super) fn rule_of(
        &self,
        subscription: i64,
        source: &str,
        event_type: &str,
    ) -> (&Arc<dyn Handler>, DeliveryMode, u32, &Backoff) {
        match self.rules.get(&subscription) {
            Some(r) => (&r.handler, r.mode, r.max_attempts, &r.backoff),
            None => {
                let handler = self.registry.route(source, event_type);
                (handler, handler.mode(), self.max_attempts, &self.backoff)
            }
        }
    }
}
