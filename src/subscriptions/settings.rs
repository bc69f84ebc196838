//! The config's `[[subscriptions]]` tables, validated into [`Subscription`]s: every mistake
//! of SPEC section 13 is refused at start, naming the key. The API's `POST` and `PATCH
//! /subscriptions` bodies go through the very same check ([`validate`]), so that a field the
//! config refuses is refused there too, named the same way.

use serde::{Deserialize, Serialize};

use super::{Kind, Route, Subscription};
use crate::domain::{ConsumerSettings, DeliveryMode, MIN_TOKEN_LEN, RESERVED_SOURCE};
use crate::signature::Secret;

/// One `[[subscriptions]]` table of the config, or the body of `POST /subscriptions`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSettings {
    pub name: String,
    pub kind: Kind,
    pub sources: Option<Vec<String>>,
    pub types: Option<Vec<String>>,
    pub url: Option<String>,
    /// `nats` only.
    pub subject: Option<String>,
    pub stream: Option<String>,
    pub creds_file: Option<String>,
    /// `amqp` only.
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub signing_secret: Option<OneOrMany>,
    pub timeout_ms: Option<u64>,
    pub ca_file: Option<String>,
    pub concurrency: Option<usize>,
    pub rate_per_second: Option<u32>,
    pub mode: Option<DeliveryMode>,
    pub max_attempts: Option<u32>,
    pub backoff_base_ms: Option<u64>,
    pub backoff_max_ms: Option<u64>,
    pub token: Option<String>,
    pub ordered_by: Option<String>,
    pub on_failure: Option<super::OnFailure>,
    /// Conditions on the body (`subscriptions::filter`), as TOML or JSON.
    pub filter: Option<serde_json::Value>,
    /// A jq program run at delivery (`crate::transform`).
    pub transform: Option<String>,
}

/// `signing_secret`: one secret, or several while a rotation runs (each signs every call).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn list(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(list) => list.clone(),
        }
    }
}

/// A subscription's field that does not validate, and why: the config names it
/// `subscriptions[i].<field>`, the API answers 422 naming `<field>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

