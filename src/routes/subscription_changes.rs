//! The runtime routes of the registry (SPEC section 13, admin): create, change and remove a
//! subscription through the API. The body is a config table's fields as JSON and goes through
//! the config's own check (`subscriptions::validate`): a field the config refuses is refused
//! here with 422 naming it. Each change moves the registry's version, so every node serves it
//! within a second (see `crate::served`).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::auth::{Admin, SessionMaker};
use super::body::{parse_json, read_limited};
use super::openapi::ErrorBody;
use super::subscription_view::{SubscriptionView, not_found, view_of, written_view};
use super::{ApiError, AppState, blocking};
use crate::domain::time::now_ms;
use crate::store::registry::{Created, Updated};
use crate::subscriptions::{
    FieldError, Kind, SubscriptionSettings, body_error, check_ca_file, check_creds_file, patched,
    validate,
};

/// A subscription's body is small: a route, an endpoint, a few numbers.
const BODY_LIMIT: usize = 64 * 1024;

fn refused(e: FieldError) -> ApiError {
    ApiError::InvalidRequest(format!("{}: {}", e.field, e.message))
}

/// The fields of a config's `[[subscriptions]]` table (SPEC section 13), as JSON. For the
/// document only: the body is read as the config's table is, unknown fields refused.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct SubscriptionFields {
    /// `[a-z0-9][a-z0-9-]{0,62}`; not in a `PATCH`.
    name: Option<String>,
    /// `http`, `nats`, `amqp`, `pull`, `loyalty-credit`, `audit`, `downstream`; not in a
    /// `PATCH`.
    kind: Option<String>,
    /// Default: every source but `requests` (which only `downstream` takes).
    sources: Option<Vec<String>>,
    /// Globs on the event type (`*`, `?`); default: every type.
    types: Option<Vec<String>>,
    /// `http`, `nats` and `amqp` only: the endpoint, or the broker's `nats://`, `tls://`,
    /// `amqp://` or `amqps://` URL (shown back as `url_origin` only: its user info, path or
    /// query may be a credential).
    url: Option<String>,
    /// `nats` only: the subject template (`{source}`, `{type}`), e.g. `webhooks.{source}.{type}`.
    subject: Option<String>,
    /// `nats` only: the JetStream stream checked before the first publish.
    stream: Option<String>,
    /// `nats` only: a creds file on the nodes (a user JWT and its nkey seed, as `nsc generate
    /// creds` writes one), for a broker in operator mode.
    creds_file: Option<String>,
    /// `amqp` only: the exchange it publishes to (`""`: the default exchange).
    exchange: Option<String>,
    /// `amqp` only: the routing key template (`{source}`, `{type}`), e.g. `webhooks.{source}`.
    routing_key: Option<String>,
    /// `http` only: a `whsec_` secret; generated (and answered once) when omitted.
    signing_secret: Option<String>,
    /// `http`, `nats` and `amqp` only.
    timeout_ms: Option<u64>,
    /// `http`, `nats` and `amqp` only: a PEM CA file on the nodes.
    ca_file: Option<String>,
    /// `http`, `nats` and `amqp` only: calls or publishes in flight.
    concurrency: Option<u64>,
    /// `http`, `nats` and `amqp` only: 0 = unlimited.
    rate_per_second: Option<u32>,
    /// `at-least-once` or `at-most-once`.
    mode: Option<String>,
    max_attempts: Option<u32>,
    backoff_base_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    /// `pull` only: the bearer token of its routes; generated (and answered once) when omitted.
    token: Option<String>,
    /// A JSON pointer into the body: events of one key in order.
    ordered_by: Option<String>,
    /// `hold` or `skip` (with `ordered_by`).
    on_failure: Option<String>,
    /// Conditions on the body: `{"path":"/data/object/amount","gte":1000}` with `eq`, `ne`,
    /// `in`, `nin`, `gt`, `gte`, `lt`, `lte`, `exists`, `prefix`, combined with `{"all":[…]}`,
    /// `{"any":[…]}`, `{"not":…}` (docs/guides/subscriptions.md).
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    /// A jq program run at delivery (`http`, `pull`, `nats`): its one output is delivered,
    /// as JSON; none completes the event `filtered`; an error or several outputs fail it
    /// (docs/guides/subscriptions.md, "Transformations"). `null` in a `PATCH` removes it.
    transform: Option<String>,
}

