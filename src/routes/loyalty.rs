//! `GET /loyalty/{customer_id}`: the balance and the credits that make it, a page at a time
//! with the cursor scheme of `GET /events` (a customer can hold thousands of credits).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::auth::Admin;
use super::paging::Paging;
use super::{ApiError, AppState, blocking};

/// Text, parsed by hand so that a bad value is a 422 naming its parameter; an unknown key is
/// refused rather than ignored (a misspelt `limt` would silently page by 50).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreditParams {
    limit: Option<String>,
    cursor: Option<String>,
}

/// A customer's balance and its credits, a page at a time; a customer with no credits has
/// balance 0. Unknown query keys are refused.
#[utoipa::path(get, path = "/loyalty/{customer_id}",
    operation_id = "getLoyaltyAccount", tag = "ops", security(("bearer" = [])),
    params(
        ("customer_id" = String, Path),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "Page size (default 50)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses(
        (status = 200, description = "The account", body = super::openapi::schemas::Loyalty),
        (status = 422, description = "`invalid_request`: a bad or unknown query parameter, named in `message`", body = super::openapi::ErrorBody),
    ))]
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
    let paging = Paging::parse(params.limit.as_deref(), params.cursor.as_deref())?;
    let page = paging.page();
    let mut account = blocking(&state, move |s| s.loyalty(&customer, page)).await?;
    let next_cursor = paging.finish(&mut account.credits, |c| c.seq);
    Ok(HttpResponse::Ok().json(json!({
        "customer_id": account.customer_id,
        "balance": account.balance,
        "credits": account.credits,
        "next_cursor": next_cursor,
    })))
}