pub(super) fn invalid(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
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

/// One subscription's fields, checked as SPEC section 13 says, with the node's `[consumers]`
/// defaults filled in: the one check of the config's tables and of the API's bodies.
pub fn validate(
    s: &SubscriptionSettings,
    consumers: &ConsumerSettings,
    downstream_mode: DeliveryMode,
) -> Result<Subscription, FieldError> {
    if !valid_name(&s.name) {
        return Err(invalid(
            "name",
            format!(
                "`{}` is not a subscription name: lowercase letters, digits and `-`, \
                 starting with a letter or digit, at most 63 characters",
                s.name
            ),
        ));
    }
    one(s, consumers, downstream_mode)
}

fn one(
    s: &SubscriptionSettings,
    consumers: &ConsumerSettings,
    downstream_mode: DeliveryMode,
) -> Result<Subscription, FieldError> {
    let only = |field: &str, set: bool, kind: &str| {
        if set {
            Err(invalid(field, format!("is for kind `{kind}` only")))
        } else {
            Ok(())
        }
    };
    for (field, set) in [
        ("url", s.url.is_some()),
        ("timeout_ms", s.timeout_ms.is_some()),
        ("ca_file", s.ca_file.is_some()),
        ("rate_per_second", s.rate_per_second.is_some()),
        ("concurrency", s.concurrency.is_some()),
    ] {
        only(
            field,
            set && !s.kind.is_call_out(),
            "http`, `nats` or `amqp",
        )?;
    }
    only(
        "signing_secret",
        s.signing_secret.is_some() && s.kind != Kind::Http,
        "http",
    )?;
    for (field, set) in [
        ("subject", s.subject.is_some()),
        ("stream", s.stream.is_some()),
        ("creds_file", s.creds_file.is_some()),
    ] {
        only(field, set && s.kind != Kind::Nats, "nats")?;
    }
    for (field, set) in [
        ("exchange", s.exchange.is_some()),
        ("routing_key", s.routing_key.is_some()),
    ] {
        only(field, set && s.kind != Kind::Amqp, "amqp")?;
    }
    only("token", s.token.is_some() && s.kind != Kind::Pull, "pull")?;
    let sources = match (&s.sources, s.kind) {
        (None, Kind::Downstream) => Some(vec![RESERVED_SOURCE.to_string()]),
        (None, _) => None,
        (Some(list), kind) => {
            if list.is_empty() {
                return Err(invalid("sources", "an empty list matches no event"));
            }
            for source in list {
                crate::domain::SourceName::parse(source)
                    .map_err(|e| invalid("sources", format!("`{source}`: {e}")))?;
                let reserved = source == RESERVED_SOURCE;
                if reserved != (kind == Kind::Downstream) {
                    return Err(invalid(
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
            return Err(invalid("types", "an empty list matches no event"));
        }
        for glob in types {
            if glob.trim().is_empty()
                || glob.chars().any(|c| c.is_control() || c == '[' || c == ']')
            {
                return Err(invalid(
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
        return Err(invalid("max_attempts", "must be at least 1"));
    }
    let backoff_base_ms = s.backoff_base_ms.unwrap_or(consumers.backoff_base_ms);
    let backoff_max_ms = s.backoff_max_ms.unwrap_or(consumers.backoff_max_ms);
    if backoff_max_ms > crate::domain::MAX_BACKOFF_MS {
        return Err(invalid(
            "backoff_max_ms",
            format!(
                "must be at most {} (30 days)",
                crate::domain::MAX_BACKOFF_MS
            ),
        ));
    }
    if backoff_base_ms > backoff_max_ms {
        return Err(invalid("backoff_base_ms", "must not exceed backoff_max_ms"));
    }
    let http = match s.kind {
        kind if kind.is_call_out() => Some(super::target::http_target(s, consumers)?),
        _ => None,
    };
    let ordering = ordering(s)?;
    let filter = s
        .filter
        .as_ref()
        .map(super::filter::Filter::parse)
        .transpose()
        .map_err(|e| invalid("filter", e.to_string()))?;
    let transform = match &s.transform {
        None => None,
        Some(_) if !s.kind.takes_transform() => {
            return Err(invalid(
                "transform",
                format!(
                    "kind `{}` delivers nothing to reshape: a transform is for `http`, `pull`, \
                     `nats` and the other delivering kinds",
                    s.kind.as_str()
                ),
            ));
        }
        Some(code) => {
            Some(crate::transform::Transform::parse(code).map_err(|m| invalid("transform", m))?)
        }
    };
    let token = match &s.token {
        Some(token) if token.len() < MIN_TOKEN_LEN || token.chars().any(char::is_whitespace) => {
            return Err(invalid(
                "token",
                format!(
                    "must be at least {MIN_TOKEN_LEN} characters without spaces (omit it to have \
                     one generated and kept under the data directory)"
                ),
            ));
        }
        token => token.as_deref().map(Secret::new),
    };
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
        http,
        token,
        ordering,
        filter,
        transform,
    })
}

/// `ordered_by` (a JSON pointer into the body) and `on_failure`, checked.
fn ordering(s: &SubscriptionSettings) -> Result<Option<super::Ordering>, FieldError> {
    let Some(pointer) = &s.ordered_by else {
        if s.on_failure.is_some() {
            return Err(invalid(
                "on_failure",
                "is for an ordered subscription (ordered_by) only",
            ));
        }
        return Ok(None);
    };
    if s.kind == Kind::Downstream {
        return Err(invalid(
            "ordered_by",
            "the submission API's requests are not ordered by key",
        ));
    }
    let path = super::Ordering::parse_pointer(pointer).map_err(|m| invalid("ordered_by", m))?;
    Ok(Some(super::Ordering {
        pointer: pointer.clone(),
        path,
        on_failure: s.on_failure.unwrap_or_default(),
    }))
}
