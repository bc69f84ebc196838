//! From what the store says now to one observation per alert key: the rules of each condition.

use std::collections::{BTreeMap, HashSet};

use crate::config::{AlertSettings, ConditionKind, ConditionSettings};
use crate::store::alerts::{ActiveAlert, AlertSubject, Observation};
use crate::store::{Store, StoreResult};

/// What one evaluation reads from the store, once for every channel.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The live subscriptions, without counts (`AlertStore::subjects`: bounded reads).
    pub subscriptions: Vec<AlertSubject>,
    /// Failed states per subscription, by window (seconds).
    pub failed: BTreeMap<u64, Vec<(String, i64)>>,
    /// Refused deliveries per source, by window (seconds).
    pub rejected: BTreeMap<u64, Vec<(String, i64)>>,
    pub active: Vec<ActiveAlert>,
}

/// Read what the channels' conditions need (blocking: call it off the async threads).
pub fn snapshot(store: &dyn Store, channels: &[AlertSettings], now: i64) -> StoreResult<Snapshot> {
    let mut snap = Snapshot {
        subscriptions: store.alerts().subjects()?,
        active: store.alerts().active_alerts()?,
        ..Snapshot::default()
    };
    for c in channels.iter().flat_map(AlertSettings::conditions) {
        let since = now - (c.duration_seconds as i64) * 1000;
        match c.kind {
            ConditionKind::SubscriptionFailed if !snap.failed.contains_key(&c.duration_seconds) => {
                let counts = store.alerts().failed_since(since)?;
                snap.failed.insert(c.duration_seconds, counts);
            }
            ConditionKind::SourceRejected if !snap.rejected.contains_key(&c.duration_seconds) => {
                let counts = store.alerts().rejected_since(since)?;
                snap.rejected.insert(c.duration_seconds, counts);
            }
            _ => {}
        }
    }
    Ok(snap)
}

/// The dashboard's view of something, under `public_url` (or as a path alone).
pub fn link(public_url: Option<&str>, fragment: &str) -> String {
    let base = public_url.unwrap_or("").trim_end_matches('/');
    format!("{base}/ui/#{fragment}")
}

/// `channel`, `condition` and `subject` of an alert key.
fn key_parts(alert: &str) -> (&str, &str, &str) {
    let mut it = alert.splitn(3, '/');
    let channel = it.next().unwrap_or("");
    (channel, it.next().unwrap_or(""), it.next().unwrap_or(""))
}

fn count_of(counts: Option<&Vec<(String, i64)>>, name: &str) -> i64 {
    counts
        .and_then(|c| c.iter().find(|(n, _)| n == name))
        .map_or(0, |(_, n)| *n)
}

/// Every observation of one channel: one per condition and subject it watches, and a
/// "not holding" for each of its open alerts of a condition it evaluates whose subject is gone
/// (a subscription removed), so that every episode clears. An open alert of a condition this
/// node does not evaluate (another node's `[[alerts]]` differ) is left to the nodes that do:
/// clearing it here would flap with them.
pub fn observe(
    channel: &AlertSettings,
    snap: &Snapshot,
    public_url: Option<&str>,
    now: i64,
) -> Vec<Observation> {
    let name = channel.channel();
    let mut out = Vec::new();
    let conditions = channel.conditions();
    for c in &conditions {
        observe_condition(name, c, snap, public_url, now, &mut out);
    }
    let seen: HashSet<String> = out.iter().map(|o| o.alert.clone()).collect();
    let prefix = format!("{name}/");
    for a in &snap.active {
        let store_down = a.alert.contains("/store_unavailable/");
        let (_, condition, subject) = key_parts(&a.alert);
        let evaluated = conditions
            .iter()
            .any(|c| c.kind.name() == condition && c.only.as_deref().is_none_or(|o| o == subject));
        if a.alert.starts_with(&prefix) && !seen.contains(&a.alert) && !store_down && evaluated {
            out.push(Observation {
                alert: a.alert.clone(),
                channel: name.to_string(),
                holding: false,
                for_ms: 0,
                title: a
                    .alert
                    .split_once('/')
                    .map_or("", |(_, rest)| rest)
                    .replace('/', ": "),
                figure: "no longer observed (gone from the configuration or the window)".into(),
                link: link(public_url, "overview"),
            });
        }
    }
    out
}

