//! Bearer-token extractors. Tokens are compared as SHA-256 digests in constant time, so
//! response timing says nothing about how much of a guess was right, nor about the token's
//! length (a byte-wise comparison returns early on a length mismatch).

use std::future::{Ready, ready};

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};
use crate::signature::Secret;

pub(super) fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get("Authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
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
    type Future = Ready<Result<Admin, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(state(req).and_then(|state| match bearer(req) {
            Some(t) if matches(t, &state.settings.admin_token) => Ok(Admin),
            _ => Err(ApiError::Unauthorized),
        }))
    }
}

/// The admin token or one of `submission_tokens`: the submission API.
pub struct Submitter;

impl FromRequest for Submitter {
    type Error = ApiError;
    type Future = Ready<Result<Submitter, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(state(req).and_then(|state| {
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
        }))
    }
}
