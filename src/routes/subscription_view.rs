//! A subscription as ops see it (SPEC section 13, `GET /subscriptions`): the store's counts
//! and state, with the rules and kind settings the registry holds, so that the dashboard's
//! editor can show what a `PATCH` would change. Never a secret, never a whole URL.

use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, AppState, blocking};
use crate::domain::time::{now_ms, rfc3339};
use crate::store::SubscriptionInfo;
use crate::store::routes::Live;

/// A subscription as ops see it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionView {
    name: String,
    /// `http`, `nats`, `amqp`, `pull`, `loyalty-credit`, `audit`, `downstream`.
    kind: String,
    route: RouteView,
    /// `active`, `paused` (claims nothing; its events wait), `probing` (a call-out or
    /// `downstream` subscription whose target failed: one event per interval until it answers), or
    /// `removed` (no longer in the config: its work stopped, its history is kept).
    state: String,
    counts: Counts,
    /// Events waiting for it (pending or claimed).
    lag: i64,
    /// Age of its longest-waiting due event; null when nothing is due.
    #[schema(required = true)]
    oldest_pending_seconds: Option<f64>,
    /// When it was added: it takes the events stored after that (older ones by a backfill).
    #[schema(format = DateTime)]
    created_at: String,
    /// Where it came from: `config` (a node's config file), `api`, `session` (`listen`).
    origin: String,
    /// The live nodes whose config names it. A node restarted with a config that no longer
    /// names it removes it only once no live node's config does: a config that differs
    /// between nodes shows here, and is not acted on.
    declared_by: Vec<String>,
    /// The rules every node decides its claims by, from the registry.
    mode: &'static str,
    max_attempts: u32,
    /// The backoff between its attempts, from the registry (absent only for a removed one).
    #[serde(skip_serializing_if = "Option::is_none")]
    backoff_base_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backoff_max_ms: Option<u64>,
    /// `http`, `nats` and `amqp` only: where it calls or publishes, as scheme, host and port
    /// alone (`https://hooks.example`, `amqps://rabbit.internal:5671`).
    /// The whole URL is never shown: its user info, path or query may be a credential (a
    /// Slack or Discord webhook URL is one). A `PATCH` of `url` replaces it whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    url_origin: Option<String>,
    /// `nats` only: the subject template and the stream checked before the first publish.
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<String>,
    /// `nats` only, when it has one: the creds file it connects with, a path on the nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    creds_file: Option<String>,
    /// `amqp` only: the exchange (`""`: the default one) and the routing key template.
    #[serde(skip_serializing_if = "Option::is_none")]
    exchange: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    routing_key: Option<String>,
    /// `http` only: the settings of its calls (SPEC section 13's names).
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    concurrency: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_per_second: Option<u32>,
    /// `http` only, when it has one: the PEM CA file its endpoint's certificate is checked
    /// against, a path on the nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
    /// Ordering per key: the JSON pointer of the key, and what a failed event does (`hold`:
    /// its key waits; `skip`: its key goes on). Absent for an unordered subscription.
    #[serde(skip_serializing_if = "Option::is_none")]
    ordered_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_failure: Option<&'static str>,
    /// Conditions on the body (SPEC section 13): an event its route takes but this leaves out
    /// gets no state here. Absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    filter: Option<serde_json::Value>,
    /// A jq program whose one output is what is delivered (SPEC section 13). Absent without
    /// one.
    #[serde(skip_serializing_if = "Option::is_none")]
    transform: Option<String>,
    /// In `GET /subscriptions/{name}` of an ordered subscription that holds: the keys held by a
    /// failed event (the oldest 100), until ops retry it to completion or skip it.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_keys: Option<Vec<HeldKeyView>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HeldKeyView {
    key: String,
    /// The failed event that holds it.
    source: String,
    event_id: String,
    #[schema(format = DateTime)]
    #[serde(skip_serializing_if = "Option::is_none")]
    failed_at: Option<String>,
    /// Later events of the key waiting behind it.
    waiting: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RouteView {
    /// Null: every source but `requests`.
    #[schema(required = true)]
    sources: Option<Vec<String>>,
    /// Globs on the event type (`*`, `?`); null: every type.
    #[schema(required = true)]
    types: Option<Vec<String>>,
    /// Types left out (the implicit `audit`: every type but `order.completed`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    except_types: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Counts {
    pending: i64,
    claimed: i64,
    completed: i64,
    failed: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionList {
    pub(super) subscriptions: Vec<SubscriptionView>,
}

pub(super) fn view(s: &SubscriptionInfo, now: i64) -> SubscriptionView {
    let state = if s.removed {
        "removed"
    } else if s.paused {
        "paused"
    } else if s.probe_at.is_some() {
        "probing"
    } else {
        "active"
    };
    SubscriptionView {
        name: s.name.clone(),
        kind: s.kind.clone(),
        route: RouteView {
            sources: s.route.sources.clone(),
            types: s.route.types.clone(),
            except_types: s.route.except_types.clone(),
        },
        state: state.into(),
        counts: Counts {
            pending: s.counts.pending,
            claimed: s.counts.claimed,
            completed: s.counts.completed,
            failed: s.counts.failed,
        },
        lag: s.counts.pending + s.counts.claimed,
        oldest_pending_seconds: s.counts.lag_seconds(now),
        created_at: rfc3339(s.created_at),
        origin: s.origin.clone(),
        declared_by: s.declared_by.clone(),
        mode: s.mode.as_str(),
        max_attempts: s.max_attempts,
        backoff_base_ms: None,
        backoff_max_ms: None,
        url_origin: None,
        subject: None,
        stream: None,
        creds_file: None,
        exchange: None,
        routing_key: None,
        timeout_ms: None,
        concurrency: None,
        rate_per_second: None,
        ca_file: None,
        ordered_by: None,
        on_failure: None,
        filter: None,
        transform: None,
        held_keys: None,
    }
}

/// The live subscriptions as the registry holds them (an api-made one's too, which no config
/// names): the rules and settings a view adds to the counts.
pub(super) async fn registered(state: &AppState) -> Result<Vec<Live>, ApiError> {
    blocking(state, |s| s.registry()).await
}

/// `https://host:port` of a URL: never its user info, path or query.
fn origin_of(url: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    let origin = url.origin();
    if origin.is_tuple() {
        return Some(origin.ascii_serialization());
    }
    // A broker's `nats://` or `tls://` URL has no web origin: its scheme, host and port.
    let host = url.host_str().filter(|h| !h.is_empty())?;
    Some(match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    })
}

