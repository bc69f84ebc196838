//! `POST /webhooks/{source}`: verify, store, answer, in the order of SPEC section 3. A 2xx is
//! sent only after the group commit that holds the delivery.

use std::time::Instant;

use actix_web::http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use actix_web::web::BytesMut;
use actix_web::{HttpRequest, HttpResponse, ResponseError as _, web};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::body::read_limited;
use super::openapi::ErrorBody;
use super::rejected::{self, BodyFacts};
use super::{ApiError, AppState, sender};
use crate::config::{MismatchPolicy, SourceSettings, any_contains};
use crate::domain::payload::peek;
use crate::domain::time::{now_ms, now_secs};
use crate::domain::{EventId, NameError};
use crate::signature::{BodyField, Headers, NotAscii};
use crate::store::{EventOrigin, InsertOutcome, NewDelivery};
use crate::telemetry::traces::Receive;

/// W3C trace context: a provider's, continued by the event's spans (see `telemetry::traces`).
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

struct ActixHeaders<'a>(&'a HeaderMap);

/// The headers the schemes read, parsed once: a lookup by `&str` parses and lower-cases the
/// name at every call (measured: about 400 instructions, four or more per delivery).
fn known(name: &str) -> Option<&'static HeaderName> {
    static NAMES: [HeaderName; 15] = [
        HeaderName::from_static("webhook-id"),
        HeaderName::from_static("webhook-timestamp"),
        HeaderName::from_static("webhook-signature"),
        HeaderName::from_static("svix-id"),
        HeaderName::from_static("svix-timestamp"),
        HeaderName::from_static("svix-signature"),
        HeaderName::from_static("stripe-signature"),
        HeaderName::from_static("x-hub-signature-256"),
        HeaderName::from_static("x-github-delivery"),
        HeaderName::from_static("x-github-event"),
        HeaderName::from_static("x-shopify-hmac-sha256"),
        HeaderName::from_static("x-shopify-webhook-id"),
        HeaderName::from_static("x-shopify-topic"),
        HeaderName::from_static("x-signature"),
        HeaderName::from_static("x-event-id"),
    ];
    NAMES.iter().find(|n| n.as_str().eq_ignore_ascii_case(name))
}

impl Headers for ActixHeaders<'_> {
    fn get(&self, name: &str) -> Result<Option<&str>, NotAscii> {
        let value = match known(name) {
            Some(name) => self.0.get(name),
            None => self.0.get(name),
        };
        match value {
            None => Ok(None),
            Some(v) => v.to_str().map(Some).map_err(|_| NotAscii),
        }
    }
}

/// Receive a delivery: verified on the raw body by the source's signature scheme, stored, and
/// answered only after the commit. Which headers count depends on the source's scheme: each
/// header below names its scheme.
#[utoipa::path(post, path = "/webhooks/{source}",
    operation_id = "receiveWebhook", tag = "ingest",
    params(
        ("source" = String, Path, description = "A configured source", example = "shop"),
        ("webhook-id" = Option<String>, Header, description = "standard-webhooks: the event id (also `svix-id`)"),
        ("webhook-timestamp" = Option<String>, Header, description = "standard-webhooks: unix seconds (also `svix-timestamp`)"),
        ("webhook-signature" = Option<String>, Header, description = "standard-webhooks: space-separated `v1,<base64>` of HMAC-SHA256 over `{id}.{timestamp}.{body}` (also `svix-signature`)"),
        ("svix-id" = Option<String>, Header, description = "standard-webhooks, Svix's name for `webhook-id`"),
        ("svix-timestamp" = Option<String>, Header, description = "standard-webhooks, Svix's name for `webhook-timestamp`"),
        ("svix-signature" = Option<String>, Header, description = "standard-webhooks, Svix's name for `webhook-signature`"),
        ("Stripe-Signature" = Option<String>, Header, description = "stripe: `t=<ts>,v1=<hex>[,v1=...]`, HMAC-SHA256 over `{t}.{body}`; the event id is the body's `id`"),
        ("X-Hub-Signature-256" = Option<String>, Header, description = "github: `sha256=<hex>` of HMAC-SHA256 over the body"),
        ("X-GitHub-Delivery" = Option<String>, Header, description = "github: the event id"),
        ("X-GitHub-Event" = Option<String>, Header, description = "github: the event type"),
        ("X-Shopify-Hmac-Sha256" = Option<String>, Header, description = "shopify: base64 HMAC-SHA256 over the body"),
        ("X-Shopify-Webhook-Id" = Option<String>, Header, description = "shopify: the event id"),
        ("X-Shopify-Topic" = Option<String>, Header, description = "shopify: the event type"),
        ("X-Signature" = Option<String>, Header, description = "hmac-sha256: `[sha256=]<hex>` of HMAC-SHA256 over the body"),
        ("X-Event-Id" = Option<String>, Header, description = "hmac-sha256: the event id when the body has no `event_id` (the header is not signed, so the body's wins)"),
    ),
    request_body(description = "The provider's payload: a JSON object (GitHub may form-encode it in `payload`)",
        content(
            (serde_json::Map<String, serde_json::Value> = "application/json"),
            (super::openapi::schemas::GithubForm = "application/x-www-form-urlencoded"),
        )),
    responses(
        (status = 200, description = "Stored (`queued`), or already stored (`duplicate`, with `payload_mismatch` when the body differs)",
            body = super::openapi::schemas::IngestAnswer),
        (status = 400, description = "`invalid_json` (not a JSON object, or an unsupported content type), `missing_event_id`, `invalid_event_id` (longer than 255 characters, a control character, or only dots such as `..`) or `invalid_event_type` (longer than 256 characters)", body = ErrorBody),
        (status = 401, description = "`missing_signature`, `invalid_signature` or `timestamp_out_of_tolerance`", body = ErrorBody),
        (status = 403, description = "`forbidden_sender`: from outside the source's `allow_from`", body = ErrorBody),
        (status = 404, description = "`unknown_source`", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body took longer than `connections.body_timeout_ms`; nothing stored", body = ErrorBody),
        (status = 409, description = "`payload_mismatch`: a different body for a known event, on a source with `on_payload_mismatch = \"reject\"`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: over `body_limit_bytes`", body = ErrorBody),
    ))]
