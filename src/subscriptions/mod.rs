//! Subscriptions (SPEC section 13): named consumers, each with a route and a kind. Every stored
//! event is handled once per subscription whose route matches it, with its own state.
//!
//! The config's `[[subscriptions]]` become [`Subscription`]s here, validated; with none, the
//! implicit three of earlier versions apply ([`implicit_with`]). The store keeps them by name (and
//! an id it assigns), and fans each event out to the ones that match when it is first claimed.

use serde::{Deserialize, Serialize};

pub mod amqp;
mod changes;
pub mod filter;
pub mod nats;
mod settings;
mod target;
pub mod template;

pub use changes::{HttpSettings, body_error, kept_secrets, patched};
pub use nats::check_creds_file;
pub use settings::{FieldError, OneOrMany, SubscriptionSettings, valid_name, validate};
pub use target::check_ca_file;

use crate::domain::{ConsumerSettings, DeliveryMode, ORDER_COMPLETED, RESERVED_SOURCE};

/// What a subscription does with its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Http,
    Pull,
    LoyaltyCredit,
    Audit,
    Downstream,
    Nats,
    Amqp,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Http => "http",
            Kind::Pull => "pull",
            Kind::LoyaltyCredit => "loyalty-credit",
            Kind::Audit => "audit",
            Kind::Downstream => "downstream",
            Kind::Nats => "nats",
            Kind::Amqp => "amqp",
        }
    }

    /// Every kind.
    pub const ALL: [Kind; 7] = [
        Kind::Http,
        Kind::Pull,
        Kind::LoyaltyCredit,
        Kind::Audit,
        Kind::Downstream,
        Kind::Nats,
        Kind::Amqp,
    ];

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Who claims its events: the one place that says it (kept in the registry's `claimer`
    /// column, which every claim reads, so that no SQL lists kinds).
    pub fn claimer(self) -> Claimer {
        match self {
            Kind::LoyaltyCredit | Kind::Audit => Claimer::Batch,
            Kind::Downstream => Claimer::OneAtATime,
            Kind::Http | Kind::Nats | Kind::Amqp | Kind::Pull => Claimer::Own,
        }
    }

    /// The lane its state rows carry: 0, in-process effects; 1, calls to an external system.
    pub fn lane(self) -> i64 {
        match self {
            Kind::LoyaltyCredit | Kind::Audit => 0,
            Kind::Downstream | Kind::Http | Kind::Nats | Kind::Amqp | Kind::Pull => 1,
        }
    }

    /// Whether a forwarder of this node delivers it (SPEC section 13's call-out kinds: a POST
    /// to an endpoint, a publish to a NATS JetStream subject or to a RabbitMQ exchange), with
    /// [`HttpTarget`]'s settings.
    pub fn is_call_out(self) -> bool {
        matches!(self, Kind::Http | Kind::Nats | Kind::Amqp)
    }

    /// Whether a circuit breaker stops its claims while its target fails: a forwarder's kinds,
    /// and `downstream` (`handlers::downstream`).
    pub fn has_breaker(self) -> bool {
        self.is_call_out() || self == Kind::Downstream
    }

    /// Whether a `transform` may reshape what it delivers: the kinds that deliver the body to
    /// someone else (a forwarder's, and `pull`), not the in-process effects.
    pub fn takes_transform(self) -> bool {
        self.is_call_out() || self == Kind::Pull
    }

    /// Whether events stored but not fanned out yet are this subscription's backlog: every
    /// kind but `downstream`, which takes submitted requests only (they have their state rows
    /// from their insert). Counted as pending for it in `GET /subscriptions`.
    pub fn waits_on_fan_out(self) -> bool {
        !matches!(self, Kind::Downstream)
    }
}

/// Who claims a subscription's events (see [`Kind::claimer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimer {
    /// The node's consumer workers, in batches committed together (in-process effects).
    Batch,
    /// The node's consumer workers, one event at a time (a call that must not be repeated).
    OneAtATime,
    /// A worker of its own: a forwarder, or the clients of its pull routes.
    Own,
}

impl Claimer {
    /// As the registry's `claimer` column keeps it.
    pub fn as_str(self) -> &'static str {
        match self {
            Claimer::Batch => "batch",
            Claimer::OneAtATime => "one-at-a-time",
            Claimer::Own => "own",
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
    /// Where a subscription of kind `http`, `nats` or `amqp` delivers its events; `None` for
    /// every other kind.
    pub http: Option<HttpTarget>,
    /// The bearer token of a `pull` subscription's routes; `None` for every other kind, and
    /// until the service fills a generated one in from `data/` ([`token_file`]).
    pub token: Option<crate::signature::Secret>,
    /// Ordering per key (`ordered_by`); `None`: events are handled in any order.
    pub ordering: Option<Ordering>,
    /// Conditions on the body (`filter`); `None`: every event its route takes.
    pub filter: Option<filter::Filter>,
    /// A jq program whose one output is what is delivered (`transform`); `None`: the body as
    /// stored.
    pub transform: Option<crate::transform::Transform>,
}

/// What a failed event of an ordered subscription does to the later events of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// They wait until ops retry it to completion or skip it.
    #[default]
    Hold,
    /// They go on.
    Skip,
}

