//! Ops routes over subscriptions (SPEC section 13): list them with their state, counts and
//! lag; pause and resume; hand one the older events it was added after (backfill).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Admin;
use super::events::time_param;
use super::openapi::ErrorBody;
use super::subscription_view::{
    SubscriptionList, SubscriptionView, not_found, registered, view, view_of, with_registry,
};
use super::{ApiError, AppState, blocking};
use crate::domain::time::now_ms;

#[derive(Debug, Serialize, ToSchema)]
pub struct Backfilled {
    /// Events handed to the subscription, pending and due now.
    backfilled: usize,
}

/// Every subscription: live ones in the config's order, removed ones after (but removed
/// `listen` sessions, which would pile up: their states stay in each event's history).
#[utoipa::path(get, path = "/subscriptions",
    operation_id = "listSubscriptions", tag = "ops", security(("bearer" = [])),
    responses((status = 200, description = "The subscriptions", body = SubscriptionList)))]
pub async fn list(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let now = now_ms();
    let subs = blocking(&state, |s| s.subscriptions(true)).await?;
    let registered = registered(&state).await?;
    // A removed session is left out: every `listen` run makes one, and a list of them would
    // grow for ever; its states stay in each event's history under its name.
    let subscriptions: Vec<_> = subs
        .iter()
        .filter(|s| !(s.removed && s.origin == crate::store::routes::ORIGIN_SESSION))
        .map(|s| with_registry(view(s, now), &registered))
        .collect();
    Ok(HttpResponse::Ok().json(SubscriptionList { subscriptions }))
}

async fn one(state: &AppState, name: String) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(view_of(state, name).await?))
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
