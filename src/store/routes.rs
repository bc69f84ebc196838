//! What both stores share about subscriptions' routes: a route as an SQL condition (each store
//! says how a type glob is matched), a route's lists as the JSON text the tables keep, and the
//! states an event not fanned out yet will have.

use crate::store::{Status, SubscriptionState};
use crate::subscriptions::{Route, Subscription};

/// A live subscription as the stores' SQL needs it.
#[derive(Debug, Clone)]
pub struct Live {
    pub id: i64,
    pub name: String,
    pub lane: i64,
    pub route: Route,
    /// It takes the events stored after this seq.
    pub start_after_seq: i64,
    /// Ordering per key (`ordered_by`), if any.
    pub ordered: Option<Ordered>,
    /// What it is and how its claims are decided, as the registry holds them: every node
    /// decides by these, whatever its own config says.
    pub kind: crate::subscriptions::Kind,
    pub rules: Rules,
    /// The kind's settings (an `http` subscription's endpoint), as the registry holds them.
    pub settings: Option<crate::subscriptions::HttpSettings>,
    /// Where it came from: `config`, `api` or `session` (a `listen` session's own).
    pub origin: String,
    /// Conditions on the body, compiled into the fan-out with the route.
    pub filter: Option<crate::subscriptions::filter::Filter>,
    /// The jq program run at delivery, if any.
    pub transform: Option<crate::transform::Transform>,
}

impl Live {
    /// A `listen` session's own subscription: left out of the global lag and stats, removed
    /// when idle (see `store::registry`).
    pub fn is_session(&self) -> bool {
        self.origin == ORIGIN_SESSION
    }

    /// The subscription as the registry holds it, with the secrets given (`signing` and
    /// `token`, as `subscription_secrets` keeps them): what a node serves it by, and what a
    /// `PATCH` is laid over. An `http` one without settings (written before they were kept)
    /// has no target.
    pub fn subscription(&self, signing: Option<&str>, token: Option<&str>) -> Subscription {
        let secrets = signing
            .map(|s| {
                s.split_whitespace()
                    .map(crate::signature::Secret::new)
                    .collect()
            })
            .unwrap_or_default();
        Subscription {
            name: self.name.clone(),
            kind: self.kind,
            route: self.route.clone(),
            mode: self.rules.mode,
            max_attempts: self.rules.max_attempts,
            backoff_base_ms: self.rules.backoff_base_ms,
            backoff_max_ms: self.rules.backoff_max_ms,
            http: match self.kind {
                kind if kind.is_call_out() => self.settings.as_ref().map(|s| s.target(secrets)),
                _ => None,
            },
            token: token.map(crate::signature::Secret::new),
            ordering: self
                .ordered
                .as_ref()
                .map(|o| crate::subscriptions::Ordering {
                    pointer: o.pointer.clone(),
                    path: o.path.clone(),
                    on_failure: o.on_failure,
                }),
            filter: self.filter.clone(),
            transform: self.transform.clone(),
        }
    }
}

/// A subscription's rules for its claims, from the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    pub mode: crate::domain::DeliveryMode,
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}

impl Rules {
    pub fn of(sub: &crate::subscriptions::Subscription) -> Rules {
        Rules {
            mode: sub.mode,
            max_attempts: sub.max_attempts,
            backoff_base_ms: sub.backoff_base_ms,
            backoff_max_ms: sub.backoff_max_ms,
        }
    }

    /// From the registry's columns (checked when they were written; a value out of range
    /// falls back to the default rather than fail every claim).
    pub fn from_row(mode: &str, max_attempts: i64, base_ms: i64, max_ms: i64) -> Rules {
        Rules {
            mode: crate::domain::DeliveryMode::parse(mode)
                .unwrap_or(crate::domain::DeliveryMode::AtLeastOnce),
            max_attempts: u32::try_from(max_attempts).unwrap_or(15).max(1),
            backoff_base_ms: u64::try_from(base_ms).unwrap_or(1000),
            backoff_max_ms: u64::try_from(max_ms).unwrap_or(3_600_000),
        }
    }
}

/// The columns `load` reads for a [`Live`], after `id, name, lane, sources, types,
/// except_types, start_after_seq, ordered_by, on_failure`.
pub const RULE_COLUMNS: &str = "kind, mode, max_attempts, backoff_base_ms, backoff_max_ms, settings, origin, filter, transform";