impl OnFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Hold => "hold",
            OnFailure::Skip => "skip",
        }
    }

    pub fn parse(s: &str) -> OnFailure {
        if s == "skip" {
            OnFailure::Skip
        } else {
            OnFailure::Hold
        }
    }
}

/// Events of one key (the value at a JSON pointer into the body) are handled one at a time, in
/// the order they were stored (SPEC section 13, "Ordering").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordering {
    /// As configured, e.g. `/data/customer_id`.
    pub pointer: String,
    /// Its segments, unescaped: object keys from the top of the body.
    pub path: Vec<String>,
    pub on_failure: OnFailure,
}

impl Ordering {
    /// The object keys a JSON pointer names (RFC 6901: `/a/b`, `~1` for `/`, `~0` for `~`).
    /// Array positions are refused: a key is a field of an object, the same on every store.
    pub fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err("must be a JSON pointer into the body, such as `/data/customer_id`".into());
        };
        rest.split('/')
            .map(|raw| {
                let segment = raw.replace("~1", "/").replace("~0", "~");
                if segment.is_empty() || raw.replace("~1", "").replace("~0", "").contains('~') {
                    Err(format!(
                        "`{pointer}`: an empty segment or a `~` not followed by 0 or 1"
                    ))
                } else if segment.chars().all(|c| c.is_ascii_digit()) {
                    Err(format!(
                        "`{pointer}`: `{segment}` looks like an array position; a key is a \
                         field of an object"
                    ))
                } else if segment.chars().any(|c| c.is_control() || c == '"') {
                    Err(format!(
                        "`{pointer}`: a segment with a quote or a control character"
                    ))
                } else {
                    Ok(segment)
                }
            })
            .collect()
    }
}

/// Where a `pull` subscription's generated token is kept, under the data directory.
pub fn token_file(data_dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    data_dir.join(format!("subscription-{name}-token"))
}

/// The endpoint of an `http` subscription and how it is called (SPEC section 13); for a `nats`
/// or `amqp` one, the broker's URL and where it publishes: the kinds share the forwarder's
/// timeout, concurrency, rate and CA, so they share these settings rather than copy them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    /// Never logged or shown: it may hold credentials.
    pub url: String,
    /// `nats` only: the subject template (`{source}`, `{type}`), checked.
    pub subject: Option<String>,
    /// `nats` only: the JetStream stream that must exist before anything is published.
    pub stream: Option<String>,
    /// `nats` only: a creds file (a user JWT and its nkey seed, as `nsc generate creds`
    /// writes one) on the node's disk, read when its publisher connects.
    pub creds_file: Option<String>,
    /// `amqp` only: the exchange (`""`: the default one) and the routing key template
    /// (`{source}`, `{type}`), checked.
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    /// The Standard Webhooks secrets it signs with, each `whsec_` and base64: every one signs
    /// each call (a receiver that knows any of them verifies it), which is how a rotation runs.
    /// Empty until the service fills it from `data/` ([`HttpTarget::secret_file`]).
    pub signing_secrets: Vec<crate::signature::Secret>,
    pub timeout_ms: u64,
    /// A PEM file of the CA an internal endpoint's certificate is verified against (the
    /// system's roots otherwise).
    pub ca_file: Option<String>,
    /// Calls in flight at once.
    pub concurrency: usize,
    /// At most this many calls started per second; 0: no bound.
    pub rate_per_second: u32,
}

impl HttpTarget {
    /// Where a subscription's generated signing secret is kept, under the data directory.
    pub fn secret_file(data_dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        data_dir.join(format!("subscription-{name}-secret"))
    }
}

/// The three subscriptions of a config that names none (SPEC section 13), which is also what
/// every database written before subscriptions existed was handled by: `c` gives their rules,
/// `downstream_mode` the mode of `downstream`.
pub fn implicit_with(c: &ConsumerSettings, downstream_mode: DeliveryMode) -> Vec<Subscription> {
    let with = |name: &str, kind: Kind, route: Route, mode: DeliveryMode| Subscription {
        name: name.into(),
        kind,
        route,
        mode,
        max_attempts: c.max_attempts,
        backoff_base_ms: c.backoff_base_ms,
        backoff_max_ms: c.backoff_max_ms,
        http: None,
        token: None,
        ordering: None,
        filter: None,
        transform: None,
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

#[cfg(test)]
mod tests;
