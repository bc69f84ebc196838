//! Subscriptions (SPEC section 13): named consumers, each with a route and a kind. Every stored
//! event is handled once per subscription whose route matches it, with its own state.
//!
//! The config's `[[subscriptions]]` become [`Subscription`]s here, validated; with none, the
//! implicit three of earlier versions apply ([`implicit`]). The store keeps them by name (and
//! an id it assigns), and fans each event out to the ones that match when it is first claimed.

use serde::Deserialize;

use crate::config::{ConfigError, ConsumerSettings, Settings};
use crate::domain::{DeliveryMode, RESERVED_SOURCE};
use crate::handlers::ORDER_COMPLETED;

/// What a subscription does with its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Http,
    Pull,
    LoyaltyCredit,
    Audit,
    Downstream,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Http => "http",
            Kind::Pull => "pull",
            Kind::LoyaltyCredit => "loyalty-credit",
            Kind::Audit => "audit",
            Kind::Downstream => "downstream",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Http,
            Kind::Pull,
            Kind::LoyaltyCredit,
            Kind::Audit,
            Kind::Downstream,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }

    /// Which claim path serves it: 0, in-process effects claimed in batches by the workers; 1,
    /// calls to an external system claimed one at a time by their own workers.
    pub fn lane(self) -> i64 {
        match self {
            Kind::LoyaltyCredit | Kind::Audit => 0,
            Kind::Downstream | Kind::Http | Kind::Pull => 1,
        }
    }
}

/// Which events a subscription takes: by source and by type glob (`*` any run of characters,
/// `?` one). `except_types` is for the implicit `audit` ("every other event") only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Route {
    /// `None`: every source but `requests` (the submission API's, which only `downstream`
    /// takes).
    pub sources: Option<Vec<String>>,
    /// `None`: every type.
    pub types: Option<Vec<String>>,
    pub except_types: Vec<String>,
}

impl Route {
    pub fn matches(&self, source: &str, event_type: &str) -> bool {
        let source_ok = match &self.sources {
            None => source != RESERVED_SOURCE,
            Some(list) => list.iter().any(|s| s == source),
        };
        source_ok
            && self
                .types
                .as_ref()
                .is_none_or(|globs| globs.iter().any(|g| glob_matches(g, event_type)))
            && !self.except_types.iter().any(|t| t == event_type)
    }

    /// The route as the API shows it.
    pub fn to_json(&self) -> serde_json::Value {
        let mut route = serde_json::json!({
            "sources": self.sources,
            "types": self.types,
        });
        if !self.except_types.is_empty() {
            route["except_types"] = serde_json::json!(self.except_types);
        }
        route
    }
}

/// `*` matches any run of characters (also none), `?` exactly one; everything else itself.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let (g, t): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    // The classic two-pointer walk with one backtrack point: linear in practice.
    let (mut gi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == t[ti]) {
            gi += 1;
            ti += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some((gi, ti));
            gi += 1;
        } else if let Some((sg, st)) = star {
            gi = sg + 1;
            ti = st + 1;
            star = Some((sg, st + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == '*')
}

/// A subscription as the running service knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub name: String,
    pub kind: Kind,
    pub route: Route,
    pub mode: DeliveryMode,
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}

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

/// The three subscriptions of a config that names none (SPEC section 13), which is also what
/// every database written before subscriptions existed was handled by.
pub fn implicit(settings: &Settings) -> Vec<Subscription> {
    implicit_with(&settings.consumers, settings.downstream.mode)
}