pub async fn receive(
    req: HttpRequest,
    path: web::Path<String>,
    mut payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    // Actix boxes this future for every delivery: the payload goes down by reference and the
    // name is read in place, which keeps the box under 1 KiB, where malloc serves it from its
    // per-thread cache (docs/performance.md, issue 60, sixth look).
    let name = path.as_str();
    let mut body = None;
    let answer = answer(&req, name, &mut payload, &state, &mut body).await;
    // A refusal (not a 503: that is the store's state, not the delivery's) is kept for ops.
    if let Err(e) = &answer
        && e.status_code().is_client_error()
    {
        state
            .rejections
            .record(|| rejected::record(&req, name, e, body.as_ref(), &state.settings));
    }
    answer
}

/// The answer to a delivery to `name`; `body` gets the facts of the body if it was read and
/// refused.
async fn answer(
    req: &HttpRequest,
    name: &str,
    payload: &mut web::Payload,
    state: &AppState,
    body: &mut Option<BodyFacts>,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let trace = state
        .traces
        .receive(req.headers().get(&TRACEPARENT).map(|v| v.as_bytes()));
    let answered = answer_traced(req, name, payload, state, body, &trace, started).await;
    let (event, outcome, status) = match &answered {
        Ok((_, event_id, event_type, outcome)) => (
            Some((event_id.as_str(), event_type.as_str())),
            *outcome,
            200,
        ),
        Err(e) => (None, e.code(), e.status_code().as_u16()),
    };
    trace.end(name, event, outcome, status);
    answered.map(|(answer, ..)| answer)
}

/// [`answer`] within the request's span: the answer, with the event's id, type and outcome.
async fn answer_traced(
    req: &HttpRequest,
    name: &str,
    payload: &mut web::Payload,
    state: &AppState,
    body: &mut Option<BodyFacts>,
    trace: &Receive,
    started: Instant,
) -> Result<(HttpResponse, String, String, &'static str), ApiError> {
    let source = state.settings.source(name).ok_or_else(|| {
        ApiError::UnknownSource(format!("no source named `{name}` is configured"))
    })?;
    if !source.allow_from.is_empty() {
        let sender = sender::address(req, &state.settings);
        if !sender.is_some_and(|ip| any_contains(&source.allow_from, ip)) {
            state.metrics.delivery(&source.name, "forbidden");
            let from = sender.map_or("an address no trusted proxy named".into(), |ip| {
                ip.to_string()
            });
            return Err(ApiError::ForbiddenSender(format!(
                "source `{name}` accepts deliveries only from its allow_from ranges, not from \
                 {from}"
            )));
        }
    }
    let result = store_delivery(req, payload, state, source, body, trace).await;
    let label = match &result {
        Ok((.., InsertOutcome::Queued)) => "queued",
        Ok((.., InsertOutcome::Duplicate)) => "duplicate",
        Ok((.., InsertOutcome::Mismatch | InsertOutcome::MismatchRejected)) => "payload_mismatch",
        Err(_) => "rejected",
    };
    state.metrics.delivery(&source.name, label);
    state
        .metrics
        .observe_ingest(started.elapsed().as_secs_f64());
    let (event_id, event_type, outcome) = result?;
    let (status, queued, payload_mismatch) = match outcome {
        InsertOutcome::Queued => ("queued", true, false),
        InsertOutcome::Duplicate => ("duplicate", false, false),
        InsertOutcome::Mismatch => ("duplicate", false, true),
        InsertOutcome::MismatchRejected => {
            return Err(ApiError::PayloadMismatch(format!(
                "event `{event_id}` was already received with a different body"
            )));
        }
    };
    let body = serde_json::to_vec(&Answer {
        event_id: &event_id,
        status,
        queued,
        payload_mismatch,
    })
    .map_err(|e| ApiError::Internal(e.into()))?;
    let answer = HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, JSON.clone()))
        .body(body);
    Ok((answer, event_id, event_type, label))
}

