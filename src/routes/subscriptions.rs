//! Ops routes over subscriptions (SPEC section 13): list them with their state, counts and
//! lag; pause and resume; hand one the older events it was added after (backfill).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Admin;
use super::events::time_param;
use super::openapi::ErrorBody;
use super::{ApiError, AppState, blocking};
use crate::domain::time::{now_ms, rfc3339};
use crate::store::SubscriptionInfo;

/// A subscription as ops see it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionView {
    name: String,
    /// `http`, `pull`, `loyalty-credit`, `audit`, `downstream`.
    kind: String,
    route: RouteView,
    /// `active`, `paused` (claims nothing; its events wait), `probing` (an `http`
    /// subscription whose endpoint failed: one event per interval until a call succeeds), or
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
    subscriptions: Vec<SubscriptionView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Backfilled {
    /// Events handed to the subscription, pending and due now.
    backfilled: usize,
}

fn view(s: &SubscriptionInfo, now: i64) -> SubscriptionView {
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
        ordered_by: None,
        on_failure: None,
        filter: None,
        held_keys: None,
    }
}

/// The live subscriptions as the registry holds them (an api-made one's too, which no config
/// names): their ordering and filter.
async fn orderings(state: &AppState) -> Result<Vec<crate::store::routes::Live>, ApiError> {
    blocking(state, |s| s.registry()).await
}

fn with_ordering(
    mut view: SubscriptionView,
    live: &[crate::store::routes::Live],
) -> SubscriptionView {
    if let Some(l) = live.iter().find(|l| l.name == view.name) {
        if let Some(o) = &l.ordered {
            view.ordered_by = Some(o.pointer.clone());
            view.on_failure = Some(o.on_failure.as_str());
        }
        view.filter = l.filter.as_ref().map(|f| f.to_json());
    }
    view
}

/// Every subscription: live ones in the config's order, removed ones after.
#[utoipa::path(get, path = "/subscriptions",
    operation_id = "listSubscriptions", tag = "ops", security(("bearer" = [])),
    responses((status = 200, description = "The subscriptions", body = SubscriptionList)))]
pub async fn list(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let now = now_ms();
    let subs = blocking(&state, |s| s.subscriptions(true)).await?;
    let orderings = orderings(&state).await?;
    let subscriptions: Vec<_> = subs
        .iter()
        .map(|s| with_ordering(view(s, now), &orderings))
        .collect();
    Ok(HttpResponse::Ok().json(SubscriptionList { subscriptions }))
}

async fn one(state: &AppState, name: String) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(view_of(state, name).await?))
}

