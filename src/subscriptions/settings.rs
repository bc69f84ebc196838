//! The config's `[[subscriptions]]` tables, validated into [`Subscription`]s: every mistake
//! of SPEC section 13 is refused at start, naming the key.

use serde::Deserialize;

use super::{Kind, Route, Subscription, implicit};
use crate::config::{ConfigError, ConsumerSettings, Settings};
use crate::domain::{DeliveryMode, RESERVED_SOURCE};

/// One `[[subscriptions]]` table of the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSettings {
    pub name: String,
    pub kind: Kind,
    pub sources: Option<Vec<String>>,
    pub types: Option<Vec<String>>,
    pub url: Option<String>,
    pub signing_secret: Option<String>,
    pub timeout_ms: Option<u64>,
    pub ca_file: Option<String>,
    pub concurrency: Option<usize>,
    pub rate_per_second: Option<u32>,
    pub mode: Option<DeliveryMode>,
    pub max_attempts: Option<u32>,
    pub backoff_base_ms: Option<u64>,
    pub backoff_max_ms: Option<u64>,
    pub token: Option<String>,
}

fn invalid(i: usize, field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: format!("subscriptions[{i}].{field}"),
        message: message.into(),
    }
}

/// Whether `name` may name a subscription: `[a-z0-9][a-z0-9-]{0,62}`.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The config's subscriptions, validated, or the implicit three when it names none.
pub fn from_settings(settings: &Settings) -> Result<Vec<Subscription>, ConfigError> {
    if settings.subscriptions.is_empty() {
        return Ok(implicit(settings));
    }
    let mut seen = std::collections::HashSet::new();
    settings
        .subscriptions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if !valid_name(&s.name) {
                return Err(invalid(
                    i,
                    "name",
                    format!(
                        "`{}` is not a subscription name: lowercase letters, digits and `-`, \
                         starting with a letter or digit, at most 63 characters",
                        s.name
                    ),
                ));
            }
            if !seen.insert(s.name.as_str()) {
                return Err(invalid(
                    i,
                    "name",
                    format!("subscription `{}` is defined twice", s.name),
                ));
            }
            one(i, s, &settings.consumers, settings.downstream.mode)
        })
        .collect()
}

fn one(
    i: usize,
    s: &SubscriptionSettings,
    consumers: &ConsumerSettings,
    downstream_mode: DeliveryMode,
) -> Result<Subscription, ConfigError> {
    // The two ways out to the user's own code come with their own issues; until they are
    // built, naming them is refused rather than leaving their events waiting forever.
    if matches!(s.kind, Kind::Http | Kind::Pull) {
        return Err(invalid(
            i,
            "kind",
            format!(
                "kind `{}` is not available in this version (loyalty-credit, audit and \
                 downstream are)",
                s.kind.as_str()
            ),
        ));
    }
    let only = |field: &str, set: bool, kind: &str| {
        if set {
            Err(invalid(i, field, format!("is for kind `{kind}` only")))
        } else {
            Ok(())
        }
    };
    for (field, set) in [
        ("url", s.url.is_some()),
        ("signing_secret", s.signing_secret.is_some()),
        ("timeout_ms", s.timeout_ms.is_some()),
        ("ca_file", s.ca_file.is_some()),
        ("rate_per_second", s.rate_per_second.is_some()),
    ] {
        only(field, set && s.kind != Kind::Http, "http")?;
    }
    only("token", s.token.is_some() && s.kind != Kind::Pull, "pull")?;
    only(
        "concurrency",
        s.concurrency.is_some() && s.kind != Kind::Http,
        "http",
    )?;
    let sources = match (&s.sources, s.kind) {
        (None, Kind::Downstream) => Some(vec![RESERVED_SOURCE.to_string()]),
        (None, _) => None,
        (Some(list), kind) => {
            if list.is_empty() {
                return Err(invalid(i, "sources", "an empty list matches no event"));
            }
            for source in list {
                crate::domain::SourceName::parse(source)
                    .map_err(|e| invalid(i, "sources", format!("`{source}`: {e}")))?;
                let reserved = source == RESERVED_SOURCE;
                if reserved != (kind == Kind::Downstream) {
                    return Err(invalid(
                        i,
                        "sources",
                        "`requests` (the submission API's source) is for kind `downstream`, \
                         which takes no other",
                    ));
                }
            }
            Some(list.clone())
        }
    };
    if let Some(types) = &s.types {
        if types.is_empty() {
            return Err(invalid(i, "types", "an empty list matches no event"));
        }
        for glob in types {
            if glob.trim().is_empty()
                || glob.chars().any(|c| c.is_control() || c == '[' || c == ']')
            {
                return Err(invalid(
                    i,
                    "types",
                    format!(
                        "`{glob}` cannot match an event type: a glob is the type's text with \
                         `*` (any run) and `?` (one character), not empty, without brackets"
                    ),
                ));
            }
        }
    }
    let mode = match (s.mode, s.kind) {
        (Some(DeliveryMode::AtMostOnce), Kind::LoyaltyCredit | Kind::Audit) => {
            return Err(invalid(
                i,
                "mode",
                "an in-process kind commits its effect with the event: it is at-least-once",
            ));
        }
        (Some(mode), _) => mode,
        (None, Kind::Downstream) => downstream_mode,
        (None, _) => DeliveryMode::AtLeastOnce,
    };
    let max_attempts = s.max_attempts.unwrap_or(consumers.max_attempts);
    if max_attempts == 0 {
        return Err(invalid(i, "max_attempts", "must be at least 1"));
    }
    let backoff_base_ms = s.backoff_base_ms.unwrap_or(consumers.backoff_base_ms);
    let backoff_max_ms = s.backoff_max_ms.unwrap_or(consumers.backoff_max_ms);
    if backoff_max_ms > crate::config::MAX_BACKOFF_MS {
        return Err(invalid(
            i,
            "backoff_max_ms",
            format!(
                "must be at most {} (30 days)",
                crate::config::MAX_BACKOFF_MS
            ),
        ));
    }
    if backoff_base_ms > backoff_max_ms {
        return Err(invalid(
            i,
            "backoff_base_ms",
            "must not exceed backoff_max_ms",
        ));
    }
    Ok(Subscription {
        name: s.name.clone(),
        kind: s.kind,
        route: Route {
            sources,
            types: s.types.clone(),
            except_types: Vec::new(),
        },
        mode,
        max_attempts,
        backoff_base_ms,
        backoff_max_ms,
    })
}
