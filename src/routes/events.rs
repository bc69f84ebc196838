//! Ops routes over events (SPEC section 5).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::auth::Admin;
use super::body::{parse_json, read_limited};
use super::openapi::ErrorBody;
use super::paging::Paging;
use super::{ApiError, AppState, blocking, views};
use crate::domain::replay::ReplayLine;
use crate::domain::time::{now_ms, parse_rfc3339};
use crate::store::{EventFilter, Page, RetryOutcome, Status};

/// Filters as they arrive in a query string or a bulk-retry body; all text, parsed by hand so
/// that each bad value is a 422 naming its field.
#[derive(Debug, Default, Deserialize)]
pub struct FilterParams {
    status: Option<String>,
    source: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    received_after: Option<String>,
    received_before: Option<String>,
    subscription: Option<String>,
}

/// A subscription named in a filter, a retry or a skip must be one the registry holds (the
/// API's and the sessions' too, not only this node's config's): a misspelt name must not match
/// nothing silently.
pub(super) async fn known_subscription(state: &AppState, name: &str) -> Result<(), ApiError> {
    let live = blocking(state, |s| s.registry()).await?;
    if live.iter().any(|s| s.name == name) {
        return Ok(());
    }
    let names: Vec<_> = live.iter().map(|s| s.name.as_str()).collect();
    Err(ApiError::InvalidRequest(format!(
        "subscription: `{name}` is not a subscription of this service ({})",
        names.join(", ")
    )))
}

pub(super) fn time_param(name: &str, value: &Option<String>) -> Result<Option<i64>, ApiError> {
    value
        .as_deref()
        .map(|v| {
            parse_rfc3339(v).ok_or_else(|| {
                ApiError::InvalidRequest(format!("{name}: `{v}` is not an RFC 3339 time"))
            })
        })
        .transpose()
}

impl FilterParams {
    async fn parse(&self, state: &AppState) -> Result<EventFilter, ApiError> {
        if let Some(name) = &self.subscription {
            known_subscription(state, name).await?;
        }
        // `purged` is not a status of its own: a tombstone is a completed or failed event.
        let purged = self.status.as_deref() == Some("purged");
        let status = self
            .status
            .as_deref()
            .filter(|_| !purged)
            .map(|s| {
                Status::parse(s).ok_or_else(|| {
                    ApiError::InvalidRequest(format!(
                        "status: `{s}` is not one of pending, claimed, completed, failed, \
                         stored, purged"
                    ))
                })
            })
            .transpose()?;
        Ok(EventFilter {
            status,
            source: self.source.clone(),
            event_type: self.event_type.clone(),
            received_after: time_param("received_after", &self.received_after)?,
            received_before: time_param("received_before", &self.received_before)?,
            purged,
            subscription: self.subscription.clone(),
            failed_since: None,
        })
    }
}

/// Paging of `GET /events`, read from the same query string as the filter.
#[derive(Debug, Deserialize)]
struct PageParams {
    limit: Option<String>,
    cursor: Option<String>,
}

/// The filter keys of `GET /events`, `GET /events/export` and bulk retry (`status` aside).
const FILTER_KEYS: [&str; 6] = [
    "status",
    "source",
    "type",
    "received_after",
    "received_before",
    "subscription",
];

/// A misspelt key must not be ignored: `?stauts=failed` would silently list every event.
fn refuse_unknown_keys(req: &HttpRequest, extra: &[&str]) -> Result<(), ApiError> {
    let known = |k: &str| FILTER_KEYS.contains(&k) || extra.contains(&k);
    match form_urlencoded::parse(req.query_string().as_bytes()).find(|(k, _)| !known(k)) {
        Some((key, _)) => Err(ApiError::InvalidRequest(format!(
            "{key}: unknown query parameter; this route takes {}",
            FILTER_KEYS
                .iter()
                .chain(extra)
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        None => Ok(()),
    }
}

pub(super) fn query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| ApiError::InvalidRequest(format!("query string: {e}")))
}

/// Events, newest first by a store-assigned sequence. Every event committed before the first
/// page appears exactly once, however many arrive meanwhile. Unknown query keys are refused.
#[utoipa::path(get, path = "/events",
    operation_id = "listEvents", tag = "ops", security(("bearer" = [])),
    params(
        ("status" = Option<super::openapi::schemas::StatusFilter>, Query, description = "Only events in this state; `purged`: only tombstones (left out otherwise)"),
        ("source" = Option<String>, Query, description = "Only events from this source"),
        ("type" = Option<String>, Query, description = "Only events of this type"),
        ("received_after" = Option<String>, Query, format = DateTime, description = "RFC 3339; first delivery after this time"),
        ("received_before" = Option<String>, Query, format = DateTime, description = "RFC 3339; first delivery before this time"),
        ("subscription" = Option<String>, Query, description = "Only events this subscription takes; `status` is then its state of each"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "Page size (default 50)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of events", body = super::openapi::schemas::EventPage),
        (status = 422, description = "`invalid_request`: a bad or unknown query parameter, named in `message`", body = ErrorBody),
    ))]
