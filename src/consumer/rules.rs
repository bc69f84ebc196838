//! Each subscription's rule for its claims: its handler, mode, budget and backoff, as the
//! registry in the store holds them (SPEC section 13, "One registry"): every node decides by
//! the subscription's own rules, whatever its own config names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Consumer;
use crate::domain::DeliveryMode;
use crate::handlers::Handler;
use crate::store::rules::Backoff;
use crate::subscriptions::Subscription;

/// How the consumer treats the claims of one subscription: its handler, its mode, its budget
/// and backoff.
pub(super) struct Rule {
    /// The subscription's name (its handler's, for one the registry no longer holds).
    pub name: String,
    pub handler: Arc<dyn Handler>,
    pub mode: DeliveryMode,
    pub max_attempts: u32,
    pub backoff: Backoff,
}

impl Consumer {
    /// Read the rules from the registry now (the subscriptions, whichever node's config or
    /// the API made them). The subscriptions given are applied to the store already
    /// (`Store::sync_subscriptions`): their rules are the registry's.
    pub fn with_subscriptions(self, _subs: &[Subscription]) -> Consumer {
        self.refresh_rules();
        self
    }

    /// Read every live subscription's rule again from the registry (at each sweep, and when a
    /// claim names a subscription not seen yet).
    pub(super) fn refresh_rules(&self) {
        let live = match self.store.registry() {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the subscriptions' rules");
                return;
            }
        };
        if let Some(version) = self.store.registry_version_seen() {
            self.rules_version.store(version, Ordering::Relaxed);
        }
        let rules: HashMap<i64, Arc<Rule>> = live
            .into_iter()
            .map(|l| {
                let rule = Rule {
                    name: l.name.clone(),
                    handler: self.registry.for_subscription(l.kind, l.rules.mode),
                    mode: l.rules.mode,
                    max_attempts: l.rules.max_attempts,
                    backoff: Backoff::new(l.rules.backoff_base_ms, l.rules.backoff_max_ms),
                };
                (l.id, Arc::new(rule))
            })
            .collect();
        *self.rules.write() = rules;
    }

    /// Read the rules again if the store's view of the registry moved since they were read
    /// (no read of the database: the store's own claim checked its view).
    pub(super) fn rules_current(&self) {
        if self.store.registry_version_seen() != Some(self.rules_version.load(Ordering::Relaxed)) {
            self.refresh_rules();
        }
    }

    /// The rule of a claim's subscription, from the registry. One the registry no longer
    /// holds was removed while its claim ran: removing it finished its states and cleared
    /// their claims, so whatever is decided here is fenced out; it is decided as at-most-once
    /// all the same (nothing runs twice on a guess).
    pub(super) fn rule_of(&self, subscription: i64, source: &str, event_type: &str) -> Arc<Rule> {
        let known = self.rules.read().get(&subscription).cloned();
        if let Some(rule) = known {
            return rule;
        }
        self.refresh_rules();
        let known = self.rules.read().get(&subscription).cloned();
        if let Some(rule) = known {
            return rule;
        }
        tracing::warn!(
            subscription,
            "a claim of a subscription the registry does not hold (removed): at-most-once"
        );
        let handler = Arc::clone(self.registry.route(source, event_type));
        Arc::new(Rule {
            name: handler.name().to_string(),
            handler,
            mode: DeliveryMode::AtMostOnce,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
        })
    }
}
