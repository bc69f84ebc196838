//! Alerts (SPEC section 15; `docs/guides/alerts.md`): conditions evaluated by every node, one
//! notice when one starts and one when it clears, sent to a chat or a signed webhook.
//!
//! Two kinds of task per node, apart from ingest and delivery (their store calls are short, the
//! calls to channels are bounded by `timeout_ms`, and nothing waits on them):
//! - the evaluator, every `alert_every_ms`: reads the store, turns it into observations
//!   ([`conditions`]) and hands them to [`AlertStore::observe`], which starts and clears
//!   episodes and writes their notices, each by one node (see `store::alerts`);
//! - a sender per channel: claims due notices of its channel, sends each, marks it sent, or
//!   failed with a backoff (`alert_every_ms` doubled per attempt, at most [`MAX_BACKOFF_MS`],
//!   given up after [`MAX_ATTEMPTS`]).
//!
//! The one exception is `store_unavailable`: a store that does not answer cannot say which node
//! tells. Each node that sees it sends its own notice straight away (naming itself), and its
//! own "cleared" once the store answers again; these are not kept.

pub mod channel;
pub mod conditions;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use crate::config::{ConditionKind, Settings};
use crate::domain::time::now_ms;
use crate::metrics::Metrics;
use crate::store::alerts::Notice;
use crate::store::{Store, StoreError};
use channel::Channel;

/// Attempts at one notice before it is given up (about a day at the longest backoff).
pub const MAX_ATTEMPTS: i64 = 150;
/// The longest wait between two attempts at a notice.
pub const MAX_BACKOFF_MS: i64 = 600_000;
/// Notices one sender claims at a time.
const CLAIM: usize = 5;

/// Set to a number of milliseconds (at least 10), replaces `alert_every_ms` (whose floor is a
/// second): for the tests only, which evaluate every 100 ms, never for users. Not a setting, so
/// not in the config (in-process tests set `BuildOptions::alert_every` instead).
pub const UNSAFE_ALERT_EVERY_MS: &str = "WEBHOOK_INBOX_UNSAFE_ALERT_EVERY_MS";

/// The evaluation interval: `every` (tests), else the variable above, else the setting.
fn interval(settings: &Settings, every: Option<Duration>) -> Duration {
    let from_env = std::env::var(UNSAFE_ALERT_EVERY_MS)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms >= 10)
        .map(Duration::from_millis);
    every
        .or(from_env)
        .unwrap_or(Duration::from_millis(settings.alert_every_ms))
}

/// The alerts of one node, ready to run.
pub struct Alerts {
    store: Arc<dyn Store>,
    settings: Arc<Settings>,
    channels: Vec<Arc<Channel>>,
    every: Duration,
    /// This node's name, in claims and in `store_unavailable` notices.
    node: String,
    counters: Counters,
}

/// `webhook_inbox_alerts_total` by result.
#[derive(Clone)]
struct Counters {
    sent: Counter,
    retried: Counter,
    failed: Counter,
    dropped: Counter,
    /// `webhook_inbox_alert_evaluations_total`: rounds finished (tests wait on it).
    evaluations: Counter,
}

impl Alerts {
    /// `None` when the settings name no channel.
    pub fn new(
        store: Arc<dyn Store>,
        settings: Arc<Settings>,
        metrics: &Metrics,
        node: String,
        every: Option<Duration>,
    ) -> anyhow::Result<Option<Alerts>> {
        if settings.alerts.is_empty() {
            return Ok(None);
        }
        for warning in crate::config::alert_warnings(&settings) {
            tracing::warn!("{warning}");
        }
        let channels = settings
            .alerts
            .iter()
            .map(|a| Channel::new(a).map(Arc::new))
            .collect::<anyhow::Result<_>>()?;
        Ok(Some(Alerts {
            store,
            channels,
            every: interval(&settings, every),
            settings,
            node,
            counters: Counters {
                sent: metrics.alert_counter("sent"),
                retried: metrics.alert_counter("retried"),
                failed: metrics.alert_counter("failed"),
                dropped: metrics.alert_counter("dropped"),
                evaluations: metrics.alert_evaluations(),
            },
        }))
    }