/// A subscription's filter from its column (JSON, checked when written). One that does not
/// parse (written by a newer version with an operator this one lacks) is logged and left out:
/// the subscription then takes every event its route takes, since an event left out is never
/// offered to it again, while an unwanted one can be acknowledged.
pub fn filter_from_row(
    name: &str,
    text: Option<&str>,
) -> Option<crate::subscriptions::filter::Filter> {
    let text = text?;
    let parsed = serde_json::from_str(text)
        .map_err(|e| e.to_string())
        .and_then(|v| crate::subscriptions::filter::Filter::parse(&v).map_err(|e| e.to_string()));
    match parsed {
        Ok(filter) => Some(filter),
        Err(error) => {
            tracing::error!(subscription = name, %error, "the registry holds a filter this node cannot read: taking every event of its route");
            None
        }
    }
}

/// A subscription's transform from its column (checked when written). One this node cannot
/// compile (a newer jaq's function) is kept as it is: its runs fail each attempt with jaq's
/// message, in the history, until the program or the node changes; never delivered untransformed.
pub fn transform_from_row(text: Option<&str>) -> Option<crate::transform::Transform> {
    text.map(crate::transform::Transform::unchecked)
}

/// The filter as its column keeps it.
pub fn filter_column(sub: &Subscription) -> Option<String> {
    sub.filter.as_ref().map(|f| f.to_json().to_string())
}

/// The origin of a `listen` session's subscription.
pub const ORIGIN_SESSION: &str = "session";

/// An ordered subscription's key (object keys from the top of the body) and failure rule.
#[derive(Debug, Clone)]
pub struct Ordered {
    /// As configured, e.g. `/data/customer_id`.
    pub pointer: String,
    pub path: Vec<String>,
    pub on_failure: crate::subscriptions::OnFailure,
}

impl Ordered {
    /// From the `subscriptions` row's `ordered_by` and `on_failure` (checked at start).
    pub fn from_row(ordered_by: Option<String>, on_failure: &str) -> Option<Ordered> {
        let pointer = ordered_by?;
        let path = crate::subscriptions::Ordering::parse_pointer(&pointer).ok()?;
        Some(Ordered {
            pointer,
            path,
            on_failure: crate::subscriptions::OnFailure::parse(on_failure),
        })
    }

    /// The condition a due state `s` of an ordered subscription meets to be claimed: it has
    /// no key, or no earlier state of its key is unfinished (not completed; with `skip`, not
    /// failed either). `indexed`: SQLite's hint for the inner lookup.
    pub fn may_claim_sql(&self, indexed: &str) -> String {
        let unfinished = match self.on_failure {
            crate::subscriptions::OnFailure::Hold => "e.status <> 'completed'",
            crate::subscriptions::OnFailure::Skip => {
                "e.status <> 'completed' AND e.status <> 'failed'"
            }
        };
        // And none of its key in flight, earlier or later: a later one is in flight only when
        // the earlier one came back after it was claimed (a forced retry, a backfill, a retry
        // that raced a fan-out), and two of a key must never run at once. A probe of the small
        // `events_in_flight` index (migrations sqlite 0014, postgres 0007).
        format!(
            "(s.order_key IS NULL OR (NOT EXISTS (
                SELECT 1 FROM event_state e {indexed}
                 WHERE e.sub = s.sub AND e.order_key = s.order_key AND e.order_key IS NOT NULL
                   AND e.seq < s.seq AND {unfinished})
              AND NOT EXISTS (
                SELECT 1 FROM event_state c
                 WHERE c.sub = s.sub AND c.order_key = s.order_key AND c.order_key IS NOT NULL
                   AND c.status = 'claimed')))"
        )
    }
}

/// How many events a claim fans out: as many as it may claim, since the rows of the claimer's
/// subscriptions start claimed; but at least [`ORDERED_FAN_OUT`] for an ordered subscription's
/// own claim, whose rows all start pending (its claim picks by key): else a client claiming a
/// few at a time behind a held key would fan out a few blocked events per claim, and the other
/// keys' events behind them would wait for as many claims.
pub fn fan_out_room(live: &[Live], whose: crate::store::ClaimFor, room: usize) -> usize {
    match whose {
        crate::store::ClaimFor::Subscription(sub) if ordered(live, sub).is_some() => {
            room.max(ORDERED_FAN_OUT)
        }
        _ => room,
    }
}

/// See [`fan_out_room`].
pub const ORDERED_FAN_OUT: usize = 512;

/// The store's ordered subscription of `id`, if it is one.
pub fn ordered(live: &[Live], id: i64) -> Option<&Ordered> {
    live.iter().find(|l| l.id == id)?.ordered.as_ref()
}