/// A subscription just made: as `GET /subscriptions/{name}` shows it, with its generated
/// secret, shown this once.
#[derive(Serialize, ToSchema)]
pub struct CreatedSubscription {
    #[serde(flatten)]
    subscription: SubscriptionView,
    /// `http` made without one: the secret its calls are signed with.
    #[serde(skip_serializing_if = "Option::is_none")]
    signing_secret: Option<String>,
    /// `pull` made without one: the bearer token of its routes.
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RemovedSubscription {
    name: String,
    removed: bool,
    /// Its unfinished states, now completed with outcome `removed`.
    finished: usize,
}

/// The body as a JSON object (400 when it is not JSON, 422 when it is not an object).
async fn object(req: &HttpRequest, payload: web::Payload) -> Result<Map<String, Value>, ApiError> {
    let body = read_limited(req, payload, BODY_LIMIT).await?;
    parse_json(&body)
}

/// A pull token opens its own routes and no others: not the admin token or a submission token
/// (as the config's `check_tokens`). Another subscription's token is refused by the store, in
/// the create's own transaction ([`Created::TokenTaken`]).
fn check_token(state: &AppState, token: Option<&str>) -> Result<(), ApiError> {
    let Some(token) = token else { return Ok(()) };
    let settings = &state.settings;
    let taken = std::iter::once(settings.admin_token.expose())
        .chain(settings.submission_tokens.iter().map(|t| t.expose()))
        .any(|t| t == token);
    if taken {
        return Err(token_taken());
    }
    Ok(())
}

fn token_taken() -> ApiError {
    refused(FieldError {
        field: "token".into(),
        message: "is also the admin token, a submission token or another subscription's \
                  token: give each its own"
            .into(),
    })
}

/// The query of `POST /subscriptions`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    /// A `listen` session's own subscription (origin `session`): kind `pull` only.
    session: Option<bool>,
}

/// Add a subscription (origin `api`: no config's sync or a node's stop removes it; with
/// `session=true`, origin `session`: a `listen` session's, left out of the global lag and
/// stats, removed when the session ends or idles). It takes the events stored from now on
/// (older ones by a backfill). A session may be opened with one of `listen_tokens` instead of
/// the admin token; nothing else may.
#[utoipa::path(post, path = "/subscriptions",
    operation_id = "createSubscription", tag = "ops", security(("bearer" = [])),
    params(("session" = Option<bool>, Query, description = "A `listen` session's own `pull` subscription (origin `session`)")),
    request_body = SubscriptionFields,
    responses(
        (status = 201, description = "The subscription, with its generated secret this once", body = CreatedSubscription),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 409, description = "`conflict`: a live subscription has that name", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`, naming the field", body = ErrorBody),
    ))]
pub async fn create(
    caller: SessionMaker,
    req: HttpRequest,
    query: web::Query<CreateParams>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let fields: SubscriptionSettings =
        serde_path_to_error::deserialize(Value::Object(object(&req, payload).await?))
            .map_err(|e| refused(body_error(e)))?;
    let settings = &state.settings;
    let sub = validate(&fields, &settings.consumers, settings.downstream.mode).map_err(refused)?;
    let session = query.session.unwrap_or(false);
    caller.may(session)?;
    if session && sub.kind != Kind::Pull {
        return Err(refused(FieldError {
            field: "kind".into(),
            message: "a session (`session=true`) is a `pull` subscription".into(),
        }));
    }
    let origin = if session {
        crate::store::routes::ORIGIN_SESSION
    } else {
        "api"
    };
    check_token(&state, sub.token.as_ref().map(|t| t.expose()))?;
    let kind = sub.kind;
    if sub
        .http
        .as_ref()
        .is_some_and(|t| t.signing_secrets.len() > 1)
    {
        return Err(refused(FieldError {
            field: "signing_secret".into(),
            message: "give one: POST /subscriptions/{name}/rotate-secret adds the next".into(),
        }));
    }
    let name = sub.name.clone();
    // Its secret is written with it, in one transaction: no node serves it without one.
    let given = match sub.kind {
        Kind::Http => sub
            .http
            .as_ref()
            .and_then(|t| t.signing_secrets.first())
            .map(|s| s.expose().to_string()),
        _ => sub.token.as_ref().map(|t| t.expose().to_string()),
    };
    let (secrets, made) = state.vault.first_secrets(&name, sub.kind, given.as_deref());
    let written = sub.clone();
    let now = now_ms();
    let created = blocking(&state, move |s| {
        s.create_subscription(&sub, &secrets, origin, now)
    })
    .await?;
    match created {
        Created::Created(_) => {}
        Created::Taken => {
            return Err(ApiError::Conflict(format!(
                "a subscription named `{name}` exists: change it with PATCH, or delete it first"
            )));
        }
        Created::TokenTaken => return Err(token_taken()),
    }
    let (signing_secret, token) = match kind {
        Kind::Http => (made, None),
        _ => (None, made),
    };
    tracing::info!(subscription = %name, "subscription created through the API");
    state.queued.notify_waiters();
    let subscription = match view_of(&state, name).await {
        Ok(view) => view,
        // It is committed, and a generated secret exists nowhere else in plain form: answer
        // from what was written rather than lose the secret behind an error.
        Err(e) => {
            tracing::warn!(subscription = %written.name, error = %e,
                "subscription created, but reading it back failed: answered from what was written");
            written_view(&written, origin, now)
        }
    };
    Ok(HttpResponse::Created().json(CreatedSubscription {
        subscription,
        signing_secret,
        token,
    }))
}

/// Change a subscription: the fields given replace its own (`null`: back to the default),
/// checked as a config's table is; `name` and `kind` stay. It becomes origin `api`: a
/// config that names it no longer changes it.
#[utoipa::path(patch, path = "/subscriptions/{name}",
    operation_id = "updateSubscription", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path)),
    request_body = SubscriptionFields,
    responses(
        (status = 200, description = "The subscription", body = SubscriptionView),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`, naming the field (also `name` and `kind`, which do not change)", body = ErrorBody),
    ))]
