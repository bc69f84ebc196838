//! Bearer-token extractors. Tokens are compared as SHA-256 digests in constant time, so
//! response timing says nothing about how much of a guess was right, nor about the token's
//! length (a byte-wise comparison returns early on a length mismatch).

use std::future::{Ready, ready};
use std::time::Duration;

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};
use futures_util::future::{Either, LocalBoxFuture};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};
use crate::signature::Secret;

pub(super) fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get("Authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// How long a request that presented a wrong token waits for its 401: guesses in a row from
/// one connection come at most a few a second. Tokens are at least 16 characters (config
/// validation), so this is a speed bump for a script, not the defence; a missing token is
/// answered at once.
pub(super) const WRONG_TOKEN_DELAY: Duration = Duration::from_millis(200);

/// The 401 for a request whose token was wrong, after [`WRONG_TOKEN_DELAY`]; at once when it
/// had none.
pub(super) async fn refused(req_had_token: bool) -> ApiError {
    if req_had_token {
        tokio::time::sleep(WRONG_TOKEN_DELAY).await;
    }
    ApiError::Unauthorized
}

type Checked<T> = Either<Ready<Result<T, ApiError>>, LocalBoxFuture<'static, Result<T, ApiError>>>;

/// An extractor's answer: at once when the token was right or missing, else after the delay.
fn answer<T: 'static>(req: &HttpRequest, outcome: Result<T, ApiError>) -> Checked<T> {
    match outcome {
        Err(ApiError::Unauthorized) if bearer(req).is_some() => {
            Either::Right(Box::pin(async { Err(refused(true).await) }))
        }
        outcome => Either::Left(ready(outcome)),
    }
}

fn matches(given: &str, expected: &Secret) -> bool {
    let digest = |s: &str| Sha256::digest(s.as_bytes());
    !expected.is_empty() && bool::from(digest(given).ct_eq(&digest(expected.expose())))
}

fn state(req: &HttpRequest) -> Result<&web::Data<AppState>, ApiError> {
    req.app_data::<web::Data<AppState>>()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("application state missing")))
}

/// The admin token: ops routes.
pub struct Admin;

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Checked<Admin>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let outcome = state(req).and_then(|state| match bearer(req) {
            Some(t) if matches(t, &state.settings.admin_token) => Ok(Admin),
            _ => Err(ApiError::Unauthorized),
        });
        answer(req, outcome)
    }
}

/// The admin token or one of `submission_tokens`: the submission API.
pub struct Submitter;

impl FromRequest for Submitter {
    type Error = ApiError;
    type Future = Checked<Submitter>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let outcome = state(req).and_then(|state| {
            let token = bearer(req).ok_or(ApiError::Unauthorized)?;
            let settings = &state.settings;
            // Check every token (no early exit) so timing does not reveal which one matched.
            let ok = std::iter::once(&settings.admin_token)
                .chain(&settings.submission_tokens)
                .fold(false, |acc, s| matches(token, s) | acc);
            if ok {
                Ok(Submitter)
            } else {
                Err(ApiError::Unauthorized)
            }
        });
        answer(req, outcome)
    }
}

/// The admin token, or one of `listen_tokens`: a `listen` session's own routes (opening one
/// with `POST /subscriptions?session=true`, closing it with `DELETE`). A listen token opens no
/// other route; the route says what it may do with [`SessionMaker::may`].
pub enum SessionMaker {
    Admin,
    Listen,
}

impl SessionMaker {
    /// Whether this caller may act on a subscription that is (or would be) a session or not:
    /// the admin on any, a listen token on sessions only. Refused like a wrong token, so that
    /// a listen token learns nothing of the other subscriptions.
    pub fn may(&self, session: bool) -> Result<(), ApiError> {
        match self {
            SessionMaker::Listen if !session => Err(ApiError::Unauthorized),
            _ => Ok(()),
        }
    }
}

impl FromRequest for SessionMaker {
    type Error = ApiError;
    type Future = Checked<SessionMaker>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let outcome = state(req).and_then(|state| {
            let token = bearer(req).ok_or(ApiError::Unauthorized)?;
            let settings = &state.settings;
            if matches(token, &settings.admin_token) {
                return Ok(SessionMaker::Admin);
            }
            let listen = settings
                .listen_tokens
                .iter()
                .fold(false, |acc, s| matches(token, s) | acc);
            if listen {
                Ok(SessionMaker::Listen)
            } else {
                Err(ApiError::Unauthorized)
            }
        });
        answer(req, outcome)
    }
}
