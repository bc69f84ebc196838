//! `GET /loyalty/{customer_id}`: the balance and the credits that make it, a page at a time
//! with the cursor scheme of `GET /events` (a customer can hold thousands of credits).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::auth::Admin;
use super::events::{DEFAULT_LIMIT, MAX_LIMIT, decode_cursor, encode_cursor};
use super::{ApiError, AppState, blocking};
use crate::store::Page;

/// Text, parsed by hand so that a bad value is a 422 naming its parameter; an unknown key is
/// refused rather than ignored (a misspelt `limt` would silently page by 50).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreditParams {
    limit: Option<String>,
    cursor: Option<String>,
}

pub async fn show(
    _: Admin,
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let customer = path.into_inner();
    let params = web::Query::<CreditParams>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            let text = e.to_string();
            let text = text.trim_start_matches("Query deserialize error: ");
            ApiError::InvalidRequest(format!(
                "query string: {text}; this route takes limit, cursor"
            ))
        })?;
    let limit = match params.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "limit: `{l}` is not an integer from 1 to {MAX_LIMIT}"
                ))
            })?,
    };
    let before_seq = params.cursor.as_deref().map(decode_cursor).transpose()?;
    // One more than asked tells whether another page exists.
    let page = Page {
        limit: limit + 1,
        before_seq,
    };
    let mut account = blocking(&state, move |s| s.loyalty(&customer, page)).await?;
    let next_cursor = if account.credits.len() > limit {
        account.credits.truncate(limit);
        account.credits.last().map(|c| encode_cursor(c.seq))
    } else {
        None
    };
    Ok(HttpResponse::Ok().json(json!({
        "customer_id": account.customer_id,
        "balance": account.balance,
        "credits": account.credits,
        "next_cursor": next_cursor,
    })))
}
