//! `GET /ui/`: the ops dashboard (SPEC section 10). Its files live in `ui/` and are embedded in
//! the binary, so nothing is fetched from the network at build or run time. The page needs no
//! token; every data call it makes goes to the JSON API with the admin token.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

use super::ApiError;

/// `default-src 'self'` and nothing inline: even text that reached the DOM as markup could
/// neither run a script nor style itself. Frames are refused (clickjacking on the retry
/// buttons), and `base-uri`/`form-action` keep injected markup from redirecting the page.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'; object-src 'none'";

/// Name under `/ui/`, media type, contents.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("", HTML, include_bytes!("../../ui/index.html")),
    ("app.css", CSS, include_bytes!("../../ui/app.css")),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("../../ui/favicon.svg"),
    ),
    ("js/main.js", JS, include_bytes!("../../ui/js/main.js")),
    ("js/api.js", JS, include_bytes!("../../ui/js/api.js")),
    ("js/dom.js", JS, include_bytes!("../../ui/js/dom.js")),
    (
        "js/overview.js",
        JS,
        include_bytes!("../../ui/js/overview.js"),
    ),
    ("js/events.js", JS, include_bytes!("../../ui/js/events.js")),
    (
        "js/actions.js",
        JS,
        include_bytes!("../../ui/js/actions.js"),
    ),
    ("js/detail.js", JS, include_bytes!("../../ui/js/detail.js")),
    (
        "js/subscriptions.js",
        JS,
        include_bytes!("../../ui/js/subscriptions.js"),
    ),
    (
        "js/subscription_form.js",
        JS,
        include_bytes!("../../ui/js/subscription_form.js"),
    ),
    (
        "js/subscription_preview.js",
        JS,
        include_bytes!("../../ui/js/subscription_preview.js"),
    ),
    (
        "js/lookups.js",
        JS,
        include_bytes!("../../ui/js/lookups.js"),
    ),
];
const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        // A person who opens the server's address in a browser lands on the dashboard.
        web::resource("/")
            .route(web::get().to(|| async { to_slash("/ui/") }))
            .default_service(web::to(super::method_not_allowed)),
    )
    .service(
        web::resource("/ui")
            .route(web::get().to(|| async { to_slash("/ui/") }))
            .default_service(web::to(super::method_not_allowed)),
    )
    .service(
        web::resource("/ui/{asset:.*}")
            .route(web::get().to(asset))
            .default_service(web::to(super::method_not_allowed)),
    );
}

/// Relative links in a page resolve against its folder (`/ui/`, `/docs/`), so the bare name
/// is sent there, under the same headers as the page.
pub(super) fn to_slash(folder: &'static str) -> HttpResponse {
    secured(HttpResponse::PermanentRedirect())
        .insert_header((header::LOCATION, folder))
        .finish()
}

/// The ops dashboard (`/ui/` is the page) and the files it loads.
#[utoipa::path(get, path = "/ui/{asset}",
    operation_id = "getDashboardAsset", tag = "open",
    params(("asset" = String, Path, description = "Empty for the page, else a file it loads")),
    responses(
        (status = 200, description = "The file", content(
            (String = "text/html"), (String = "text/css"),
            (String = "text/javascript"), (String = "image/svg+xml"))),
        (status = 404, description = "`not_found`", body = super::openapi::ErrorBody),
    ))]
pub(super) async fn asset(path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let (_, media_type, body) = ASSETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .ok_or_else(|| ApiError::NotFound("no such dashboard file".into()))?;
    Ok(secured(HttpResponse::Ok())
        .content_type(*media_type)
        // Revalidate every time: the files change with the binary and carry no version.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(*body))
}

/// The security headers of the page and of every file it loads (the API reference at `/docs/`
/// is served under them too).
pub(super) fn secured(
    mut response: actix_web::HttpResponseBuilder,
) -> actix_web::HttpResponseBuilder {
    response
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"));
    response
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    fn text(name: &str) -> &'static str {
        let (_, _, body) = ASSETS.iter().find(|(n, _, _)| *n == name).unwrap();
        std::str::from_utf8(body).unwrap()
    }

    /// The CSP forbids inline code; this keeps the files from relying on it, so a browser
    /// would not silently drop part of the page.
    #[test]
    fn page_has_no_inline_script_style_or_handlers() {
        let html = text("").to_ascii_lowercase();
        for (i, _) in html.match_indices("<script") {
            let tag = &html[i..i + html[i..].find('>').unwrap()];
            assert!(tag.contains(" src="), "inline script: {tag}");
        }
        assert!(!html.contains("<style"), "inline <style> element");
        assert!(!html.contains(" style="), "style attribute");
        let handler = html
            .split(|c: char| c.is_whitespace())
            .find(|w| w.starts_with("on") && w.contains('='));
        assert_eq!(handler, None, "event-handler attribute");
        assert!(!html.contains("javascript:"), "javascript: URL");
    }

    /// Delivery bodies are attacker-controlled: the scripts build the page with text nodes
    /// only, never from markup strings.
    #[test]
    fn scripts_never_parse_strings_as_markup() {
        for (name, _, _) in ASSETS.iter().filter(|(n, _, _)| n.ends_with(".js")) {
            let js = text(name);
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "setAttribute('style'",
                "localStorage",
                "document.cookie",
            ] {
                assert!(!js.contains(sink), "{name} uses {sink}");
            }
        }
    }
}
