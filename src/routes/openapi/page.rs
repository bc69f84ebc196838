//! `GET /docs/`: an interactive reference of `GET /openapi.json`, from files in `ui/docs/`
//! embedded in the binary (nothing downloaded at build or run time), under the dashboard's
//! Content-Security-Policy and security headers.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

use super::super::ui::secured;
use super::super::{ApiError, method_not_allowed, resource};
use super::ErrorBody;

/// Name under `/docs/`, media type, contents. The page also loads the dashboard's stylesheet
/// and text-only DOM helpers from `/ui/`.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "",
        "text/html; charset=utf-8",
        include_bytes!("../../../ui/docs/index.html"),
    ),
    (
        "reference.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../ui/docs/reference.js"),
    ),
    (
        "markdown.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../ui/docs/markdown.js"),
    ),
    (
        "reference.css",
        "text/css; charset=utf-8",
        include_bytes!("../../../ui/docs/reference.css"),
    ),
];

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/docs")
            .route(web::get().to(|| async { super::super::ui::to_slash("/docs/") }))
            .default_service(web::to(method_not_allowed)),
    )
    .service(resource("/docs/{asset:.*}").route(web::get().to(docs)));
}

/// The API reference (`/docs/` is the page) and the files it loads.
#[utoipa::path(get, path = "/docs/{asset}",
    operation_id = "getDocsAsset", tag = "open",
    params(("asset" = String, Path, description = "Empty for the page, else a file it loads")),
    responses(
        (status = 200, description = "The file", content(
            (String = "text/html"), (String = "text/css"), (String = "text/javascript"))),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
pub(super) async fn docs(path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let (_, media_type, body) = ASSETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .ok_or_else(|| ApiError::NotFound("no such reference file".into()))?;
    Ok(secured(HttpResponse::Ok())
        .content_type(*media_type)
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(*body))
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// Descriptions and answers are shown as text: no markup sink, nothing inline (the CSP
    /// would drop it).
    #[test]
    fn the_reference_page_never_parses_strings_as_markup() {
        for (name, _, body) in ASSETS {
            let text = std::str::from_utf8(body).unwrap();
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "localStorage",
                "<style",
                " style=",
                " onclick=",
            ] {
                assert!(!text.contains(sink), "docs/{name} uses {sink}");
            }
        }
        let html = std::str::from_utf8(ASSETS[0].2).unwrap();
        for (i, _) in html.match_indices("<script") {
            let tag = &html[i..i + html[i..].find('>').unwrap()];
            assert!(tag.contains(" src="), "inline script: {tag}");
        }
    }
}
