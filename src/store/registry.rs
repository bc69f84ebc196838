//! The registry of subscriptions that every node shares (SPEC section 13, "One registry"):
//! what both stores write when a node's config is applied, and the nodes' records.
//!
//! A node's config is the desired state of the subscriptions it names. At start a node records
//! those names (with a heartbeat, [`HEARTBEAT`]), then applies its config: the subscriptions it
//! names are written as it says, and a subscription that came from a config is removed only
//! when no live node's config names it (the node restarted without it was the last one), never
//! one that the API or a session made. Every change moves the registry's version on; a node's
//! cached view is checked against it in each claim, so a node never fans out or decides with a
//! stale view.

use std::time::Duration;

/// How often a serving node says it is alive (and removes the subscriptions that no live
/// node's config names any more: a node that stopped or crashed was the last one).
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// A node not seen for this long is gone: its config no longer keeps subscriptions alive.
/// Twelve heartbeats: a database that stalls for a while (a failover) does not make every
/// node look gone. The PostgreSQL store compares it with the database's own clock.
pub const NODE_TTL_MS: i64 = 12 * HEARTBEAT.as_millis() as i64;

/// The error a removal writes on an attempt it ends (a claim that was in flight).
pub const REMOVED_ERROR: &str = "the subscription was removed";

/// The SET list that finishes a removed subscription's state, `{now}` the dialect's
/// placeholder for the time.
pub const FINISHED_SET: &str = "status = 'completed', outcome = 'removed', next_attempt_at = NULL,
    claimed_until = NULL, claimed_by = NULL, claim_token = NULL, completed_at = {now},
    finished_at = {now}";

/// What [`crate::store::Store::create_subscription`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// Written, with this id.
    Created(i64),
    /// A live subscription has that name already.
    Taken,
    /// Another live subscription's current or graced pull token is the one given: checked in
    /// the create's own transaction, so two creates at once cannot both take one token.
    TokenTaken,
}

/// What [`crate::store::Store::update_subscription`] did.
#[derive(Debug, Clone)]
pub enum Updated {
    /// Written, as this.
    Updated(Box<crate::subscriptions::Subscription>),
    /// No live subscription has that name.
    NotFound,
    /// The change does not validate against the subscription as it was: nothing written.
    Refused(crate::subscriptions::FieldError),
}

/// A change of one subscription, made from the subscription as the registry holds it in the
/// transaction that writes the result (so that two changes never mix): the new subscription,
/// or the field that does not validate.
pub type Change<'a> = &'a (
        dyn Fn(
    &crate::subscriptions::Subscription,
) -> Result<crate::subscriptions::Subscription, crate::subscriptions::FieldError>
            + Sync
    );

/// The live subscriptions as the registry holds them, each with its id: what a node serves
/// (see `crate::served`). Their secrets are read apart, through `crate::secrets`.
pub fn served(
    live: &[crate::store::routes::Live],
) -> Vec<(i64, crate::subscriptions::Subscription)> {
    live.iter()
        .map(|l| (l.id, l.subscription(None, None)))
        .collect()
}

/// The removed subscriptions that still hold pending or claimed states (both dialects): what
/// a removal's finishing left undone (on PostgreSQL it commits after the removal, so a node
/// can die between the two). Few rows: removed subscriptions, each probed by an index (the
/// due index by subscription; the leases index holds only claims).
pub const LEFT_UNFINISHED_SQL: &str = "SELECT u.id FROM subscriptions u
  WHERE u.removed_at IS NOT NULL
    AND (EXISTS (SELECT 1 FROM event_state s WHERE s.sub = u.id AND s.status = 'pending')
         OR EXISTS (SELECT 1 FROM event_state s WHERE s.sub = u.id AND s.status = 'claimed'))
  ORDER BY u.id";