fn observe_condition(
    channel: &str,
    c: &ConditionSettings,
    snap: &Snapshot,
    public_url: Option<&str>,
    now: i64,
    out: &mut Vec<Observation>,
) {
    let kind = c.kind.name();
    let wanted = |subject: &str| c.only.as_deref().is_none_or(|only| only == subject);
    let mut push = |subject: &str, holding: bool, for_ms: i64, title: String, figure, view| {
        out.push(Observation {
            alert: format!("{channel}/{kind}/{subject}"),
            channel: channel.to_string(),
            holding,
            for_ms,
            title,
            figure,
            link: link(public_url, view),
        });
    };
    let window = c.duration_seconds;
    let live = snap.subscriptions.iter();
    match c.kind {
        ConditionKind::SubscriptionFailed => {
            for s in live.filter(|s| wanted(&s.name)) {
                let n = count_of(snap.failed.get(&window), &s.name);
                push(
                    &s.name,
                    n >= c.threshold as i64,
                    0,
                    format!("subscription `{}`: failed events", s.name),
                    format!("{n} event(s) failed in the last {window} s"),
                    "events?status=failed",
                );
            }
        }
        ConditionKind::BreakerOpen => {
            for s in live.filter(|s| s.has_breaker() && wanted(&s.name)) {
                let figure = match s.probe_at {
                    Some(at) => format!(
                        "circuit breaker open: the endpoint fails; next probe in {} s",
                        ((at - now).max(0) + 999) / 1000
                    ),
                    None => "circuit breaker closed: calls go through".into(),
                };
                push(
                    &s.name,
                    s.probe_at.is_some(),
                    (window as i64) * 1000,
                    format!("subscription `{}`: endpoint down", s.name),
                    figure,
                    "subscriptions",
                );
            }
        }
        ConditionKind::SubscriptionLag => {
            // A `listen` session lags whenever its laptop sleeps; a paused subscription waits
            // because ops said so.
            let watched = live.filter(|s| s.origin != "session" && !s.paused && wanted(&s.name));
            for s in watched {
                let lag = s.lag_seconds(now);
                push(
                    &s.name,
                    lag > c.threshold as f64,
                    (window as i64) * 1000,
                    format!("subscription `{}`: behind", s.name),
                    format!(
                        "oldest due event waiting {lag:.0} s (threshold {} s)",
                        c.threshold
                    ),
                    "subscriptions",
                );
            }
        }
        ConditionKind::SourceRejected => {
            let counts = snap.rejected.get(&window);
            // A source refused nothing in the window has no row: its open alert is observed
            // at 0.
            let open = snap.active.iter().filter_map(|a| {
                let (ch, condition, subject) = key_parts(&a.alert);
                (ch == channel && condition == kind).then_some(subject)
            });
            let mut subjects: Vec<&str> = counts
                .into_iter()
                .flatten()
                .map(|(source, _)| source.as_str())
                .chain(open)
                .filter(|source| wanted(source))
                .collect();
            subjects.sort_unstable();
            subjects.dedup();
            for source in subjects {
                let n = count_of(counts, source);
                push(
                    source,
                    n >= c.threshold as i64,
                    0,
                    format!("source `{source}`: deliveries refused"),
                    format!("{n} deliveries refused in the last {window} s"),
                    "rejected",
                );
            }
        }
        // Watched by the engine itself: the store cannot be asked about its own absence.
        ConditionKind::StoreUnavailable => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    fn sub(name: &str, origin: &str, paused: bool, oldest_due_at: Option<i64>) -> AlertSubject {
        AlertSubject {
            name: name.into(),
            kind: "http".into(),
            origin: origin.into(),
            paused,
            probe_at: None,
            oldest_due_at,
        }
    }

    fn channel(conditions: &str) -> AlertSettings {
        let text = format!(
            "[[alerts]]\nname = \"ops\"\nkind = \"slack\"\nurl = \"https://h.example.com/\"\n{conditions}"
        );
        Settings::from_toml(&text, "t", Vec::new()).unwrap().alerts[0].clone()
    }

    #[test]
    fn lag_leaves_out_listen_sessions_and_paused_subscriptions() {
        let now = 1_000_000;
        let late = Some(now - 120_000);
        let snap = Snapshot {
            subscriptions: vec![
                sub("billing", "config", false, late),
                sub("laptop", "session", false, late),
                sub("held", "config", true, late),
                sub("fresh", "api", false, Some(now - 1_000)),
            ],
            ..Snapshot::default()
        };
        let c = channel(
            "[[alerts.conditions]]\nkind = \"subscription_lag\"\nthreshold = 60\nduration_seconds = 0\n",
        );
        let seen: Vec<(String, bool)> = observe(&c, &snap, None, now)
            .into_iter()
            .map(|o| (o.alert, o.holding))
            .collect();
        assert_eq!(
            seen,
            [
                ("ops/subscription_lag/billing".to_string(), true),
                ("ops/subscription_lag/fresh".to_string(), false),
            ]
        );
    }

    #[test]
    fn an_open_alert_nothing_observes_any_more_is_observed_as_cleared() {
        let snap = Snapshot {
            active: vec![
                ActiveAlert {
                    alert: "ops/source_rejected/gone".into(),
                    episode: 2,
                    since: 0,
                    figure: String::new(),
                },
                ActiveAlert {
                    alert: "other/source_rejected/gone".into(),
                    episode: 1,
                    since: 0,
                    figure: String::new(),
                },
            ],
            ..Snapshot::default()
        };
        let c = channel(
            "[[alerts.conditions]]\nkind = \"source_rejected\"\nthreshold = 5\nduration_seconds = 60\n",
        );
        let seen = observe(&c, &snap, Some("https://inbox.example.com/"), 0);
        assert_eq!(seen.len(), 1, "only this channel's: {seen:?}");
        assert_eq!(seen[0].alert, "ops/source_rejected/gone");
        assert!(!seen[0].holding);
        // A source with no refusal in the window is observed at 0.
        assert!(seen[0].figure.starts_with("0 deliveries"), "{seen:?}");
        assert_eq!(seen[0].link, "https://inbox.example.com/ui/#rejected");
    }

    #[test]
    fn an_open_alert_of_a_condition_this_node_does_not_evaluate_is_left_alone() {
        let open = |alert: &str| ActiveAlert {
            alert: alert.into(),
            episode: 1,
            since: 0,
            figure: String::new(),
        };
        let snap = Snapshot {
            active: vec![
                open("ops/subscription_lag/billing"),
                open("ops/breaker_open/gone"),
                open("ops/breaker_open/other"),
            ],
            ..Snapshot::default()
        };
        let c = channel(
            "[[alerts.conditions]]\nkind = \"breaker_open\"\nduration_seconds = 60\nonly = \"gone\"\n",
        );
        let seen: Vec<(String, bool)> = observe(&c, &snap, None, 0)
            .into_iter()
            .map(|o| (o.alert, o.holding))
            .collect();
        assert_eq!(seen, [("ops/breaker_open/gone".to_string(), false)]);
    }

    #[test]
    fn links_are_relative_without_a_public_url() {
        assert_eq!(link(None, "subscriptions"), "/ui/#subscriptions");
        assert_eq!(
            link(Some("https://x.example.com"), "rejected"),
            "https://x.example.com/ui/#rejected"
        );
    }
}
