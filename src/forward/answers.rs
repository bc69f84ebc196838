//! What each answer does: to its event (the next state, committed in batches) and to the
//! subscription (the circuit breaker, a pause on 410).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{FAILURES_TO_OPEN, Forwarder};
use crate::domain::DeliveryMode;
use crate::domain::time::now_ms;
use crate::store::{AttemptResult, Claimed, Finish, Finished, Next, Outcome};

use super::call::Answer;

impl Forwarder {
    /// The event's next state.
    pub(super) fn next(&self, event: &Claimed, answer: &Option<Answer>, now: i64) -> Next {
        let (error, unknown, retry_after_ms) = match answer {
            Some(Answer::Delivered(_)) => {
                return Next::Complete {
                    effect: None,
                    outcome: Outcome::Delivered,
                };
            }
            Some(Answer::Filtered) => return super::shape::filtered(),
            Some(Answer::Unshaped(message)) => return super::shape::failed(message),
            // The subscription is paused; the event waits for its resume, due at once.
            Some(Answer::Gone) => {
                return Next::Retry {
                    at: now,
                    error: "the endpoint answered 410 Gone: the subscription is paused".into(),
                };
            }
            None => {
                return Next::Retry {
                    at: now,
                    error: "not started: the claim's lease no longer covered the call".into(),
                };
            }
            Some(Answer::Failed {
                error,
                unknown,
                retry_after_ms,
                ..
            }) => (error, *unknown, *retry_after_ms),
        };
        if unknown && self.sub.mode == DeliveryMode::AtMostOnce {
            return Next::Fail {
                error: format!("abandoned (at-most-once, the endpoint may have acted): {error}"),
                result: AttemptResult::PermanentError,
                abandoned: true,
            };
        }
        self.backoff.retry_or_give_up(
            event.budget_used,
            self.sub.max_attempts,
            error.clone(),
            retry_after_ms,
            now,
        )
    }

    /// What an answer says about the endpoint: a 410 pauses the subscription; a run of
    /// failures (or a failed probe) opens the breaker; a success closes it. `true` when it
    /// paused the subscription or opened the breaker (the events claimed ahead then go back).
    pub(super) async fn observe(self: &Arc<Self>, answer: &Option<Answer>, probe: bool) -> bool {
        let me = Arc::clone(self);
        let write = match answer {
            // The program's doing, not the endpoint's: no breaker moves.
            None | Some(Answer::Filtered | Answer::Unshaped(_)) => return false,
            Some(Answer::Gone) => {
                tracing::warn!(
                    subscription = %self.sub.name,
                    "the endpoint answered 410 Gone: subscription paused (resume it to go on)"
                );
                Write::Pause
            }
            Some(Answer::Delivered(_)) => {
                self.failures.store(0, Ordering::SeqCst);
                if !probe {
                    return false;
                }
                tracing::info!(subscription = %self.sub.name, "probe delivered: breaker closed");
                Write::Close
            }
            Some(Answer::Failed { error, .. }) => {
                let run = self.failures.fetch_add(1, Ordering::SeqCst) + 1;
                if probe {
                    tracing::warn!(subscription = %self.sub.name, %error, "probe failed");
                    Write::Open { after_probe: true }
                } else if run.is_multiple_of(FAILURES_TO_OPEN) {
                    tracing::warn!(
                        subscription = %self.sub.name,
                        %error,
                        "{run} calls in a row failed: breaker open, probing with one event"
                    );
                    Write::Open { after_probe: false }
                } else {
                    return false;
                }
            }
        };
        let halts = !matches!(write, Write::Close);
        if halts {
            // Before the write: no queued call starts while it runs (the loop lowers it once
            // it has this call's answer).
            self.halting.fetch_add(1, Ordering::SeqCst);
        }
        let written = tokio::task::spawn_blocking(move || {
            let store = &me.store;
            let (base, max) = (
                i64::try_from(me.sub.backoff_base_ms).unwrap_or(i64::MAX),
                i64::try_from(me.sub.backoff_max_ms).unwrap_or(i64::MAX),
            );
            match write {
                Write::Pause => store.pause_gone(me.sub_id, &me.settings).map(|_| ()),
                Write::Close => store.close_breaker(me.sub_id, Some(&me.settings)),
                Write::Open { after_probe } => {
                    let (first, now) = (base.max(1), now_ms());
                    store.open_breaker(me.sub_id, Some(&me.settings), after_probe, first, max, now)
                }
            }
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot record the endpoint's state"),
            Err(e) => tracing::error!(error = %e, "recording the endpoint's state panicked"),
        }
        halts
    }

    pub(super) fn record(&self, item: &Finish, result: Finished) {
        let claim = &item.claim;
        match (result, &item.next) {
            (Finished::LeaseLost, _) => tracing::warn!(
                subscription = %self.sub.name,
                source = %claim.source,
                event_id = %claim.event_id,
                "lease lost before the answer was committed: the event will be forwarded again"
            ),
            (Finished::Failed, Next::Fail { error, .. }) => tracing::warn!(
                subscription = %self.sub.name,
                source = %claim.source,
                event_id = %claim.event_id,
                %error,
                "event failed"
            ),
            _ => {}
        }
    }
}

enum Write {
    Pause,
    Close,
    Open { after_probe: bool },
}