    /// Evaluate and send until `stopped` says so.
    pub async fn run(self, stopped: watch::Receiver<bool>) {
        let me = Arc::new(self);
        let mut tasks = vec![tokio::spawn(Arc::clone(&me).evaluate(stopped.clone()))];
        for channel in &me.channels {
            let task = Arc::clone(&me).send_loop(Arc::clone(channel), stopped.clone());
            tasks.push(tokio::spawn(task));
        }
        for task in tasks {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "an alert task failed");
            }
        }
    }

    async fn evaluate(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let mut down_since: Option<i64> = None;
        let mut told_down: Vec<bool> = vec![false; self.channels.len()];
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.every) => {}
                _ = stopped.changed() => return,
            }
            let me = Arc::clone(&self);
            // Taken before the snapshot is read: a start or clear applies only to an alert
            // that no node changed since (`alert_state.changed_at`), so a snapshot older than
            // another node's cannot undo what that one did.
            let now = now_ms();
            let round = tokio::task::spawn_blocking(move || {
                let snap = conditions::snapshot(&*me.store, &me.settings.alerts, now)?;
                let observations: Vec<_> = me
                    .settings
                    .alerts
                    .iter()
                    .flat_map(|a| {
                        conditions::observe(a, &snap, me.settings.public_url.as_deref(), now)
                    })
                    .collect();
                me.store.alerts().observe(&observations, now)
            })
            .await;
            let unavailable = match round {
                Ok(Ok(written)) => {
                    for n in written {
                        tracing::info!(alert = %n.alert, phase = %n.phase, figure = %n.figure, "alert");
                    }
                    false
                }
                Ok(Err(StoreError::Unavailable(cause))) => {
                    let cause = cause.chain();
                    tracing::warn!(%cause, "alerts: the store is unavailable");
                    true
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "alerts: cannot evaluate");
                    false
                }
                Err(e) => {
                    tracing::warn!(error = %e, "alerts: the evaluation task failed");
                    false
                }
            };
            down_since = match (unavailable, down_since) {
                (true, since) => Some(since.unwrap_or(now)),
                (false, _) => None,
            };
            tokio::select! {
                _ = self.store_down(down_since, now, &mut told_down) => {}
                _ = stopped.changed() => return,
            }
            self.counters.evaluations.inc();
        }
    }

    /// Tell each channel whose `store_unavailable` holds (and say when it clears), straight
    /// from this node (see the module's doc).
    async fn store_down(&self, down_since: Option<i64>, now: i64, told: &mut [bool]) {
        for (i, channel) in self.channels.iter().enumerate() {
            let Some(c) = channel
                .settings
                .conditions()
                .into_iter()
                .find(|c| c.kind == ConditionKind::StoreUnavailable)
            else {
                continue;
            };
            let (phase, since) = match (down_since, told[i]) {
                (Some(since), false) if now - since >= (c.duration_seconds as i64) * 1000 => {
                    ("started", since)
                }
                (None, true) => ("cleared", now),
                _ => continue,
            };
            let notice = Notice {
                id: 0,
                alert: format!("{}/store_unavailable/{}", channel.name, self.node),
                episode: since,
                phase: phase.into(),
                channel: channel.name.clone(),
                title: format!("node `{}`: store unavailable", self.node),
                figure: match phase {
                    "started" => format!("no answer from the store for {} s", (now - since) / 1000),
                    _ => "the store answers again".into(),
                },
                since,
                link: conditions::link(self.settings.public_url.as_deref(), "overview"),
                created_at: now,
                attempts: 1,
            };
            match channel.send(&notice, now).await {
                Ok(_) => {
                    self.counters.sent.inc();
                    told[i] = phase == "started";
                }
                Err(e) => {
                    self.counters.failed.inc();
                    tracing::warn!(channel = %channel.name, error = format!("{e:#}"), "alerts: cannot send");
                }
            }
        }
    }

    async fn send_loop(self: Arc<Self>, channel: Arc<Channel>, mut stopped: watch::Receiver<bool>) {
        let claimer = format!("{}-{}", self.node, uuid::Uuid::new_v4().simple());
        // Long enough for the whole claimed batch, each call bounded by the timeout.
        let lease_ms = (channel.settings.timeout_ms as i64 + 1_000) * CLAIM as i64;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.every) => {}
                _ = stopped.changed() => return,
            }
            let (store, name, who) = (
                Arc::clone(&self.store),
                channel.name.clone(),
                claimer.clone(),
            );
            let claimed = tokio::task::spawn_blocking(move || {
                store
                    .alerts()
                    .claim_notices(&name, &who, CLAIM, lease_ms, MAX_ATTEMPTS, now_ms())
            })
            .await;
            let notices = match claimed {
                Ok(Ok(notices)) => notices,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "alerts: cannot claim notices");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "alerts: the claim task failed");
                    continue;
                }
            };
            // A stop is not held up by a slow channel: the notices not sent yet keep their
            // claim until its lease runs out, then any node sends them.
            for notice in notices {
                if *stopped.borrow() {
                    return;
                }
                if !self
                    .send_one(&channel, &claimer, notice, &mut stopped)
                    .await
                {
                    return;
                }
            }
        }
    }

    /// Send `notice` and record what came of it; `false` when a stop came first. Only the call
    /// is cut short by a stop: once the channel has answered, its answer is recorded whatever
    /// happens, or a notice the channel took would go out again after a restart.
    async fn send_one(
        &self,
        channel: &Channel,
        claimer: &str,
        notice: Notice,
        stopped: &mut watch::Receiver<bool>,
    ) -> bool {
        let now = now_ms();
        let result = tokio::select! {
            result = channel.send(&notice, now) => result,
            _ = stopped.changed() => return false,
        };
        let store = Arc::clone(&self.store);
        let (id, who, attempts) = (notice.id, claimer.to_string(), notice.attempts);
        let outcome = match &result {
            Ok(status) => {
                tracing::info!(channel = %channel.name, alert = %notice.alert, phase = %notice.phase, status, "alert notice sent");
                self.counters.sent.inc();
                if attempts > 1 {
                    self.counters.retried.inc();
                }
                tokio::task::spawn_blocking(move || store.alerts().notice_sent(id, &who, now_ms()))
                    .await
            }
            Err(e) => {
                let error = format!("{e:#}");
                self.counters.failed.inc();
                if attempts >= MAX_ATTEMPTS {
                    self.counters.dropped.inc();
                    tracing::error!(channel = %channel.name, alert = %notice.alert, %error, attempts, "alert notice given up");
                } else {
                    tracing::warn!(channel = %channel.name, alert = %notice.alert, %error, attempts, "alert notice not sent: retried");
                }
                let retry_at = now + backoff_ms(self.every, attempts);
                tokio::task::spawn_blocking(move || {
                    store.alerts().notice_failed(id, &who, &error, retry_at)
                })
                .await
            }
        };
        match outcome {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                tracing::warn!(alert = %notice.alert, "alerts: the notice's claim was lost (another node may send it again)")
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "alerts: cannot record the notice"),
            Err(e) => tracing::warn!(error = %e, "alerts: the record task failed"),
        }
        true
    }
}

/// The wait after the `attempts`-th failed attempt: `every` doubled each time, at most
/// [`MAX_BACKOFF_MS`].
pub fn backoff_ms(every: Duration, attempts: i64) -> i64 {
    let base = every.as_millis().min(MAX_BACKOFF_MS as u128) as i64;
    let shift = attempts.clamp(1, 30) - 1;
    base.saturating_mul(1 << shift).min(MAX_BACKOFF_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_and_stops_at_its_bound() {
        let every = Duration::from_millis(200);
        let waits: Vec<i64> = (1..=4).map(|a| backoff_ms(every, a)).collect();
        assert_eq!(waits, [200, 400, 800, 1600]);
        assert_eq!(backoff_ms(every, 100), MAX_BACKOFF_MS);
        assert_eq!(backoff_ms(Duration::from_secs(3600), 1), MAX_BACKOFF_MS);
    }
}
