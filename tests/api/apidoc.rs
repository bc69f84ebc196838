//! `GET /openapi.json` and `/docs/` over real HTTP (SPEC section 11).

use crate::helpers::spawn_app;

#[tokio::test]
async fn the_document_is_open_json_and_openapi_3_1() {
    let app = spawn_app().await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status, 200);
    assert!(r.body["openapi"].as_str().unwrap().starts_with("3.1."));
    assert!(r.body["paths"]["/webhooks/{source}"]["post"].is_object());
}

#[tokio::test]
async fn the_reference_page_is_served_under_the_dashboards_security_headers() {
    let app = spawn_app().await;
    let client = reqwest::Client::new();
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let dashboard = client.get(app.url("/ui/")).send().await.unwrap();
    let csp = header(&dashboard, "content-security-policy").unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    for path in ["/docs/", "/docs/reference.js", "/docs/reference.css"] {
        let r = client.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(
            header(&r, "content-security-policy").as_ref(),
            Some(&csp),
            "{path}"
        );
        assert_eq!(
            header(&r, "x-content-type-options").as_deref(),
            Some("nosniff")
        );
        assert_eq!(header(&r, "x-frame-options").as_deref(), Some("DENY"));
    }
    let missing = client.get(app.url("/docs/nope.js")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}