pub(super) fn with_registry(view: SubscriptionView, registered: &[Live]) -> SubscriptionView {
    let Some(live) = registered.iter().find(|l| l.name == view.name) else {
        return view;
    };
    let ordered = live
        .ordered
        .as_ref()
        .map(|o| (o.pointer.as_str(), o.on_failure));
    let backoff = (live.rules.backoff_base_ms, live.rules.backoff_max_ms);
    with_rules(
        view,
        ordered,
        (live.filter.as_ref(), live.transform.as_ref()),
        backoff,
        live.settings.as_ref(),
    )
}

/// The rules and kind settings a view adds to the store's counts, from the registry (or from
/// what a create just wrote).
fn with_rules(
    mut view: SubscriptionView,
    ordered: Option<(&str, crate::subscriptions::OnFailure)>,
    (filter, transform): (
        Option<&crate::subscriptions::filter::Filter>,
        Option<&crate::transform::Transform>,
    ),
    (backoff_base_ms, backoff_max_ms): (u64, u64),
    http: Option<&crate::subscriptions::HttpSettings>,
) -> SubscriptionView {
    if let Some((pointer, on_failure)) = ordered {
        view.ordered_by = Some(pointer.to_string());
        view.on_failure = Some(on_failure.as_str());
    }
    view.filter = filter.map(|f| f.to_json());
    view.transform = transform.map(|t| t.as_str().to_string());
    view.backoff_base_ms = Some(backoff_base_ms);
    view.backoff_max_ms = Some(backoff_max_ms);
    if let Some(http) = http {
        view.url_origin = origin_of(&http.url);
        view.subject = http.subject.clone();
        view.stream = http.stream.clone();
        view.creds_file = http.creds_file.clone();
        view.exchange = http.exchange.clone();
        view.routing_key = http.routing_key.clone();
        view.timeout_ms = Some(http.timeout_ms);
        view.concurrency = Some(http.concurrency);
        view.rate_per_second = Some(http.rate_per_second);
        view.ca_file = http.ca_file.clone();
    }
    view
}

/// A live subscription as `GET /subscriptions/{name}` shows it.
pub(super) async fn view_of(state: &AppState, name: String) -> Result<SubscriptionView, ApiError> {
    let now = now_ms();
    let subs = blocking(state, |s| s.subscriptions(true)).await?;
    let Some(s) = subs.iter().find(|s| s.name == name && !s.removed) else {
        return Err(not_found(&name));
    };
    let mut view = with_registry(view(s, now), &registered(state).await?);
    if view.on_failure == Some("hold") {
        let held = blocking(state, move |s| s.held_keys(&name, 100)).await?;
        view.held_keys = Some(
            held.into_iter()
                .map(|h| HeldKeyView {
                    key: h.key,
                    source: h.source,
                    event_id: h.event_id,
                    failed_at: h.failed_at.map(rfc3339),
                    waiting: h.waiting,
                })
                .collect(),
        );
    }
    Ok(view)
}

/// A subscription just written, as the view would show it with nothing handled yet: the answer
/// of a create whose read back failed, so that a generated secret is not lost behind an error.
pub(super) fn written_view(
    sub: &crate::subscriptions::Subscription,
    origin: &str,
    now: i64,
) -> SubscriptionView {
    let info = SubscriptionInfo {
        name: sub.name.clone(),
        kind: sub.kind.as_str().to_string(),
        route: sub.route.clone(),
        paused: false,
        removed: false,
        counts: Default::default(),
        created_at: now,
        probe_at: None,
        origin: origin.to_string(),
        declared_by: Vec::new(),
        mode: sub.mode,
        max_attempts: sub.max_attempts,
    };
    let ordered = sub
        .ordering
        .as_ref()
        .map(|o| (o.pointer.as_str(), o.on_failure));
    let backoff = (sub.backoff_base_ms, sub.backoff_max_ms);
    let http = sub
        .http
        .as_ref()
        .map(crate::subscriptions::HttpSettings::of);
    with_rules(
        view(&info, now),
        ordered,
        (sub.filter.as_ref(), sub.transform.as_ref()),
        backoff,
        http.as_ref(),
    )
}

pub(super) fn not_found(name: &str) -> ApiError {
    ApiError::NotFound(format!("no subscription `{name}`"))
}