/// The answer's type, made once: `.json()` makes it from a `Mime` for every answer, a copy
/// into a new allocation (docs/performance.md, eighth look).
static JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The 200 answer of SPEC section 3 (a struct, not `json!`: this is the hot path).
#[derive(Serialize)]
struct Answer<'a> {
    event_id: &'a str,
    status: &'static str,
    queued: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    payload_mismatch: bool,
}

async fn store_delivery(
    req: &HttpRequest,
    payload: &mut web::Payload,
    state: &AppState,
    source: &SourceSettings,
    refused: &mut Option<BodyFacts>,
    trace: &Receive,
) -> Result<(String, String, InsertOutcome), ApiError> {
    // Scoped, so that the body and the delivery, handed on by then, take no room in this
    // future while it waits for the commit (actix boxes it for every delivery).
    let (event_id, event_type, commit, committed) = {
        let body = read_limited(req, payload, state.settings.body_limit_bytes).await?;
        let delivery = verified(req, body, source, refused, trace)?;
        let (event_id, event_type) = (delivery.event_id.clone(), delivery.event_type.clone());
        let commit = trace.step("webhook.commit");
        (event_id, event_type, commit, state.ingest.ingest(delivery))
    };
    let outcome = committed.await;
    commit.end(match &outcome {
        Ok(InsertOutcome::Queued) => "queued",
        Ok(InsertOutcome::Duplicate) => "duplicate",
        Ok(_) => "payload_mismatch",
        Err(_) => "unavailable",
    });
    Ok((event_id, event_type, outcome?))
}

/// The delivery `body` makes once verified, within its `webhook.verify` step; the facts of a
/// refused body go to `refused`.
fn verified(
    req: &HttpRequest,
    body: BytesMut,
    source: &SourceSettings,
    refused: &mut Option<BodyFacts>,
    trace: &Receive,
) -> Result<NewDelivery, ApiError> {
    let verify = trace.step("webhook.verify");
    match check(req, &body, source) {
        Ok(checked) => {
            verify.end("verified");
            Ok(checked.delivery(body, source, trace.traceparent()))
        }
        Err(e) => {
            verify.end(e.code());
            *refused = Some(BodyFacts::of(&body));
            Err(e)
        }
    }
}

/// What a verified, well-formed delivery is: its id, type and content type.
struct Checked {
    event_id: String,
    event_type: String,
    content_type: Option<String>,
}

impl Checked {
    fn delivery(
        self,
        body: BytesMut,
        source: &SourceSettings,
        traceparent: Option<String>,
    ) -> NewDelivery {
        NewDelivery {
            source: source.name.clone(),
            event_id: self.event_id,
            event_type: self.event_type,
            sha256: Sha256::digest(&body).into(),
            payload: body.into(),
            content_type: self.content_type,
            received_at: now_ms(),
            reject_mismatch: source.on_payload_mismatch == MismatchPolicy::Reject,
            origin: EventOrigin::Webhook,
            traceparent,
        }
    }
}

/// The longest event type kept: types are names (`order.completed`), and a type is shown,
/// filtered on and logged with every event.
const MAX_TYPE_CHARS: usize = 256;

/// Signature, timestamp, body and event id, in the order of the checks.
fn check(req: &HttpRequest, body: &[u8], source: &SourceSettings) -> Result<Checked, ApiError> {
    let headers = ActixHeaders(req.headers());
    let verified = source.scheme.verify(
        &headers,
        body,
        &source.secrets,
        now_secs(),
        source.tolerance_seconds,
    )?;
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let fields =
        peek(body, content_type.as_deref()).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let event_id = match (verified.event_id, source.scheme.body_id_field()) {
        // hmac-sha256 signs the body only: anyone holding one signed body could store it under
        // any `X-Event-Id`, so the body's own `event_id`, when it has one, is the id.
        (header, BodyField::EventId) => fields
            .event_id()
            .filter(|id| !id.trim().is_empty())
            .or(header),
        (Some(id), _) => Some(id),
        (None, BodyField::Id) => fields.id(),
        (None, _) => None,
    }
    .ok_or_else(|| {
        ApiError::MissingEventId(format!(
            "the delivery carries no event id: a `{}` source reads it from {}",
            source.scheme.name(),
            source.scheme.event_id_source()
        ))
    })?;
    let event_id = EventId::parse_owned(event_id)
        .map_err(|e| {
            let message = format!(
                "event id {e} (read from {})",
                source.scheme.event_id_source()
            );
            match e {
                NameError::Empty => ApiError::MissingEventId(message),
                _ => ApiError::InvalidEventId(message),
            }
        })?
        .into_string();
    let event_type = if source.scheme.type_from_body() {
        fields.into_event_type()
    } else {
        verified.event_type
    }
    .unwrap_or_default();
    if event_type.chars().count() > MAX_TYPE_CHARS {
        return Err(ApiError::InvalidEventType(format!(
            "the event type is longer than {MAX_TYPE_CHARS} characters"
        )));
    }
    Ok(Checked {
        event_id,
        event_type,
        content_type,
    })
}