/// A live subscription as `GET /subscriptions/{name}` shows it.
pub(super) async fn view_of(state: &AppState, name: String) -> Result<SubscriptionView, ApiError> {
    let now = now_ms();
    let subs = blocking(state, |s| s.subscriptions(true)).await?;
    let Some(s) = subs.iter().find(|s| s.name == name && !s.removed) else {
        return Err(not_found(&name));
    };
    let mut view = with_ordering(view(s, now), &orderings(state).await?);
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

pub(super) fn not_found(name: &str) -> ApiError {
    ApiError::NotFound(format!("no subscription `{name}`"))
}

/// One subscription.
#[utoipa::path(get, path = "/subscriptions/{name}",
    operation_id = "getSubscription", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path)),
    responses(
        (status = 200, description = "The subscription", body = SubscriptionView),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub async fn show(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    one(&state, path.into_inner()).await
}

async fn set_paused(
    state: &AppState,
    name: String,
    paused: bool,
) -> Result<HttpResponse, ApiError> {
    let changed = {
        let name = name.clone();
        blocking(state, move |s| s.set_paused(&name, paused)).await?
    };
    if !changed {
        return Err(not_found(&name));
    }
    tracing::info!(subscription = %name, paused, "subscription paused or resumed by ops");
    if !paused {
        state.queued.notify_waiters();
    }
    one(state, name).await
}

/// Claim nothing for it until it is resumed: its events wait (its lag grows); no other
/// subscription is held back.
#[utoipa::path(post, path = "/subscriptions/{name}/pause",
    operation_id = "pauseSubscription", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path)),
    responses(
        (status = 200, description = "The subscription, paused", body = SubscriptionView),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub async fn pause(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    set_paused(&state, path.into_inner(), true).await
}

/// Claim its events again, the ones that waited first.
#[utoipa::path(post, path = "/subscriptions/{name}/resume",
    operation_id = "resumeSubscription", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path)),
    responses(
        (status = 200, description = "The subscription, active", body = SubscriptionView),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub async fn resume(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    set_paused(&state, path.into_inner(), false).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillParams {
    since: Option<String>,
}

/// The required `since` of backfill and recover (an RFC 3339 time), the only parameter.
fn required_since(req: &HttpRequest) -> Result<i64, ApiError> {
    let params: BackfillParams = super::events::query(req)?;
    time_param("since", &params.since)?
        .ok_or_else(|| ApiError::InvalidRequest("since: required (an RFC 3339 time)".into()))
}

/// Hand the subscription the events it matches that were stored at or after `since` and that
/// it never took (stored before it was added): pending, due now. Events it has a state for
/// are left as they are, so a backfill run twice hands nothing twice.
#[utoipa::path(post, path = "/subscriptions/{name}/backfill",
    operation_id = "backfillSubscription", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path),
        ("since" = String, Query, format = DateTime, description = "RFC 3339: events first received at or after this time")),
    responses(
        (status = 200, description = "How many events it was handed", body = Backfilled),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: `since` missing or not an RFC 3339 time", body = ErrorBody),
    ))]
pub async fn backfill(
    _: Admin,
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let since = required_since(&req)?;
    let name = path.into_inner();
    let handed = {
        let name = name.clone();
        blocking(&state, move |s| s.backfill(&name, since, now_ms())).await?
    };
    let Some(backfilled) = handed else {
        return Err(not_found(&name));
    };
    tracing::info!(subscription = %name, backfilled, "backfill by ops");
    if backfilled > 0 {
        state.queued.notify_waiters();
    }
    Ok(HttpResponse::Ok().json(Backfilled { backfilled }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Recovered {
    /// Failed states moved back to pending, due now, with a fresh budget.
    retried: usize,
}

/// After an endpoint's outage (as Svix's recover): retry every failed state of the
/// subscription that failed at or after `since`, by the end of its last attempt. Each goes back
/// to pending with a fresh budget, so a recover run twice retries nothing the first one moved.
/// Abandoned at-most-once states are left for a forced single retry, as a bulk retry leaves
/// them; so is a failed state an ordered key's later event is in flight behind.
#[utoipa::path(post, path = "/subscriptions/{name}/recover",
    operation_id = "recoverSubscription", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path),
        ("since" = String, Query, format = DateTime, description = "RFC 3339: states whose last attempt ended at or after this time")),
    responses(
        (status = 200, description = "How many failed states were retried", body = Recovered),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: `since` missing or not an RFC 3339 time", body = ErrorBody),
    ))]
pub async fn recover(
    _: Admin,
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let since = required_since(&req)?;
    let name = path.into_inner();
    // The live ones, from the store's view of the registry (no count of every state).
    let live = blocking(&state, |s| s.subscription_ids()).await?;
    if !live.iter().any(|(_, n)| *n == name) {
        return Err(not_found(&name));
    }
    let filter = crate::store::EventFilter {
        subscription: Some(name.clone()),
        failed_since: Some(since),
        ..Default::default()
    };
    let retried = blocking(&state, move |s| s.retry_failed(&filter, now_ms())).await?;
    tracing::info!(subscription = %name, retried, "recover by ops");
    if retried > 0 {
        state.queued.notify_waiters();
    }
    Ok(HttpResponse::Ok().json(Recovered { retried }))
}