pub async fn list(
    _: Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    refuse_unknown_keys(&req, &["limit", "cursor"])?;
    let filter = query::<FilterParams>(&req)?.parse(&state).await?;
    let params: PageParams = query(&req)?;
    let paging = Paging::parse(params.limit.as_deref(), params.cursor.as_deref())?;
    let page = paging.page();
    let mut events = blocking(&state, move |s| s.list_events(&filter, page)).await?;
    let next_cursor = paging.finish(&mut events, |e| e.seq);
    let events: Vec<_> = events.iter().map(views::event).collect();
    Ok(HttpResponse::Ok().json(json!({"events": events, "next_cursor": next_cursor})))
}

/// `GET /events/export`: the replay file of every matching event, newest first, streamed page
/// by page so that a large export is never held in memory whole.
#[utoipa::path(get, path = "/events/export",
    operation_id = "exportEvents", tag = "ops", security(("bearer" = [])),
    params(
        ("status" = Option<super::openapi::schemas::StatusFilter>, Query, description = "Only events in this state; `purged`: only tombstones (left out otherwise)"),
        ("source" = Option<String>, Query, description = "Only events from this source"),
        ("type" = Option<String>, Query, description = "Only events of this type"),
        ("received_after" = Option<String>, Query, format = DateTime, description = "RFC 3339; first delivery after this time"),
        ("received_before" = Option<String>, Query, format = DateTime, description = "RFC 3339; first delivery before this time"),
    ),
    responses(
        (status = 200, description = "One `{source, event_id, type, body | body_base64, content_type?}` a line",
            body = String, content_type = "application/x-ndjson"),
        (status = 422, description = "`invalid_request`: a bad or unknown query parameter", body = ErrorBody),
    ))]
pub async fn export(
    _: Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    refuse_unknown_keys(&req, &[])?;
    let filter = query::<FilterParams>(&req)?.parse(&state).await?;
    // The first page is read before answering, so a store error is still a proper error.
    let first = export_page(&state, &filter, None).await?;
    let pages = futures_util::stream::unfold(
        (Some(Ok::<_, ApiError>(first)), state, filter),
        |(page, state, filter)| async move {
            let (chunk, next) = match page? {
                Ok(ExportPage { lines, next }) => (lines, next),
                Err(e) => return Some((Err(e), (None, state, filter))),
            };
            let following = match next {
                Some(before) => Some(export_page(&state, &filter, Some(before)).await),
                None => None,
            };
            Some((Ok(chunk), (following, state, filter)))
        },
    );
    Ok(HttpResponse::Ok()
        .content_type("application/x-ndjson")
        .streaming(pages))
}

const EXPORT_PAGE: usize = 500;

struct ExportPage {
    lines: web::Bytes,
    next: Option<i64>,
}

async fn export_page(
    state: &AppState,
    filter: &EventFilter,
    before_seq: Option<i64>,
) -> Result<ExportPage, ApiError> {
    let filter = filter.clone();
    let page = Page {
        limit: EXPORT_PAGE,
        before_seq,
    };
    let events = blocking(state, move |s| s.export_events(&filter, page)).await?;
    let mut lines = Vec::new();
    for e in &events {
        let line = ReplayLine::new(
            &e.event.source,
            &e.event.event_id,
            &e.event.event_type,
            &e.payload,
            e.content_type.as_deref(),
        );
        serde_json::to_writer(&mut lines, &line).expect("a replay line serialises");
        lines.push(b'\n');
    }
    let next = (events.len() == EXPORT_PAGE)
        .then(|| events.last().map(|e| e.event.seq))
        .flatten();
    Ok(ExportPage {
        lines: lines.into(),
        next,
    })
}

/// One event with its body and attempt history.
#[utoipa::path(get, path = "/events/{source}/{event_id}",
    operation_id = "getEvent", tag = "ops", security(("bearer" = [])),
    params(("source" = String, Path), ("event_id" = String, Path)),
    responses(
        (status = 200, description = "The event", body = super::views::EventWithHistory),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub async fn show(
    _: Admin,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let detail = {
        let (source, event_id) = (source.clone(), event_id.clone());
        blocking(&state, move |s| {
            let Some(mut detail) = s.event(&source, &event_id)? else {
                return Ok(None);
            };
            let left_out = crate::store::routes::left_out(&s.registry()?, &mut detail);
            Ok(Some((detail, left_out)))
        })
        .await?
    };
    match detail {
        Some((d, left_out)) => {
            let mut view = views::event_detail(&d);
            view.filtered_out = left_out;
            Ok(HttpResponse::Ok().json(view))
        }
        None => Err(not_found(&source, &event_id)),
    }
}

fn not_found(source: &str, event_id: &str) -> ApiError {
    ApiError::NotFound(format!("no event `{event_id}` from source `{source}`"))
}

#[derive(Debug, Deserialize)]
pub struct RetryParams {
    force: Option<bool>,
    subscription: Option<String>,
}

/// `failed -> pending`, due now, with a fresh budget. Pending or claimed: nothing changes.
/// Completed, or abandoned mid-call (at-most-once): 409 unless `force=true`.
#[utoipa::path(post, path = "/events/{source}/{event_id}/retry",
    operation_id = "retryEvent", tag = "ops", security(("bearer" = [])),
    params(("source" = String, Path), ("event_id" = String, Path),
        ("force" = Option<bool>, Query, description = "Run a completed or abandoned event again"),
        ("subscription" = Option<String>, Query, description = "Retry its state in this subscription only (default: each failed one)")),
    responses(
        (status = 200, description = "The event after the retry", body = super::views::Event),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`conflict`: completed or abandoned; needs `force=true`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: `force` is not a boolean", body = ErrorBody),
    ))]
