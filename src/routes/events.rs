//! Ops routes over events (SPEC section 5).

use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::json;

use super::auth::Admin;
use super::body::{parse_json, read_limited};
use super::{ApiError, AppState, blocking, views};
use crate::domain::replay::ReplayLine;
use crate::domain::time::{now_ms, parse_rfc3339};
use crate::store::{EventFilter, Page, RetryOutcome, Status};

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;

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
}

fn time_param(name: &str, value: &Option<String>) -> Result<Option<i64>, ApiError> {
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
    fn parse(&self) -> Result<EventFilter, ApiError> {
        // `purged` is not a status of its own: a tombstone is a completed or failed event.
        let purged = self.status.as_deref() == Some("purged");
        let status = self
            .status
            .as_deref()
            .filter(|_| !purged)
            .map(|s| {
                Status::parse(s).ok_or_else(|| {
                    ApiError::InvalidRequest(format!(
                        "status: `{s}` is not one of pending, claimed, completed, failed, purged"
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
const FILTER_KEYS: [&str; 5] = [
    "status",
    "source",
    "type",
    "received_after",
    "received_before",
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

fn query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| ApiError::InvalidRequest(format!("query string: {e}")))
}

fn encode_cursor(seq: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("v1:{seq}"))
}

fn decode_cursor(cursor: &str) -> Result<i64, ApiError> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.strip_prefix("v1:").and_then(|n| n.parse().ok()))
        .ok_or_else(|| ApiError::InvalidRequest("cursor: not a cursor this server issued".into()))
}

pub async fn list(
    _: Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    refuse_unknown_keys(&req, &["limit", "cursor"])?;
    let filter = query::<FilterParams>(&req)?.parse()?;
    let params: PageParams = query(&req)?;
    let limit = match params.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!("limit: must be an integer from 1 to {MAX_LIMIT}"))
            })?,
    };
    let before_seq = params.cursor.as_deref().map(decode_cursor).transpose()?;
    // One more than asked tells whether another page exists.
    let page = Page {
        limit: limit + 1,
        before_seq,
    };
    let mut events = blocking(&state, move |s| s.list_events(&filter, page)).await?;
    let next_cursor = if events.len() > limit {
        events.truncate(limit);
        events.last().map(|e| encode_cursor(e.seq))
    } else {
        None
    };
    let events: Vec<_> = events.iter().map(views::event).collect();
    Ok(HttpResponse::Ok().json(json!({"events": events, "next_cursor": next_cursor})))
}

/// `GET /events/export`: the replay file of every matching event, newest first, streamed page
/// by page so that a large export is never held in memory whole.
pub async fn export(
    _: Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    refuse_unknown_keys(&req, &[])?;
    let filter = query::<FilterParams>(&req)?.parse()?;
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

pub async fn show(
    _: Admin,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let detail = {
        let (source, event_id) = (source.clone(), event_id.clone());
        blocking(&state, move |s| s.event(&source, &event_id)).await?
    };
    match detail {
        Some(d) => Ok(HttpResponse::Ok().json(views::event_detail(&d))),
        None => Err(not_found(&source, &event_id)),
    }
}

fn not_found(source: &str, event_id: &str) -> ApiError {
    ApiError::NotFound(format!("no event `{event_id}` from source `{source}`"))
}

#[derive(Debug, Deserialize)]
pub struct RetryParams {
    force: Option<bool>,
}

pub async fn retry(
    _: Admin,
    path: web::Path<(String, String)>,
    query: web::Query<RetryParams>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let force = query.force.unwrap_or(false);
    let outcome = {
        let (source, event_id) = (source.clone(), event_id.clone());
        blocking(&state, move |s| {
            s.retry(&source, &event_id, force, now_ms())
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
    }
}

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
    let filter = params.parse()?;
    let retried = blocking(&state, move |s| s.retry_failed(&filter, now_ms())).await?;
    if retried > 0 {
        state.queued.notify_waiters();
    }
    Ok(HttpResponse::Ok().json(json!({"retried": retried})))
}

#[derive(Debug, Deserialize)]
pub struct RunParams {
    limit: Option<usize>,
}

/// One synchronous drain pass, for ops and tests: claims up to `limit` due events.
pub async fn run(
    _: Admin,
    query: web::Query<RunParams>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::InvalidRequest(
            "limit: must be from 1 to 1000".into(),
        ));
    }
    let claimed = state
        .consumer
        .run_once_blocking(format!("{}-run", state.worker_name), limit)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"claimed": claimed})))
}

pub async fn loyalty(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let customer = path.into_inner();
    let account = blocking(&state, move |s| s.loyalty(&customer)).await?;
    Ok(HttpResponse::Ok().json(json!({
        "customer_id": account.customer_id,
        "balance": account.balance,
        "credits": account.credits,
    })))
}
