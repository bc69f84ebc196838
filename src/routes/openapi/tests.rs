//! The document against the code: a route added without an annotation fails here.

use std::collections::BTreeSet;

use super::document;

/// The files that register routes; a new file that registers routes belongs here too (the
/// `configure` functions of `routes/mod.rs` list them).
const ROUTE_FILES: [(&str, &str); 4] = [
    ("routes/mod.rs", include_str!("../mod.rs")),
    ("routes/ui.rs", include_str!("../ui.rs")),
    ("routes/openapi/mod.rs", include_str!("mod.rs")),
    ("routes/openapi/page.rs", include_str!("page.rs")),
];

/// Routes that are deliberately not operations of the API.
const UNDOCUMENTED: [(&str, &str); 3] = [
    // Redirects to `/ui/`, for people who type the address alone or without the slash.
    ("get", "/"),
    ("get", "/ui"),
    ("get", "/docs"),
];

/// `(method, path)` for every `resource("path").route(web::method()...)` in the sources, with
/// actix's `{name:regex}` written as OpenAPI's `{name}`.
fn registered() -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (file, text) in ROUTE_FILES {
        let mut any = false;
        for chunk in text.split("resource(\"").skip(1) {
            let (path, rest) = chunk.split_once("\")").expect("a closed resource path");
            let end = [".service(", ";"]
                .iter()
                .filter_map(|m| rest.find(m))
                .min()
                .unwrap_or(rest.len());
            for method in ["get", "post", "put", "patch", "delete"] {
                if rest[..end].contains(&format!("web::{method}()")) {
                    found.insert((method.to_string(), openapi_path(path)));
                    any = true;
                }
            }
        }
        assert!(any, "{file} registers no route: is ROUTE_FILES stale?");
    }
    found
}

fn openapi_path(actix: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for c in actix.chars() {
        match c {
            ':' if out.rfind('{') > out.rfind('}') => skipping = true,
            '}' => {
                skipping = false;
                out.push(c);
            }
            _ if skipping => {}
            _ => out.push(c),
        }
    }
    out
}

fn documented() -> BTreeSet<(String, String)> {
    let doc = serde_json::to_value(document()).unwrap();
    let mut found = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            found.insert((method.clone(), path.clone()));
        }
    }
    found
}

#[test]
fn route_scanner_reads_the_registration_style() {
    let found = registered();
    for route in [
        ("post", "/webhooks/{source}"),
        ("get", "/events/{source}/{event_id}"),
        ("get", "/ui/{asset}"),
        ("get", "/openapi.json"),
    ] {
        assert!(
            found.contains(&(route.0.to_string(), route.1.to_string())),
            "{route:?} not found in {found:?}"
        );
    }
}

#[test]
fn every_registered_route_is_in_the_document_and_nothing_else() {
    let mut registered = registered();
    for (method, path) in UNDOCUMENTED {
        assert!(registered.remove(&(method.into(), path.into())));
    }
    let documented = documented();
    let missing: Vec<_> = registered.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&registered).collect();
    assert!(
        missing.is_empty(),
        "registered but not in GET /openapi.json (add #[utoipa::path] and list it in ApiDoc): {missing:?}"
    );
    assert!(extra.is_empty(), "documented but not registered: {extra:?}");
}

#[test]
fn document_is_openapi_3_1_with_the_bearer_scheme() {
    let doc = serde_json::to_value(document()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."));
    assert_eq!(
        doc["components"]["securitySchemes"][super::BEARER]["scheme"],
        "bearer"
    );
}

/// Every error answer of every operation has the `{"error","message"}` shape, and every
/// operation says what a 503 and a 500 look like.
#[test]
fn every_error_answer_has_the_error_shape() {
    let doc = serde_json::to_value(document()).unwrap();
    let error_ref = "#/components/schemas/ErrorBody";
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            for code in ["500", "503"] {
                assert!(responses.contains_key(code), "{method} {path}: no {code}");
            }
            for (code, response) in responses.iter().filter(|(c, _)| !c.starts_with('2')) {
                let schema = &response["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(schema, error_ref, "{method} {path} {code}");
            }
            if op.get("security").is_some() {
                assert!(responses.contains_key("401"), "{method} {path}: no 401");
            }
        }
    }
}

/// The routes behind a token say so; the open ones do not.
#[test]
fn tokens_are_declared_where_the_handlers_take_them() {
    let doc = serde_json::to_value(document()).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let open = ["/healthz", "/readyz", "/metrics", "/openapi.json"]
                .contains(&path.as_str())
                || path.starts_with("/webhooks/")
                || path.starts_with("/ui/")
                || path.starts_with("/docs/");
            assert_eq!(
                op.get("security").is_none(),
                open,
                "{method} {path}: security"
            );
            if !open {
                assert!(
                    op["security"][0].get(super::BEARER).is_some(),
                    "{method} {path}: names a scheme the document does not define"
                );
            }
        }
    }
}

#[test]
fn the_ingest_route_names_every_schemes_signature_header() {
    let doc = serde_json::to_value(document()).unwrap();
    let params = doc["paths"]["/webhooks/{source}"]["post"]["parameters"]
        .as_array()
        .unwrap();
    let names: Vec<_> = params.iter().map(|p| p["name"].as_str().unwrap()).collect();
    for header in [
        "webhook-signature",
        "Stripe-Signature",
        "X-Hub-Signature-256",
        "X-Shopify-Hmac-Sha256",
        "X-Signature",
    ] {
        assert!(names.contains(&header), "{header} missing from {names:?}");
    }
}

/// `status=purged` is accepted by both lists (tombstones only), so the document offers it.
#[test]
fn the_status_filters_offer_purged() {
    let doc = serde_json::to_value(document()).unwrap();
    for path in ["/events", "/events/export"] {
        let params = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let status = params.iter().find(|p| p["name"] == "status").unwrap();
        let schema = &status["schema"];
        let target = schema["$ref"]
            .as_str()
            .or_else(|| schema["oneOf"][0]["$ref"].as_str())
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
            .unwrap_or_else(|| panic!("{path}: status schema {schema}"));
        let values = &doc["components"]["schemas"][target]["enum"];
        for v in ["pending", "claimed", "completed", "failed", "purged"] {
            assert!(
                values.as_array().unwrap().contains(&v.into()),
                "{path}: {v} not in {values}"
            );
        }
    }
}

/// Every `$ref` names a schema the document holds: a type used only in a parameter is not
/// collected by itself and must be listed in `components(schemas(...))`.
#[test]
fn every_reference_resolves() {
    fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(r) = map.get("$ref").and_then(|r| r.as_str()) {
                    out.push(r.to_string());
                }
                map.values().for_each(|v| refs(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let doc = serde_json::to_value(document()).unwrap();
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(!found.is_empty());
    for r in found {
        let name = r.strip_prefix("#/components/schemas/").unwrap_or(&r);
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "{r} does not resolve"
        );
    }
}

/// Client generators name their functions after `operationId`: each is unique and says what
/// the operation does, in camelCase (a generator refused the document when two were `show`).
#[test]
fn every_operation_has_a_unique_camel_case_operation_id() {
    let doc = serde_json::to_value(document()).unwrap();
    let mut seen = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
            assert!(
                id.len() > 3
                    && id.starts_with(|c: char| c.is_ascii_lowercase())
                    && id.chars().all(|c| c.is_ascii_alphanumeric())
                    && id.chars().any(|c| c.is_ascii_uppercase()),
                "{method} {path}: operationId {id:?} is not a camelCase verb and noun"
            );
            assert!(seen.insert(id.to_string()), "{method} {path}: {id} twice");
        }
    }
}
