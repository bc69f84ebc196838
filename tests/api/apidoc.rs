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

/// Where scripts/test-deps installs the validator and the client generator (a virtual
/// environment of their own).
const API_TOOLS: &str = "/opt/webhook-inbox/apitools/bin";

/// A tool of [`API_TOOLS`], or `None` when it is missing (skipped, or failed under
/// `TEST_REQUIRE_ALL`).
fn api_tool(name: &str) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(API_TOOLS).join(name);
    let found = crate::requires::command(path.to_str().unwrap());
    crate::requires::available(name, found).then_some(path)
}

/// The served document, written to `dir/openapi.json`.
async fn served_document(
    app: &crate::helpers::TestApp,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status, 200);
    let path = dir.join("openapi.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&r.body).unwrap()).unwrap();
    path
}

fn run(command: &mut std::process::Command) -> String {
    let out = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed: {text}");
    text
}

/// The document validates with openapi-spec-validator (it once did not: two operations had
/// the operationId `show`).
#[tokio::test]
async fn the_document_passes_the_openapi_spec_validator() {
    let Some(validator) = api_tool("openapi-spec-validator") else {
        return;
    };
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    let doc = served_document(&app, dir.path()).await;
    let out = run(std::process::Command::new(validator).arg(&doc));
    assert!(out.contains("OK"), "{out}");
}

/// A Python client generated from the served document by an independent generator
/// (openapi-python-client) drives the main flows against the live server: the script a user
/// could copy from `examples/generated-client/ops.py`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_generated_from_the_document_drives_the_main_flows() {
    use crate::helpers::{ADMIN_TOKEN, SUBMIT_TOKEN, order_body};
    let Some(generator) = api_tool("openapi-python-client") else {
        return;
    };
    let app = spawn_app().await;
    let r = app
        .deliver("shop", "no-order", r#"{"type":"order.completed"}"#)
        .await;
    assert_eq!(r.status, 200);
    let r = app
        .deliver("shop", "good", &order_body("o-1", "c-9", 25))
        .await;
    assert_eq!(r.status, 200);
    app.drain().await;
    assert_eq!(app.event("shop", "no-order").await["status"], "failed");

    let dir = tempfile::tempdir().unwrap();
    let doc = served_document(&app, dir.path()).await;
    let package = dir.path().join("webhook_inbox_client");
    run(std::process::Command::new(&generator)
        .args(["generate", "--meta", "none", "--path"])
        .arg(&doc)
        .arg("--output-path")
        .arg(&package));
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/generated-client/ops.py"
    );
    let out = run(
        std::process::Command::new(generator.with_file_name("python3"))
            .arg(script)
            .args([&app.address, ADMIN_TOKEN, SUBMIT_TOKEN, "c-9"])
            .env("PYTHONPATH", dir.path()),
    );
    assert!(out.contains("failed: shop/no-order"), "{out}");
    assert!(
        out.contains(
            "summary: retried=pending balance=25 submit=queued,duplicate unknown=not_found"
        ),
        "{out}"
    );
    // The retry really happened: the event is pending again, with a fresh budget.
    assert_eq!(app.event("shop", "no-order").await["status"], "pending");
}
