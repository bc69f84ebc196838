//! `GET /openapi.json` (SPEC section 11): the OpenAPI 3.1 document, generated from the
//! `#[utoipa::path]` annotations beside each handler and from the types that shape the answers.
//! What every operation shares (the 503 with `Retry-After`, the opaque 500, the 401 of the
//! token-protected routes, the bearer scheme) is added here once, by [`Shared`].

mod page;
pub(super) mod schemas;
#[cfg(test)]
mod tests;

use actix_web::{HttpResponse, web};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, OpenApi as Document, Ref, ResponseBuilder, path::Operation,
};
use utoipa::{Modify, OpenApi};

pub use schemas::ErrorBody;

/// The name of the bearer scheme that the annotations' `security(...)` refer to.
pub const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "webhook-inbox",
        description = "A webhook receiver with idempotent consumers: a delivery is acknowledged \
            (2xx) only after a durable commit, processed once, and never dropped silently. \
            Every error body is `{\"error\": code, \"message\": text}`.",
    ),
    paths(
        super::health::healthz,
        super::health::readyz,
        super::health::metrics,
        super::webhooks::receive,
        super::events::list,
        super::stats::stats,
        super::events::retry_bulk,
        super::purge::purge,
        super::events::export,
        super::events::run,
        super::events::show,
        super::events::retry,
        super::ordering::skip,
        super::loyalty::show,
        super::rejections::list,
        super::alerts::list,
        super::subscriptions::list,
        super::subscriptions::show,
        super::subscription_changes::create,
        super::subscription_changes::update,
        super::subscription_changes::delete,
        super::preview::preview,
        super::subscriptions::pause,
        super::subscriptions::resume,
        super::subscriptions::backfill,
        super::subscriptions::recover,
        super::secrets::show,
        super::secrets::rotate,
        super::pull::claim,
        super::pull::ack,
        super::pull::extend,
        super::requests::create,
        super::requests::get,
        super::requests::add_document,
        super::requests::submit,
        super::ui::asset,
        openapi_json,
        page::docs,
    ),
    components(schemas(
        ErrorBody,
        schemas::ErrorCode,
        schemas::StatusFilter,
        super::views::Event,
        super::views::EventWithHistory,
        super::views::Request,
    )),
    modifiers(&Shared),
    tags(
        (name = "ingest", description = "Deliveries from providers"),
        (name = "ops", description = "Events, consumers and refused deliveries, admin token"),
        (name = "pull", description = "Pull subscriptions: the user's workers claim events and ack them, with the subscription's own token"),
        (name = "requests", description = "The submission API: build a request, submit it once"),
        (name = "open", description = "Health, metrics, this document, the pages"),
    )
)]
struct ApiDoc;

/// The document, built once at start.
pub fn document() -> Document {
    ApiDoc::openapi()
}

struct Shared;

impl Modify for Shared {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        let error = || {
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build()
        };
        let unavailable = ResponseBuilder::new()
            .description(
                "`unavailable`: the store could not answer in time; nothing was acknowledged. \
                 Retry after the given seconds.",
            )
            .header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(Some(
                        utoipa::openapi::ObjectBuilder::new()
                            .schema_type(utoipa::openapi::schema::Type::Integer)
                            .build(),
                    ))
                    .description(Some("Seconds to wait before retrying"))
                    .build(),
            )
            .content("application/json", error())
            .build();
        let internal = ResponseBuilder::new()
            .description("`internal`: a bug; the cause is in the server's log")
            .content("application/json", error())
            .build();
        let unauthorized = ResponseBuilder::new()
            .description("`unauthorized`: the bearer token is missing or wrong")
            .header(
                "WWW-Authenticate",
                HeaderBuilder::new()
                    .schema(Some(
                        utoipa::openapi::ObjectBuilder::new()
                            .schema_type(utoipa::openapi::schema::Type::String)
                            .build(),
                    ))
                    .build(),
            )
            .content("application/json", error())
            .build();
        for item in doc.paths.paths.values_mut() {
            for op in operations(item) {
                let responses = &mut op.responses.responses;
                let protected = op.security.as_ref().is_some_and(|s| !s.is_empty());
                if protected {
                    responses
                        .entry("401".into())
                        .or_insert_with(|| unauthorized.clone().into());
                }
                responses
                    .entry("503".into())
                    .or_insert_with(|| unavailable.clone().into());
                responses
                    .entry("500".into())
                    .or_insert_with(|| internal.clone().into());
            }
        }
    }
}

fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        item.get.as_mut(),
        item.put.as_mut(),
        item.post.as_mut(),
        item.delete.as_mut(),
        item.options.as_mut(),
        item.head.as_mut(),
        item.patch.as_mut(),
        item.trace.as_mut(),
    ]
    .into_iter()
    .flatten()
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    let json = document()
        .to_pretty_json()
        .expect("the API document serialises");
    cfg.app_data(web::Data::new(Rendered(json)))
        .service(super::resource("/openapi.json").route(web::get().to(openapi_json)))
        .configure(page::configure);
}

struct Rendered(String);

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenApiDocument",
    tag = "open",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json"))
)]
async fn openapi_json(doc: web::Data<Rendered>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(doc.0.clone())
}
