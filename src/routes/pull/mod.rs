//! The routes of `pull` subscriptions (SPEC section 13): claim, ack, extend, each behind the
//! subscription's own token (never the admin token).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt as _;

mod types;

pub use types::*;

use crate::domain::time::{now_ms, rfc3339};
use crate::pull::{self, AckOutcome, Held, Puller};
use crate::routes::openapi::ErrorBody;
use crate::routes::{ApiError, AppState, blocking};
use crate::store::{Finish, Finished};
use crate::telemetry::Traces;

/// The longest `error` an ack may carry.
const MAX_ERROR_LEN: usize = 4_096;
/// Requests are small: tokens and numbers.
const BODY_LIMIT: usize = 1 << 20;

/// The named pull subscription, if the request carries its token. A name no pull
/// subscription has answers 401 like a wrong token: which names exist is told to no one
/// before a token is checked.
async fn puller(req: &HttpRequest, state: &AppState, name: &str) -> Result<Arc<Puller>, ApiError> {
    let token = crate::routes::auth::bearer(req);
    let found = state.served.puller(name);
    if let (Some(puller), Some(token)) = (found, token)
        && puller.authorizes(token).await
    {
        return Ok(puller);
    }
    Err(crate::routes::auth::refused(token.is_some()).await)
}

fn invalid(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::InvalidRequest(format!("{field}: {message}"))
}

/// The named subscription (its token checked first) and the request's JSON body.
async fn read<T: serde::de::DeserializeOwned>(
    req: &HttpRequest,
    name: &str,
    payload: web::Payload,
    state: &AppState,
) -> Result<(Arc<Puller>, T), ApiError> {
    let puller = puller(req, state, name).await?;
    let body = crate::routes::body::read_limited(req, payload, BODY_LIMIT).await?;
    Ok((puller, crate::routes::body::parse_json(&body)?))
}

fn check_lease(lease_ms: i64) -> Result<(), ApiError> {
    if pull::LEASE_MS.contains(&lease_ms) {
        return Ok(());
    }
    Err(invalid(
        "lease_ms",
        format!(
            "must be between {} and {}",
            pull::LEASE_MS.start(),
            pull::LEASE_MS.end()
        ),
    ))
}

/// Claim due events of the subscription, each leased to the caller until it is acked, its
/// lease is extended, or the lease runs out (then it is claimed again; an `at-most-once`
/// subscription abandons it). With `wait_ms`, the answer comes as soon as work is committed,
/// or with no claims at the end of the wait (or when the service shuts down).
#[utoipa::path(post, path = "/subscriptions/{name}/claim",
    operation_id = "claimEvents", tag = "pull", security(("bearer" = [])),
    params(("name" = String, Path)),
    request_body(content = ClaimRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The claims, possibly none", body = Claims),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: a field out of range, named", body = ErrorBody),
    ))]