/// [`implicit`], from the settings it reads.
pub fn implicit_with(c: &ConsumerSettings, downstream_mode: DeliveryMode) -> Vec<Subscription> {
    let with = |name: &str, kind: Kind, route: Route, mode: DeliveryMode| Subscription {
        name: name.into(),
        kind,
        route,
        mode,
        max_attempts: c.max_attempts,
        backoff_base_ms: c.backoff_base_ms,
        backoff_max_ms: c.backoff_max_ms,
    };
    vec![
        with(
            "loyalty",
            Kind::LoyaltyCredit,
            Route {
                types: Some(vec![ORDER_COMPLETED.into()]),
                ..Route::default()
            },
            DeliveryMode::AtLeastOnce,
        ),
        with(
            "downstream",
            Kind::Downstream,
            Route {
                sources: Some(vec![RESERVED_SOURCE.into()]),
                ..Route::default()
            },
            downstream_mode,
        ),
        with(
            "audit",
            Kind::Audit,
            Route {
                except_types: vec![ORDER_COMPLETED.into()],
                ..Route::default()
            },
            DeliveryMode::AtLeastOnce,
        ),
    ]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_written() {
        for (glob, text, expected) in [
            ("invoice.*", "invoice.paid", true),
            ("invoice.*", "invoice.", true),
            ("invoice.*", "invoices.paid", false),
            ("*", "", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*.paid", "invoice.paid", true),
            ("*.paid", "invoice.paid.x", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("charge.refunded", "charge.refunded", true),
            ("charge.refunded", "charge.refundedX", false),
        ] {
            assert_eq!(glob_matches(glob, text), expected, "{glob} on {text}");
        }
    }

    #[test]
    fn the_implicit_three_partition_every_event() {
        let subs = implicit(&Settings::default());
        for (source, event_type, expected) in [
            ("shop", "order.completed", "loyalty"),
            ("shop", "order.created", "audit"),
            ("requests", "request.submitted", "downstream"),
        ] {
            let matched: Vec<_> = subs
                .iter()
                .filter(|s| s.route.matches(source, event_type))
                .map(|s| s.name.as_str())
                .collect();
            assert_eq!(matched, [expected], "{source}/{event_type}");
        }
    }

    fn refused(text: &str) -> String {
        Settings::from_toml(text, "t", Vec::new())
            .unwrap_err()
            .to_string()
    }

    /// Every mistake of SPEC section 13 is refused at start, naming the key.
    #[test]
    fn bad_subscriptions_are_refused_naming_the_key() {
        let sub = |body: &str| format!("[[subscriptions]]\n{body}\n");
        for (text, key, words) in [
            (
                sub("name = \"a\"\nkind = \"audit\"") + &sub("name = \"a\"\nkind = \"audit\""),
                "subscriptions[1].name",
                "twice",
            ),
            (
                sub("name = \"a\"\nkind = \"mail\""),
                "kind",
                "unknown variant",
            ),
            (
                sub("name = \"Bad_Name\"\nkind = \"audit\""),
                "subscriptions[0].name",
                "lowercase",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\ntypes = [\"\"]"),
                "subscriptions[0].types",
                "cannot match",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\ntypes = [\"[ab]\"]"),
                "subscriptions[0].types",
                "cannot match",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\ntypes = []"),
                "subscriptions[0].types",
                "empty",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\nsources = []"),
                "subscriptions[0].sources",
                "empty",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\nsources = [\"requests\"]"),
                "subscriptions[0].sources",
                "downstream",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\nurl = \"http://x\""),
                "subscriptions[0].url",
                "http",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\ntoken = \"t\""),
                "subscriptions[0].token",
                "pull",
            ),
            (
                sub("name = \"a\"\nkind = \"loyalty-credit\"\nmode = \"at-most-once\""),
                "subscriptions[0].mode",
                "at-least-once",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\nmax_attempts = 0"),
                "subscriptions[0].max_attempts",
                "at least 1",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\nbackoff_base_ms = 9\nbackoff_max_ms = 1"),
                "subscriptions[0].backoff_base_ms",
                "exceed",
            ),
            (
                sub("name = \"a\"\nkind = \"http\""),
                "subscriptions[0].kind",
                "not available",
            ),
            (
                sub("name = \"a\"\nkind = \"audit\"\nfilter = 1"),
                "filter",
                "unknown field",
            ),
        ] {
            let err = refused(&text);
            assert!(err.contains(key) && err.contains(words), "{text}: {err}");
        }
    }

    #[test]
    fn a_config_names_its_subscriptions_with_their_defaults() {
        let text = "[consumers]\nmax_attempts = 4\n[downstream]\nmode = \"at-least-once\"\n\
                    [[subscriptions]]\nname = \"pay\"\nkind = \"downstream\"\n\
                    [[subscriptions]]\nname = \"inv\"\nkind = \"audit\"\n\
                    sources = [\"stripe\"]\ntypes = [\"invoice.*\"]\nmax_attempts = 9\n";
        let settings = Settings::from_toml(text, "t", Vec::new()).unwrap();
        let subs = from_settings(&settings).unwrap();
        assert_eq!(subs.len(), 2);
        assert_eq!(subs[0].route.sources, Some(vec!["requests".to_string()]));
        assert_eq!(subs[0].mode, DeliveryMode::AtLeastOnce);
        assert_eq!(subs[0].max_attempts, 4);
        assert_eq!(subs[1].max_attempts, 9);
        assert!(subs[1].route.matches("stripe", "invoice.paid"));
        assert!(!subs[1].route.matches("shop", "invoice.paid"));
        assert!(!subs[1].route.matches("stripe", "charge.paid"));
        // None named: the implicit three.
        let implicit = from_settings(&Settings::default()).unwrap();
        let names: Vec<_> = implicit.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["loyalty", "downstream", "audit"]);
    }

    #[test]
    fn names_follow_the_pattern() {
        for good in ["a", "billing", "b-2", "0x", &"a".repeat(63)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "-a", "A", "a_b", "a.b", &"a".repeat(64), "a b"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
