//! `[[alerts]]`: a channel and the conditions that send to it (SPEC section 15).

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::signature::{Scheme, Secret};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelKind {
    /// A chat incoming webhook (Slack-compatible JSON: `text` and `blocks`).
    Slack,
    /// A JSON POST signed as Standard Webhooks with the channel's own `secret`.
    Webhook,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConditionKind {
    /// At least `threshold` states of a subscription failed within the last `duration_seconds`.
    SubscriptionFailed,
    /// An `http` subscription's breaker has been open (probing) for `duration_seconds`.
    BreakerOpen,
    /// A subscription's oldest due event has waited more than `threshold` seconds, for
    /// `duration_seconds` (`listen` sessions left out).
    SubscriptionLag,
    /// At least `threshold` deliveries of a source were refused within `duration_seconds`.
    SourceRejected,
    /// The store has answered "unavailable" (503) for `duration_seconds`.
    StoreUnavailable,
}

impl ConditionKind {
    pub fn name(self) -> &'static str {
        match self {
            ConditionKind::SubscriptionFailed => "subscription_failed",
            ConditionKind::BreakerOpen => "breaker_open",
            ConditionKind::SubscriptionLag => "subscription_lag",
            ConditionKind::SourceRejected => "source_rejected",
            ConditionKind::StoreUnavailable => "store_unavailable",
        }
    }

    /// Whether `threshold` means something for it.
    fn takes_threshold(self) -> bool {
        !matches!(
            self,
            ConditionKind::BreakerOpen | ConditionKind::StoreUnavailable
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionSettings {
    pub kind: ConditionKind,
    /// A count (failed states, refused deliveries) or, for `subscription_lag`, seconds.
    #[serde(default)]
    pub threshold: u64,
    /// The window of a count, or how long the condition must hold.
    pub duration_seconds: u64,
    /// Only this subscription (conditions on subscriptions) or source (`source_rejected`).
    #[serde(default)]
    pub only: Option<String>,
}

/// The conditions of an `[[alerts]]` that names none: an `http` endpoint down five minutes,
/// any failed state in fifteen, a subscription ten minutes behind, twenty refused deliveries of
/// a source in five minutes (a rotated secret), the store unavailable for a minute.
pub fn default_conditions() -> Vec<ConditionSettings> {
    let c = |kind, threshold, duration_seconds| ConditionSettings {
        kind,
        threshold,
        duration_seconds,
        only: None,
    };
    vec![
        c(ConditionKind::SubscriptionFailed, 1, 900),
        c(ConditionKind::BreakerOpen, 0, 300),
        c(ConditionKind::SubscriptionLag, 600, 0),
        c(ConditionKind::SourceRejected, 20, 300),
        c(ConditionKind::StoreUnavailable, 0, 60),
    ]
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertSettings {
    /// Names the channel in alert keys and logs; default: its kind (`slack`, `webhook`).
    #[serde(default)]
    pub name: String,
    pub kind: ChannelKind,
    pub url: String,
    /// The `webhook` channel's signing secret (`whsec_` and base64, as Standard Webhooks).
    #[serde(default)]
    pub secret: Option<Secret>,
    /// Bound on one call to the channel.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Empty: [`default_conditions`].
    #[serde(default)]
    pub conditions: Vec<ConditionSettings>,
}

impl AlertSettings {
    /// `name`, or the kind when it is unset.
    pub fn channel(&self) -> &str {
        match (self.name.as_str(), self.kind) {
            ("", ChannelKind::Slack) => "slack",
            ("", ChannelKind::Webhook) => "webhook",
            (name, _) => name,
        }
    }

    /// `conditions`, or the default set when it names none.
    pub fn conditions(&self) -> Vec<ConditionSettings> {
        match self.conditions.is_empty() {
            true => default_conditions(),
            false => self.conditions.clone(),
        }
    }
}

fn default_timeout_ms() -> u64 {
    5_000
}

/// `url` is an http:// or https:// URL, or the error names `key` (never the URL: a `slack`
/// channel's URL is its secret).
fn http_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| invalid(key, format!("not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(key, "must be an http:// or https:// URL"));
    }
    Ok(())
}

/// Longest duration or window accepted: a week.
const MAX_DURATION_SECONDS: u64 = 7 * 86_400;
/// Largest threshold accepted (a count, or seconds of lag): well within `i64` and exact in `f64`.
pub const MAX_THRESHOLD: u64 = 1_000_000_000;

/// Check `[[alerts]]`, `alert_every_ms` and `public_url`.
pub fn validate(settings: &super::Settings) -> Result<(), ConfigError> {
    if let Some(url) = &settings.public_url {
        http_url("public_url", url)?;
    }
    let alerts = &settings.alerts;
    // At least a second: on SQLite each evaluation and claim may take the write lock ingest
    // needs (the tests' faster rounds go through `alerts::UNSAFE_ALERT_EVERY_MS`).
    if !(1_000..=3_600_000).contains(&settings.alert_every_ms) {
        return Err(invalid(
            "alert_every_ms",
            "must be between 1000 (a second) and 3600000 (an hour)",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, a) in alerts.iter().enumerate() {
        let key = |field: &str| format!("alerts[{i}].{field}");
        let well_formed = a.channel().len() <= 64
            && a.channel()
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !well_formed {
            return Err(invalid(
                key("name"),
                "use letters, digits, `-` and `_` (at most 64)",
            ));
        }
        if !seen.insert(a.channel()) {
            return Err(invalid(
                key("name"),
                format!(
                    "channel `{}` is defined twice (give each `[[alerts]]` its own name)",
                    a.channel()
                ),
            ));
        }
        http_url(&key("url"), &a.url)?;
        match (a.kind, &a.secret) {
            (ChannelKind::Webhook, None) => {
                return Err(invalid(
                    key("secret"),
                    "a `webhook` channel signs its notices: set a Standard Webhooks secret \
                     (whsec_ and base64)",
                ));
            }
            (ChannelKind::Webhook, Some(secret)) => Scheme::StandardWebhooks
                .check_secret(secret.expose())
                .map_err(|m| invalid(key("secret"), m))?,
            (ChannelKind::Slack, Some(_)) => {
                return Err(invalid(
                    key("secret"),
                    "a `slack` channel is not signed (its URL is the secret): remove it",
                ));
            }
            (ChannelKind::Slack, None) => {}
        }
        if a.timeout_ms == 0 || a.timeout_ms > 60_000 {
            return Err(invalid(key("timeout_ms"), "must be between 1 and 60000"));
        }
        let mut kinds = std::collections::HashSet::new();
        for (j, c) in a.conditions.iter().enumerate() {
            let key = |field: &str| format!("alerts[{i}].conditions[{j}].{field}");
            if c.duration_seconds > MAX_DURATION_SECONDS {
                return Err(invalid(
                    key("duration_seconds"),
                    format!("must be at most {MAX_DURATION_SECONDS} (a week)"),
                ));
            }
            let counts = matches!(
                c.kind,
                ConditionKind::SubscriptionFailed | ConditionKind::SourceRejected
            );
            if counts && (c.threshold == 0 || c.duration_seconds == 0) {
                return Err(invalid(
                    key("threshold"),
                    format!(
                        "`{}` counts within a window: set threshold (at least 1) and \
                         duration_seconds (the window, at least 1)",
                        c.kind.name()
                    ),
                ));
            }
            if c.kind == ConditionKind::SubscriptionLag && c.threshold == 0 {
                return Err(invalid(
                    key("threshold"),
                    "`subscription_lag` needs threshold (seconds of lag, at least 1)",
                ));
            }
            if c.threshold > MAX_THRESHOLD {
                return Err(invalid(
                    key("threshold"),
                    format!("must be at most {MAX_THRESHOLD}"),
                ));
            }
            if c.kind == ConditionKind::SourceRejected {
                rejections_kept(settings, c).map_err(|m| invalid(key("kind"), m))?;
                if let Some(only) = &c.only
                    && !settings.sources.iter().any(|s| &s.name == only)
                {
                    return Err(invalid(
                        key("only"),
                        format!("no `[[sources]]` is named `{only}`"),
                    ));
                }
            }
            if !c.kind.takes_threshold() && c.threshold != 0 {
                return Err(invalid(
                    key("threshold"),
                    format!(
                        "`{}` has no threshold, only duration_seconds",
                        c.kind.name()
                    ),
                ));
            }
            if c.kind == ConditionKind::StoreUnavailable && c.only.is_some() {
                return Err(invalid(
                    key("only"),
                    "`store_unavailable` is about no subscription or source",
                ));
            }
            if !kinds.insert((c.kind, c.only.clone())) {
                return Err(invalid(
                    key("kind"),
                    format!(
                        "`{}` is set twice for the same subject in this channel",
                        c.kind.name()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `source_rejected` counts the refusals `[rejections]` keeps: refused when it keeps none,
/// fewer than the threshold, or not as long as the window.
fn rejections_kept(settings: &super::Settings, c: &ConditionSettings) -> Result<(), String> {
    let kept = &settings.rejections;
    if kept.keep_count == 0 {
        return Err(
            "`source_rejected` counts kept refusals, and `[rejections] keep_count = 0` \
                    keeps none"
                .into(),
        );
    }
    if c.threshold > kept.keep_count {
        return Err(format!(
            "threshold {} is more than the {} refusals `[rejections] keep_count` keeps",
            c.threshold, kept.keep_count
        ));
    }
    if c.duration_seconds > u64::from(kept.keep_days) * 86_400 {
        return Err(format!(
            "a window of {} s is longer than the {} day(s) `[rejections] keep_days` keeps",
            c.duration_seconds, kept.keep_days
        ));
    }
    Ok(())
}

/// Warnings for a start: a condition's `only` naming no subscription of the config (it may be
/// made through the API: not refused), the default `source_rejected` with no refusal kept.
pub fn warnings(settings: &super::Settings) -> Vec<String> {
    let mut names: Vec<String> = settings
        .subscriptions
        .iter()
        .map(|s| s.name.clone())
        .collect();
    names.extend(
        super::implicit_subscriptions(settings)
            .into_iter()
            .map(|s| s.name),
    );
    let mut out = Vec::new();
    for a in &settings.alerts {
        for c in a.conditions() {
            let on_subscriptions = !matches!(
                c.kind,
                ConditionKind::SourceRejected | ConditionKind::StoreUnavailable
            );
            if let Some(only) = c
                .only
                .as_deref()
                .filter(|o| on_subscriptions && !names.iter().any(|n| n == o))
            {
                out.push(format!(
                    "alerts `{}`: `{}` watches only `{only}`, which no subscription of the \
                     config is named (fine if the API makes it)",
                    a.channel(),
                    c.kind.name()
                ));
            }
            if c.kind == ConditionKind::SourceRejected
                && a.conditions.is_empty()
                && let Err(m) = rejections_kept(settings, &c)
            {
                out.push(format!(
                    "alerts `{}`: the default {m}: it never starts",
                    a.channel()
                ));
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "alerts_tests.rs"]
mod tests;
