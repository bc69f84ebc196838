//! When a handler or a worker fails: a lease that ran out (the sweeper settles it by the
//! handler's mode) and a handler that panicked (its event fails with the panic's message).

use super::Consumer;
use crate::domain::DeliveryMode;
use crate::domain::time::now_ms;
use crate::handlers::Handled;
use crate::store::{Claimed, ExpiredClaim, Expiry, StoreResult};

impl Consumer {
    /// Settle expired leases (see [`Store::sweep`]) by [`Consumer::expiry`].
    pub fn sweep(&self) -> StoreResult<usize> {
        // Decided by the registry's rules as they are now.
        self.refresh_rules();
        self.store.sweep(now_ms(), &|expired| self.expiry(expired))
    }

    /// What a lease that ran out means, by the handler's mode: an at-most-once handler may
    /// already have acted, so its event is failed as abandoned for ops to decide; an
    /// at-least-once one gets the event again, unless its budget is spent.
    fn expiry(&self, expired: &ExpiredClaim) -> Expiry {
        let claim = &expired.claim;
        let rule = self.rule_of(claim.subscription, &claim.source, &expired.event_type);
        let max_attempts = rule.max_attempts;
        match rule.mode {
            DeliveryMode::AtMostOnce => Expiry::Fail {
                error: "abandoned: the lease expired during an at-most-once attempt; the \
                        downstream may have acted, so it is not retried without force"
                    .into(),
                abandoned: true,
            },
            DeliveryMode::AtLeastOnce if expired.budget_used >= i64::from(max_attempts) => {
                Expiry::Fail {
                    error: "lease expired on the last attempt".into(),
                    abandoned: false,
                }
            }
            DeliveryMode::AtLeastOnce => Expiry::Retry {
                error: "lease expired".into(),
            },
        }
    }
}

/// Run a handler so that a panic fails its event with the panic's message, rather than taking
/// the worker's pass down and leaving the claim to the sweeper until its budget is spent. A
/// handler that calls out may have acted before panicking: at most once, that is `abandoned`.
pub(super) fn guarded(handler: &dyn crate::handlers::Handler, event: &Claimed) -> Handled {
    let panic =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.handle(event))) {
            Ok(handled) => return handled,
            Err(panic) => panic,
        };
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    let why = format!("handler {} panicked: {message}", handler.name());
    tracing::error!(
        source = %event.claim.source,
        event_id = %event.claim.event_id,
        "{why}"
    );
    let may_have_acted = handler.call_timeout().is_some()
        && handler.mode() == crate::domain::DeliveryMode::AtMostOnce;
    if may_have_acted {
        Handled::Abandoned(why)
    } else {
        Handled::Permanent(why)
    }
}