pub async fn claim(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (puller, asked): (_, ClaimRequest) = read(&req, &path, payload, &state).await?;
    let max = asked.max.unwrap_or(100);
    if !(1..=pull::MAX_CLAIM as u64).contains(&max) {
        return Err(invalid(
            "max",
            format!("must be between 1 and {}", pull::MAX_CLAIM),
        ));
    }
    // The default is the service's lease, within what a client may ask for: `lease_seconds`
    // may be longer than a pull lease can be, and a client that sent no `lease_ms` must not be
    // refused for one it never sent.
    let lease_ms = asked.lease_ms.unwrap_or_else(|| {
        state
            .settings
            .consumers
            .lease_ms()
            .clamp(*pull::LEASE_MS.start(), *pull::LEASE_MS.end())
    });
    check_lease(lease_ms)?;
    let wait_ms = asked.wait_ms.unwrap_or(0);
    if wait_ms > pull::MAX_WAIT_MS {
        return Err(invalid(
            "wait_ms",
            format!("must be between 0 and {}", pull::MAX_WAIT_MS),
        ));
    }
    if puller.session.as_ref().is_some_and(|seen| seen.due()) {
        // A session that claims is alive (see `pull::session`).
        let id = puller.id;
        blocking(&state, move |s| s.session_seen(id, now_ms())).await?;
    }
    let worker = format!("{}-pull-{}", state.worker_name, puller.sub.name);
    let max = max as usize;
    let claim_started = SystemTime::now();
    let claims = pull::claim_once(&state.store, &puller, &worker, max, lease_ms).await?;
    if !claims.is_empty() || wait_ms == 0 {
        let claimed = (claim_started, SystemTime::now());
        return Ok(HttpResponse::Ok().json(render(&puller, claims, &state.traces, claimed)));
    }
    // Nothing yet: wait, streaming whitespace until the answer (see `pull::wait_for_claims`).
    let wait = pull::Wait {
        store: Arc::clone(&state.store),
        puller: Arc::clone(&puller),
        worker,
        max,
        lease_ms,
        until: tokio::time::Instant::now() + Duration::from_millis(wait_ms),
        queued: Arc::clone(&state.queued),
        stopping: state.stopping.clone(),
    };
    let traces = state.traces.clone();
    let body = pull::wait_for_claims(wait).map(move |step| {
        Ok::<_, std::convert::Infallible>(match step {
            pull::Waited::Heartbeat => web::Bytes::from_static(b" "),
            pull::Waited::Claims(claims) => {
                // The claim that found them ended just now; its start is not kept.
                let now = SystemTime::now();
                let answer = render(&puller, claims, &traces, (now, now));
                web::Bytes::from(serde_json::to_vec(&answer).unwrap_or_default())
            }
        })
    });
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .streaming(body))
}

/// The answer to a claim (and the count of what it claimed), each claim with its trace
/// context (`claimed`: when the claim statement started and ended).
fn render(
    puller: &Puller,
    claims: Vec<crate::store::Claimed>,
    traces: &Traces,
    claimed: (SystemTime, SystemTime),
) -> Claims {
    puller.count("claimed", claims.len());
    let claims = claims
        .into_iter()
        .map(|c| {
            let shown = pull::body::encode(c.content_type.as_deref(), &c.payload);
            let traceparent = traces.pull_claim(&c, &puller.sub.name, claimed);
            ClaimView {
                token: puller.token(&c),
                source: c.claim.source,
                event_id: c.claim.event_id,
                event_type: c.event_type,
                attempt: c.claim.attempt,
                received_at: rfc3339(c.received_at),
                lease_until: rfc3339(c.claimed_until),
                content_type: c.content_type,
                body: shown.body,
                body_base64: shown.body_base64,
                traceparent,
            }
        })
        .collect();
    Claims { claims }
}

/// The tokens of a request, checked before anything changes: each must have been issued by
/// this subscription.
fn held_all<'a>(
    puller: &Puller,
    tokens: impl Iterator<Item = (String, &'a str)>,
) -> Result<Vec<Held>, ApiError> {
    tokens
        .map(|(field, token)| {
            puller
                .held(token)
                .ok_or_else(|| invalid(&field, "is not a claim token of this subscription"))
        })
        .collect()
}

fn check_count(field: &str, n: usize) -> Result<(), ApiError> {
    if n == 0 || n > pull::MAX_CLAIM {
        return Err(invalid(
            field,
            format!("must hold 1 to {} entries", pull::MAX_CLAIM),
        ));
    }
    Ok(())
}

/// Say what became of claimed events, fenced by each claim: `done` completes, `retry` comes
/// back after the backoff (failed once the subscription's `max_attempts` are spent), `fail`
/// fails it for ops, `release` gives it back untouched. A claim no longer held answers
/// `applied: false` without failing the rest of the batch.
#[utoipa::path(post, path = "/subscriptions/{name}/ack",
    operation_id = "ackEvents", tag = "pull", security(("bearer" = [])),
    params(("name" = String, Path)),
    request_body(content = AckRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One result per entry, in order", body = AckResults),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: a field out of range or a token never issued, named; nothing changed", body = ErrorBody),
    ))]