pub async fn update(
    _: Admin,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let patch = object(&req, payload).await?;
    // A secret changes by rotation, which keeps the old one valid for a grace: a PATCH that
    // replaced it would cut every receiver or client off at once.
    for field in ["signing_secret", "token"] {
        if patch.contains_key(field) {
            return Err(refused(FieldError {
                field: field.into(),
                message: format!(
                    "changes with POST /subscriptions/{name}/rotate-secret (the old one stays \
                     valid for a grace)"
                ),
            }));
        }
    }
    // Read here, outside the registry's lock; `patched` does not read it again.
    let named = |field: &str| match patch.get(field) {
        Some(Value::String(file)) if !file.is_empty() => Some(file.clone()),
        _ => None,
    };
    if let Some(file) = named("ca_file") {
        check_ca_file(&file).map_err(refused)?;
    }
    if let Some(file) = named("creds_file") {
        check_creds_file(&file).map_err(refused)?;
    }
    let settings = std::sync::Arc::clone(&state.settings);
    let updated = {
        let name = name.clone();
        blocking(&state, move |s| {
            let change = |current: &crate::subscriptions::Subscription| {
                patched(
                    current,
                    &patch,
                    &settings.consumers,
                    settings.downstream.mode,
                )
            };
            s.update_subscription(&name, &change)
        })
        .await?
    };
    match updated {
        Updated::NotFound => Err(not_found(&name)),
        Updated::Refused(e) => Err(refused(e)),
        Updated::Updated(_) => {
            tracing::info!(subscription = %name, "subscription changed through the API");
            state.queued.notify_waiters();
            Ok(HttpResponse::Ok().json(view_of(&state, name).await?))
        }
    }
}

/// Remove a subscription, whatever its origin: its work stops, its unfinished states are
/// completed with outcome `removed`, its history stays readable. A node whose config names
/// it brings it back when it next starts. One of `listen_tokens` removes sessions only (401
/// for any other name, as for a wrong token).
#[utoipa::path(delete, path = "/subscriptions/{name}",
    operation_id = "deleteSubscription", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path)),
    responses(
        (status = 200, description = "Removed", body = RemovedSubscription),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub async fn delete(
    caller: SessionMaker,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let sessions_only = matches!(caller, SessionMaker::Listen);
    let removed = {
        let name = name.clone();
        blocking(&state, move |s| {
            s.remove_subscription(&name, sessions_only, now_ms())
        })
        .await?
    };
    let Some(finished) = removed else {
        // A listen token learns nothing of the subscriptions that are not sessions.
        caller.may(false)?;
        return Err(not_found(&name));
    };
    tracing::info!(subscription = %name, finished, "subscription removed through the API");
    Ok(HttpResponse::Ok().json(RemovedSubscription {
        name,
        removed: true,
        finished,
    }))
}

/// Never the secret (SPEC: secrets appear in this answer only, not in logs).
impl std::fmt::Debug for CreatedSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CreatedSubscription([redacted])")
    }
}
