//! The audit log: records that an event was received, for every type no other handler takes.
//!
//! Naturally idempotent, so it needs no guard: writing the same receipt line twice does no
//! harm (a reader sees a repeated line, nobody is paid twice). A dedup table here would cost a
//! write per event and protect nothing.

use super::{Handled, Handler};
use crate::domain::DeliveryMode;
use crate::store::{Claimed, Outcome};

pub struct AuditLog;

impl Handler for AuditLog {
    fn name(&self) -> &'static str {
        "audit_log"
    }

    fn mode(&self) -> DeliveryMode {
        DeliveryMode::AtLeastOnce
    }

    fn handle(&self, event: &Claimed) -> Handled {
        tracing::info!(
            target: "webhook_inbox::audit",
            source = %event.claim.source,
            event_id = %event.claim.event_id,
            attempt = event.claim.attempt,
            event_type = %event.event_type,
            bytes = event.payload.len(),
            "event received"
        );
        Handled::Complete {
            effect: None,
            outcome: Outcome::Logged,
        }
    }
}
