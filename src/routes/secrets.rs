//! A subscription's secret (SPEC section 13): shown to an admin, and rotated with a grace
//! during which the old one keeps working beside the new. Secrets appear in these answers
//! only: never in lists, logs or errors.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Admin;
use super::openapi::ErrorBody;
use super::{ApiError, AppState};
use crate::domain::time::{now_ms, rfc3339};
use crate::secrets::{Rotated, Vault, VaultError};
use crate::store::secrets::{MAX_GRACE_MS, Purpose};

/// The grace when a rotation names none: a day.
const DEFAULT_GRACE_SECONDS: i64 = 86_400;

#[derive(Serialize, ToSchema)]
pub struct SigningSecrets {
    /// The secrets calls are signed with, the current one first, then any still in a
    /// rotation's grace (each signs every call: `webhook-signature: v1,<new> v1,<old>`).
    signing_secrets: Vec<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateRequest {
    /// How long the old secret keeps working beside the new one, in seconds (0 to 2592000,
    /// 30 days; default 86400).
    grace_seconds: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct RotatedSecret {
    name: String,
    /// The new signing secret of an `http` subscription (absent for `pull`).
    #[serde(skip_serializing_if = "Option::is_none")]
    signing_secret: Option<String>,
    /// The new token of a `pull` subscription, shown this once (only its digest is kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    /// Until when the secret before it keeps working.
    #[schema(format = DateTime)]
    previous_valid_until: String,
}

impl From<VaultError> for ApiError {
    fn from(e: VaultError) -> ApiError {
        match e {
            VaultError::NotFound(name) => ApiError::NotFound(format!("no subscription `{name}`")),
            VaultError::Conflict(message) => ApiError::Conflict(message),
            VaultError::Store(e) => e.into(),
            sealed @ VaultError::Sealed(_) => ApiError::Internal(anyhow::Error::new(sealed)),
        }
    }
}

async fn with_vault<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&Vault) -> Result<T, VaultError> + Send + 'static,
) -> Result<T, ApiError> {
    let vault = std::sync::Arc::clone(&state.vault);
    let span = tracing::Span::current();
    web::block(move || span.in_scope(|| f(&vault)))
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("blocking task failed: {e}")))?
        .map_err(ApiError::from)
}

/// The signing secrets of an `http` subscription, for its receiver's configuration. A `pull`
/// subscription's token is kept only as a digest and cannot be shown (409; rotate it for a
/// new one); other kinds have no secret (409).
#[utoipa::path(get, path = "/subscriptions/{name}/secret",
    operation_id = "getSubscriptionSecret", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path)),
    responses(
        (status = 200, description = "The signing secrets, current first", body = SigningSecrets),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`conflict`: a pull subscription (its token is kept as a digest) or a kind without a secret", body = ErrorBody),
    ))]
pub async fn show(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let signing_secrets = with_vault(&state, move |v| v.signing_secrets(&name, now_ms())).await?;
    Ok(HttpResponse::Ok().json(SigningSecrets { signing_secrets }))
}

/// A new secret for the subscription: a signing secret for `http` (the old one keeps signing
/// beside it, Standard Webhooks' multiple signatures, until the grace ends), a token for
/// `pull` (the old one keeps opening its routes until then). Every node uses both within a
/// second, without a restart. A secret given in a node's config is not rotated here (409).
#[utoipa::path(post, path = "/subscriptions/{name}/rotate-secret",
    operation_id = "rotateSubscriptionSecret", tag = "ops", security(("bearer" = [])),
    params(("name" = String, Path)),
    request_body(content = Option<RotateRequest>, description = "Optional; empty or `{}`: a day's grace"),
    responses(
        (status = 200, description = "The new secret, shown once", body = RotatedSecret),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`conflict`: the secret is given in a node's config, or the kind has none", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_request`: `grace_seconds` out of range, named", body = ErrorBody),
    ))]
pub async fn rotate(
    _: Admin,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = super::body::read_limited(&req, payload, 4096).await?;
    let request: RotateRequest = super::body::parse_json(&body)?;
    let grace_seconds = request.grace_seconds.unwrap_or(DEFAULT_GRACE_SECONDS);
    if !(0..=MAX_GRACE_MS / 1000).contains(&grace_seconds) {
        return Err(ApiError::InvalidRequest(format!(
            "grace_seconds: must be between 0 and {}",
            MAX_GRACE_MS / 1000
        )));
    }
    let name = path.into_inner();
    let rotated: Rotated = {
        let name = name.clone();
        with_vault(&state, move |v| {
            v.rotate(&name, grace_seconds * 1000, now_ms())
        })
        .await?
    };
    tracing::info!(subscription = %name, grace_seconds, purpose = rotated.purpose.as_str(),
        "secret rotated by ops");
    let (signing_secret, token) = match rotated.purpose {
        Purpose::Token => (None, Some(rotated.secret)),
        _ => (Some(rotated.secret), None),
    };
    Ok(HttpResponse::Ok().json(RotatedSecret {
        name,
        signing_secret,
        token,
        previous_valid_until: rfc3339(rotated.previous_until),
    }))
}

/// Never the secret (SPEC: secrets appear in this answer only, not in logs).
impl std::fmt::Debug for SigningSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecrets([redacted])")
    }
}
