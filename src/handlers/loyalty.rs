//! The loyalty credit for `order.completed`: at-least-once delivery made effectively-once.
//!
//! The event may reach this handler more than once (a lease that expired, a forced retry). Two
//! guards make the credit happen once, both in the transaction that completes the event:
//! `processed_events (consumer, source, event_id)` catches the same event again, and
//! `loyalty_credits.order_id` catches a different event describing the same order (a business
//! duplicate). The handler itself only validates and describes the effect.

use super::{Handled, Handler};
use crate::domain::DeliveryMode;
use crate::domain::OrderCredit;
use crate::domain::payload::{is_json, payload_json};
use crate::store::{Claimed, Effect, Outcome};

pub struct LoyaltyCredit;

pub const CONSUMER: &str = "loyalty_credit";

impl Handler for LoyaltyCredit {
    fn name(&self) -> &'static str {
        CONSUMER
    }

    fn mode(&self) -> DeliveryMode {
        DeliveryMode::AtLeastOnce
    }

    fn handle(&self, event: &Claimed) -> Handled {
        let content_type = event.content_type.as_deref();
        let fast = is_json(content_type)
            .then(|| OrderCredit::from_json(&event.payload))
            .flatten();
        let credit = match fast {
            Some(credit) => credit.map_err(|e| e.to_string()),
            None => payload_json(&event.payload, content_type)
                .map_err(|e| e.to_string())
                .and_then(|json| OrderCredit::parse(&json).map_err(|e| e.to_string())),
        };
        match credit {
            Ok(credit) => Handled::Complete {
                effect: Some(Effect::LoyaltyCredit {
                    consumer: CONSUMER,
                    order_id: credit.order_id().to_string(),
                    customer_id: credit.customer_id().to_string(),
                    points: credit.points(),
                }),
                // Replaced by what the store finds: credited, duplicate_order, or the earlier
                // outcome on a re-run.
                outcome: Outcome::Credited,
            },
            Err(reason) => Handled::Permanent(reason),
        }
    }
}