/// Text as an SQL string literal.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A route as an SQL condition on the columns `{alias}source` and `{alias}event_type`;
/// `glob(column, glob)` is the store's match of one type glob.
pub fn route_sql(route: &Route, alias: &str, glob: impl Fn(&str, &str) -> String) -> String {
    let mut parts = Vec::new();
    match &route.sources {
        None => parts.push(format!("{alias}source <> 'requests'")),
        Some(list) => {
            let list: Vec<String> = list.iter().map(|s| quote(s)).collect();
            parts.push(format!("{alias}source IN ({})", list.join(", ")));
        }
    }
    if let Some(globs) = &route.types {
        let column = format!("{alias}event_type");
        let any: Vec<String> = globs.iter().map(|g| glob(&column, g)).collect();
        parts.push(format!("({})", any.join(" OR ")));
    }
    for t in &route.except_types {
        parts.push(format!("{alias}event_type <> {}", quote(t)));
    }
    format!("({})", parts.join(" AND "))
}

/// A route's list as the tables keep it (JSON), `None` for "every".
pub fn json_list(list: &Option<Vec<String>>) -> Option<String> {
    list.as_ref()
        .map(|l| serde_json::to_string(l).unwrap_or_else(|_| "[]".into()))
}

pub fn parse_list(text: Option<String>) -> Option<Vec<String>> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

/// A route from its three columns as the tables keep them.
pub fn route_from(
    sources: Option<String>,
    types: Option<String>,
    except_types: Option<String>,
) -> Route {
    Route {
        sources: parse_list(sources),
        types: parse_list(types),
        except_types: parse_list(except_types).unwrap_or_default(),
    }
}

/// The condition of `GET /events?subscription=` on the `events` view: the events the
/// subscription has a state of (in `status`, when given), and, for pending, those not fanned
/// out yet (`waits`, the store's condition) that its route (`route`, as SQL) takes.
pub fn subscription_clause(sub: &Live, status: Option<Status>, waits: &str, route: &str) -> String {
    let state = match status {
        Some(s) => format!(" AND x.status = '{}'", s.as_str()),
        None => String::new(),
    };
    let stored = format!(
        "EXISTS (SELECT 1 FROM event_state x WHERE x.seq = events.seq AND x.sub = {}{state})",
        sub.id
    );
    match status {
        None | Some(Status::Pending) => format!(
            "({stored} OR ({waits} AND seq > {} AND {route}))",
            sub.start_after_seq
        ),
        Some(_) => stored,
    }
}

/// The live subscriptions whose filter left `detail`'s event out: their route takes it, it was
/// stored after they were added, it has no state of theirs, and their filter does not match
/// its body (the fan-out's decision, made again in Rust). An event waiting for its fan-out is
/// shown with the states it will have ([`waiting_states`], which cannot read the body): the
/// ones its filters will leave out are taken off, and with none left it is `stored`, as the
/// fan-out will make it.
pub fn left_out(live: &[Live], detail: &mut crate::store::EventDetail) -> Vec<String> {
    let event = &mut detail.event;
    let mut names = Vec::new();
    for sub in live {
        let Some(filter) = &sub.filter else { continue };
        let waiting = event
            .subscriptions
            .iter()
            .any(|s| s.name == sub.name && s.attempts == 0 && s.status == Status::Pending);
        let has_state = event.subscriptions.iter().any(|s| s.name == sub.name);
        if event.seq > sub.start_after_seq
            && sub.route.matches(&event.source, &event.event_type)
            && (!has_state || (waiting && event.status == Status::Pending))
            && !filter.matches(&detail.payload)
        {
            names.push(sub.name.clone());
        }
    }
    if !names.is_empty() {
        let before = event.subscriptions.len();
        event.subscriptions.retain(|s| !names.contains(&s.name));
        if before > 0 && event.subscriptions.is_empty() && event.status == Status::Pending {
            event.status = Status::Stored;
            event.next_attempt_at = None;
        }
    }
    names
}

/// The states an event not fanned out yet will have: pending in each live subscription that
/// takes it, due since it was received.
pub fn waiting_states(
    live: &[Live],
    seq: i64,
    source: &str,
    event_type: &str,
    received_at: i64,
) -> Vec<SubscriptionState> {
    live.iter()
        .filter(|s| seq > s.start_after_seq && s.route.matches(source, event_type))
        .map(|s| SubscriptionState {
            name: s.name.clone(),
            status: Status::Pending,
            attempts: 0,
            outcome: None,
            last_error: None,
            abandoned: false,
            next_attempt_at: Some(received_at),
            completed_at: None,
        })
        .collect()
}