pub async fn retry(
    _: Admin,
    path: web::Path<(String, String)>,
    query: web::Query<RetryParams>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let force = query.force.unwrap_or(false);
    let subscription = query.subscription.clone();
    if let Some(name) = &subscription {
        known_subscription(&state, name).await?;
    }
    let outcome = {
        let (source, event_id) = (source.clone(), event_id.clone());
        blocking(&state, move |s| {
            s.retry(&source, &event_id, subscription.as_deref(), force, now_ms())
        })
        .await?
    };
    match outcome {
        RetryOutcome::NotFound => Err(not_found(&source, &event_id)),
        RetryOutcome::Retried(e) => {
            state.queued.notify_waiters();
            Ok(HttpResponse::Ok().json(views::event(&e)))
        }
        RetryOutcome::Unchanged(e) => Ok(HttpResponse::Ok().json(views::event(&e))),
        RetryOutcome::NeedsForce(e) if e.abandoned => Err(ApiError::Conflict(format!(
            "event `{event_id}` was abandoned during an at-most-once attempt: the downstream \
             may have acted; retry with ?force=true if it did not"
        ))),
        RetryOutcome::Purged(_) => Err(ApiError::Conflict(format!(
            "event `{event_id}` was purged by retention: only its tombstone is left, so it \
             cannot run again"
        ))),
        RetryOutcome::NeedsForce(_) => Err(ApiError::Conflict(format!(
            "event `{event_id}` is completed; retry with ?force=true to run it again"
        ))),
        RetryOutcome::KeyInFlight(_, (held_source, held_id)) => Err(ApiError::Conflict(format!(
            "a later event of the same ordering key, `{held_source}/{held_id}`, is in flight: \
             retry `{event_id}` once it has finished, so that its key's events keep their order"
        ))),
    }
}

/// Retry every failed event that matches the filter (only failed events).
#[utoipa::path(post, path = "/events/retry",
    operation_id = "retryFailedEvents", tag = "ops", security(("bearer" = [])),
    request_body(content = super::openapi::schemas::BulkRetry, description = "The filter; an empty body retries every failed event"),
    responses(
        (status = 200, description = "How many were retried", body = super::openapi::schemas::Retried),
        (status = 400, description = "`invalid_json`: the body is not JSON", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: an unknown field or a bad time, named in `message`", body = ErrorBody),
    ))]
pub async fn retry_bulk(
    _: Admin,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = read_limited(&req, payload, 64 * 1024).await?;
    // A misspelt filter key must not widen a bulk retry to every failed event.
    let fields: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    let known = &FILTER_KEYS[1..];
    if let Some(unknown) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::InvalidRequest(format!(
            "{unknown}: unknown filter; bulk retry takes {} (failed events only)",
            known.join(", ")
        )));
    }
    let params: FilterParams = parse_json(&body)?;
    let filter = params.parse(&state).await?;
    let retried = blocking(&state, move |s| s.retry_failed(&filter, now_ms())).await?;
    if retried > 0 {
        state.queued.notify_waiters();
    }
    Ok(HttpResponse::Ok().json(json!({"retried": retried})))
}

/// Text, parsed by hand, so that `limit=-1` is a message naming `limit`, not serde's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    limit: Option<String>,
}

/// One synchronous drain pass, for ops and tests: claims up to `limit` due events.
#[utoipa::path(post, path = "/events/run",
    operation_id = "runConsumers", tag = "ops", security(("bearer" = [])),
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Most events to claim (default 100)")),
    responses(
        (status = 200, description = "How many were claimed", body = super::openapi::schemas::Claimed),
        (status = 422, description = "`invalid_request`: a bad `limit`", body = ErrorBody),
    ))]
pub async fn run(
    _: Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let params: RunParams = query(&req)?;
    let limit = match params.limit.as_deref() {
        None => 100,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "limit: `{l}` is not an integer from 1 to 1000 (events to claim in this pass)"
                ))
            })?,
    };
    let claimed = state
        .consumer
        .run_once_blocking(format!("{}-run", state.worker_name), limit)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"claimed": claimed})))
}
