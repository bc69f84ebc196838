//! The rules every store follows, written once. A store supplies a narrow set of statements
//! run inside its own transaction ([`FinishStatements`]); what those statements mean (which
//! outcome a refused credit has, when a retry is allowed, what a refused effect does to its
//! event) is decided here, so that SQLite and PostgreSQL cannot drift apart.
//!
//! The guards themselves stay in the database: every "first time?" below is answered by a
//! unique constraint inside the transaction that completes the event (`ON CONFLICT DO
//! NOTHING`), never by a read followed by a write.

mod backoff;
mod finish;

pub use backoff::Backoff;
pub use finish::{Credit, FinishStatements, finish_all};

use super::{EventRecord, RetryOutcome, Status};

/// Why an ops retry of one event is refused (SPEC section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryRefusal {
    /// Pending or claimed: it will run anyway.
    Unfinished,
    /// Completed, or an at-most-once call abandoned with its outcome unknown: only a
    /// deliberate `force` runs it again.
    NeedsForce,
    /// A tombstone: its body is gone, so it can never run again, forced or not.
    Purged,
}

impl RetryRefusal {
    /// The answer to the ops retry of `event`.
    pub fn answer(self, event: EventRecord) -> RetryOutcome {
        match self {
            RetryRefusal::Unfinished => RetryOutcome::Unchanged(event),
            RetryRefusal::NeedsForce => RetryOutcome::NeedsForce(event),
            RetryRefusal::Purged => RetryOutcome::Purged(event),
        }
    }
}

/// One subscription's state of an event, as a retry weighs it.
#[derive(Debug, Clone)]
pub struct StateRow {
    pub sub: i64,
    pub status: Status,
    pub abandoned: bool,
    pub purged: bool,
}

/// What an ops retry of one event does, the same on every store.
#[derive(Debug)]
pub enum RetryPlan {
    /// Move these states back to pending (fenced on the status each was read with).
    Retry(Vec<StateRow>),
    /// Answer without a change (the refusal says how).
    Refuse(RetryRefusal),
    /// The event has no state in that subscription, and will not get one.
    NotFound,
}

/// The retry of `event`, whose live subscriptions' states are `states`: with a subscription,
/// its state (an event not fanned out yet is pending in it already); without, each failed
/// state, or, when none failed, what the summary says (a completed event runs again in each
/// subscription with `force`; one pending or claimed somewhere is left alone).
pub fn plan_retry(
    event: &EventRecord,
    states: &[StateRow],
    sub: Option<i64>,
    force: bool,
) -> RetryPlan {
    let targets: Vec<StateRow> = match sub {
        Some(id) => match states.iter().find(|s| s.sub == id) {
            Some(state) => vec![state.clone()],
            None if event.status == Status::Pending => {
                return RetryPlan::Refuse(RetryRefusal::Unfinished);
            }
            None => return RetryPlan::NotFound,
        },
        None => {
            let failed: Vec<StateRow> = states
                .iter()
                .filter(|s| s.status == Status::Failed)
                .cloned()
                .collect();
            if !failed.is_empty() {
                failed
            } else if let Err(refusal) = may_retry_event(event, force) {
                return RetryPlan::Refuse(refusal);
            } else {
                states
                    .iter()
                    .filter(|s| s.status == Status::Completed)
                    .cloned()
                    .collect()
            }
        }
    };
    if targets.is_empty() {
        return match may_retry_event(event, force) {
            Err(refusal) => RetryPlan::Refuse(refusal),
            Ok(()) => RetryPlan::Refuse(RetryRefusal::Unfinished),
        };
    }
    for t in &targets {
        if let Err(refusal) = may_retry(t.status, t.abandoned, t.purged, force) {
            return RetryPlan::Refuse(refusal);
        }
    }
    RetryPlan::Retry(targets)
}

/// [`may_retry`] for a stored event.
pub fn may_retry_event(event: &EventRecord, force: bool) -> Result<(), RetryRefusal> {
    may_retry(
        event.status,
        event.abandoned,
        event.purged_at.is_some(),
        force,
    )
}

/// Whether an ops retry may move an event in this state back to pending. Bulk retry asks with
/// `force` off: abandoned events each need a deliberate forced retry of their own.
pub fn may_retry(
    status: Status,
    abandoned: bool,
    purged: bool,
    force: bool,
) -> Result<(), RetryRefusal> {
    match status {
        _ if purged => Err(RetryRefusal::Purged),
        // Stored: no subscription took it, so there is nothing to run again.
        Status::Pending | Status::Claimed | Status::Stored => Err(RetryRefusal::Unfinished),
        Status::Failed if !abandoned || force => Ok(()),
        Status::Completed if force => Ok(()),
        Status::Failed | Status::Completed => Err(RetryRefusal::NeedsForce),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_follow_the_rule_of_spec_section_5() {
        use RetryRefusal::*;
        use Status::*;
        let cases = [
            // (status, abandoned, purged, force) => expected
            ((Failed, false, false, false), Ok(())),
            ((Failed, true, false, false), Err(NeedsForce)),
            ((Failed, true, false, true), Ok(())),
            ((Completed, false, false, false), Err(NeedsForce)),
            ((Completed, false, false, true), Ok(())),
            ((Pending, false, false, true), Err(Unfinished)),
            ((Claimed, false, false, false), Err(Unfinished)),
            ((Completed, false, true, true), Err(Purged)),
            ((Failed, false, true, false), Err(Purged)),
        ];
        for ((status, abandoned, purged, force), expected) in cases {
            assert_eq!(
                may_retry(status, abandoned, purged, force),
                expected,
                "{status:?} abandoned={abandoned} purged={purged} force={force}"
            );
        }
    }
}