pub async fn ack(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (puller, asked): (_, AckRequest) = read(&req, &path, payload, &state).await?;
    check_count("results", asked.results.len())?;
    for (i, item) in asked.results.iter().enumerate() {
        if item.error.as_ref().is_some_and(|e| e.len() > MAX_ERROR_LEN) {
            return Err(invalid(
                &format!("results[{i}].error"),
                format!("must be at most {MAX_ERROR_LEN} bytes"),
            ));
        }
        if item
            .retry_after_ms
            .is_some_and(|ms| !(0..=crate::config::MAX_BACKOFF_MS as i64).contains(&ms))
        {
            return Err(invalid(
                &format!("results[{i}].retry_after_ms"),
                format!("must be between 0 and {}", crate::config::MAX_BACKOFF_MS),
            ));
        }
    }
    let held = held_all(
        &puller,
        asked
            .results
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("results[{i}].token"), r.token.as_str())),
    )?;
    // One claim twice in a batch is applied once, the first time, and the later entries are
    // answered `lease_lost` (the claim is finished by then), on both stores: PostgreSQL's one
    // statement over the whole batch does not see the batch's own first write, and applied
    // both (SQLite's statements, one after the other, answered as here).
    let mut seen = std::collections::HashSet::with_capacity(held.len());
    let first: Vec<bool> = held
        .iter()
        .map(|h| {
            seen.insert((
                h.claim.seq,
                h.claim.subscription,
                h.claim.claim_token.clone(),
            ))
        })
        .collect();
    let now = now_ms();
    let items: Vec<Finish> = held
        .iter()
        .zip(&asked.results)
        .zip(&first)
        .filter(|(_, first)| **first)
        .map(|((h, r), _)| Finish {
            claim: h.claim.clone(),
            next: puller.next(h, r.outcome, r.error.as_deref(), r.retry_after_ms, now),
        })
        .collect();
    let mut applied = blocking(&state, move |s| s.finish(&items, now))
        .await?
        .into_iter();
    let finished: Vec<Finished> = first
        .iter()
        .map(|&first| match first {
            true => applied.next().unwrap_or(Finished::LeaseLost),
            false => Finished::LeaseLost,
        })
        .collect();
    if asked
        .results
        .iter()
        .any(|r| matches!(r.outcome, AckOutcome::Release | AckOutcome::Retry))
    {
        state.queued.notify_waiters();
    }
    let results = asked
        .results
        .into_iter()
        .zip(finished)
        .map(|(r, f)| {
            let status = match f {
                Finished::LeaseLost => None,
                Finished::Completed { .. } => Some("completed"),
                Finished::Retrying => Some("pending"),
                Finished::Failed => Some("failed"),
            };
            puller.acked(r.outcome, status.is_some());
            AckResult {
                token: r.token,
                applied: status.is_some(),
                status,
                reason: status.is_none().then_some("lease_lost"),
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(AckResults { results }))
}

/// Move claims' leases to `lease_ms` from now, for a client that needs longer. A claim no
/// longer held is not extended (`lease_lost`); the others are.
#[utoipa::path(post, path = "/subscriptions/{name}/extend",
    operation_id = "extendClaims", tag = "pull", security(("bearer" = [])),
    params(("name" = String, Path)),
    request_body(content = ExtendRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One result per token, in order", body = ExtendResults),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: a field out of range or a token never issued, named; nothing changed", body = ErrorBody),
    ))]
pub async fn extend(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (puller, asked): (_, ExtendRequest) = read(&req, &path, payload, &state).await?;
    check_count("tokens", asked.tokens.len())?;
    check_lease(asked.lease_ms)?;
    let held = held_all(
        &puller,
        asked
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("tokens[{i}]"), t.as_str())),
    )?;
    let claims: Vec<_> = held.into_iter().map(|h| h.claim).collect();
    let lease_ms = asked.lease_ms;
    let until = blocking(&state, move |s| {
        s.extend_claims(&claims, lease_ms, now_ms())
    })
    .await?;
    let results = asked
        .tokens
        .into_iter()
        .zip(until)
        .map(|(token, until)| ExtendResult {
            token,
            extended: until.is_some(),
            lease_until: until.map(rfc3339),
            reason: until.is_none().then_some("lease_lost"),
        })
        .collect();
    Ok(HttpResponse::Ok().json(ExtendResults { results }))
}
