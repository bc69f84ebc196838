//! Traces (SPEC section 15) from the real binary to a real OTLP/HTTP receiver, decoded with
//! the protocol's own definitions (`opentelemetry-proto`): one delivery, sent with a
//! provider's `traceparent`, is one trace across ingest, the group commit, an `http`
//! subscription's call (whose endpoint gets the call span's `traceparent`), a `pull` claim
//! (whose answer carries its claim span's) and an in-process handler, each with its claim and
//! ack; parents link them; no exported byte holds the body or a secret. At ratio 0 a new trace
//! exports nothing, a provider's sampled one is still honoured, an unsampled one is passed on
//! as it came. On both stores: the context is stored with the event.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::nodes::{node_config, signing_settings};
use crate::process::{ServerProcess, free_port};
use crate::receiver::{Call, Receiver};
use crate::stores::{StoreKind, TestDb};

crate::stores::store_tests!(
    one_delivery_is_one_trace_from_the_provider_to_each_subscription,
    at_ratio_zero_only_a_providers_sampled_trace_is_exported,
);

const PULL_TOKEN: &str = "trace-pull-token-0123456789";
/// In the body only: no span may carry it.
const BODY_MARKER: &str = "body-marker-5c1d0e";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PROVIDER_SPAN: &str = "00f067aa0ba902b7";

fn start(
    dir: &std::path::Path,
    db: &TestDb,
    collector: &Receiver,
    ratio: f64,
    endpoint: &str,
) -> ServerProcess {
    let port = free_port();
    let extra = format!(
        r#"
[telemetry]
otlp_endpoint = "{collector}"
sample_ratio = {ratio}

[consumers]
workers = 1
backoff_base_ms = 10
backoff_max_ms = 100

[[subscriptions]]
name = "points"
kind = "loyalty-credit"
types = ["order.completed"]

[[subscriptions]]
name = "hook"
kind = "http"
sources = ["shop"]
url = "{endpoint}"
signing_secret = "{SW_SECRET}"
timeout_ms = 2000
transform = "."

[[subscriptions]]
name = "puller"
kind = "pull"
sources = ["shop"]
token = "{PULL_TOKEN}"
"#,
        collector = collector.url,
    );
    let config = node_config(dir, "n", port, &db.url(), &extra);
    ServerProcess::start(dir, &config, port, "n.log")
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Deliver `id` signed for `shop`, with `traceparent` when given.
fn deliver(node: &ServerProcess, id: &str, traceparent: Option<&str>) {
    let body = json!({
        "type": "order.completed",
        "data": {"order_id": id, "customer_id": "c1", "points": 3},
        "note": BODY_MARKER,
    })
    .to_string();
    let mut req = client()
        .post(format!("{}/webhooks/shop", node.base))
        .header("content-type", "application/json")
        .body(body.clone());
    for (k, v) in sign_for(&signing_settings(), "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    if let Some(t) = traceparent {
        req = req.header("traceparent", t);
    }
    let status = req.send().unwrap().status().as_u16();
    assert_eq!(status, 200);
}

/// Claim `n` events of `puller` (bounded), acking each.
fn pull(node: &ServerProcess, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut claims = Vec::new();
    while claims.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} claimed",
            claims.len()
        );
        let answer: Value = client()
            .post(format!("{}/subscriptions/puller/claim", node.base))
            .bearer_auth(PULL_TOKEN)
            .json(&json!({"max": 10, "wait_ms": 500}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        for claim in answer["claims"].as_array().unwrap() {
            let acked = client()
                .post(format!("{}/subscriptions/puller/ack", node.base))
                .bearer_auth(PULL_TOKEN)
                .json(&json!({"results": [{"token": claim["token"], "outcome": "done"}]}))
                .send()
                .unwrap();
            assert_eq!(acked.status().as_u16(), 200);
            claims.push(claim.clone());
        }
    }
    claims
}

/// Wait (bounded) until `points` completed `n` events and `endpoint` got `n` calls.
fn until_handled(node: &ServerProcess, endpoint: &Receiver, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view: Value = client()
            .get(format!("{}/subscriptions/points", node.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if view["counts"]["completed"] == n && endpoint.calls().len() >= n {
            return;
        }
        assert!(Instant::now() < deadline, "not handled: {view}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every span the collector received, and its raw bodies.
fn exported(collector: &Receiver) -> (Vec<Span>, Vec<Call>) {
    let calls = collector.calls();
    let spans = calls
        .iter()
        .flat_map(|c| {
            ExportTraceServiceRequest::decode(c.body.as_slice())
                .expect("an OTLP/HTTP protobuf export")
                .resource_spans
        })
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect();
    (spans, calls)
}

fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// `(trace id, parent id, flags)` of a `traceparent`.
fn parts(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "{traceparent}");
    (p[1].into(), p[2].into(), p[3].into())
}

fn one_delivery_is_one_trace_from_the_provider_to_each_subscription(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let collector = Receiver::start(Duration::ZERO, 200);
    let endpoint = Receiver::start(Duration::ZERO, 200);
    let mut node = start(dir.path(), &db, &collector, 1.0, &endpoint.url);
    deliver(
        &node,
        "o-traced",
        Some(&format!("00-{TRACE}-{PROVIDER_SPAN}-01")),
    );
    // The context is stored with the event, in either store.
    assert_eq!(
        db.count("SELECT count(*) FROM event_payloads WHERE traceparent LIKE '00-4bf92f35%'"),
        1
    );
    let claims = pull(&node, 1);
    until_handled(&node, &endpoint, 1);
    assert!(node.terminate(Duration::from_secs(30)).success());
    let (spans, calls) = exported(&collector);
    let by_id: HashMap<String, &Span> =
        spans.iter().map(|s| (hex::encode(&s.span_id), s)).collect();
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    for span in &spans {
        assert_eq!(
            hex::encode(&span.trace_id),
            TRACE,
            "{} left the trace",
            span.name
        );
    }
    let receive = named("webhook.receive");
    assert_eq!(receive.len(), 1, "{names:?}");
    let receive = receive[0];
    assert_eq!(hex::encode(&receive.parent_span_id), PROVIDER_SPAN);
    assert_eq!(attr(receive, "webhook.source").as_deref(), Some("shop"));
    assert_eq!(
        attr(receive, "webhook.event_id").as_deref(),
        Some("o-traced")
    );
    assert_eq!(attr(receive, "webhook.outcome").as_deref(), Some("queued"));
    for step in ["webhook.verify", "webhook.commit"] {
        let s = named(step);
        assert_eq!(s.len(), 1, "{step}: {names:?}");
        assert_eq!(s[0].parent_span_id, receive.span_id, "{step}");
    }
    // One attempt per subscription, each a child of the request's span.
    let deliveries: HashMap<String, &Span> = named("webhook.deliver")
        .into_iter()
        .map(|s| (attr(s, "webhook.subscription").unwrap(), s))
        .collect();
    assert_eq!(deliveries.len(), 3, "{names:?}");
    for (sub, span) in &deliveries {
        assert_eq!(span.parent_span_id, receive.span_id, "{sub}");
        assert_eq!(attr(span, "webhook.event_id").as_deref(), Some("o-traced"));
        assert_eq!(attr(span, "webhook.attempt").as_deref(), Some("1"));
    }
    let children = |parent: &Span| -> Vec<&str> {
        let mut c: Vec<&str> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent.span_id)
            .map(|s| s.name.as_str())
            .collect();
        c.sort();
        c
    };
    let hook = deliveries["hook"];
    assert_eq!(
        children(hook),
        [
            "webhook.ack",
            "webhook.call",
            "webhook.claim",
            "webhook.transform"
        ]
    );
    assert_eq!(
        attr(named("webhook.transform")[0], "webhook.outcome").as_deref(),
        Some("shaped")
    );
    assert_eq!(attr(hook, "webhook.outcome").as_deref(), Some("delivered"));
    let points = deliveries["points"];
    assert_eq!(
        children(points),
        ["webhook.ack", "webhook.claim", "webhook.handle"]
    );
    assert_eq!(attr(points, "webhook.outcome").as_deref(), Some("credited"));
    // The endpoint's traceparent names the call span; the pull answer's, the pull attempt.
    let call = endpoint.calls()[0]
        .header("traceparent")
        .expect("forwarded with a traceparent")
        .to_string();
    let (trace, parent, flags) = parts(&call);
    assert_eq!((trace.as_str(), flags.as_str()), (TRACE, "01"));
    assert_eq!(by_id[&parent].name, "webhook.call");
    assert_eq!(by_id[&parent].parent_span_id, hook.span_id);
    let pulled = claims[0]["traceparent"]
        .as_str()
        .expect("the claim carries its traceparent");
    let (trace, parent, _) = parts(pulled);
    assert_eq!(trace, TRACE);
    assert_eq!(parent, hex::encode(&deliveries["puller"].span_id));
    for call in &calls {
        let bytes = String::from_utf8_lossy(&call.body);
        for secret in [BODY_MARKER, SW_SECRET, PULL_TOKEN, ADMIN_TOKEN] {
            assert!(!bytes.contains(secret), "an export holds {secret}");
        }
    }
}

fn at_ratio_zero_only_a_providers_sampled_trace_is_exported(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let collector = Receiver::start(Duration::ZERO, 200);
    let endpoint = Receiver::start(Duration::ZERO, 200);
    let mut node = start(dir.path(), &db, &collector, 0.0, &endpoint.url);
    let unsampled = format!("00-{TRACE}-{PROVIDER_SPAN}-00");
    let sampled_trace = "0af7651916cd43dd8448eb211c80319c";
    deliver(&node, "o-new", None);
    deliver(&node, "o-unsampled", Some(&unsampled));
    deliver(
        &node,
        "o-sampled",
        Some(&format!("00-{sampled_trace}-b7ad6b7169203331-01")),
    );
    let claims = pull(&node, 3);
    until_handled(&node, &endpoint, 3);
    assert!(node.terminate(Duration::from_secs(30)).success());
    let (spans, _) = exported(&collector);
    let traces: std::collections::HashSet<String> =
        spans.iter().map(|s| hex::encode(&s.trace_id)).collect();
    assert_eq!(traces, [sampled_trace.to_string()].into(), "{spans:?}");
    // An unsampled provider context is passed on as it came; a new one is not made.
    let header_of = |id: &str| {
        endpoint
            .calls()
            .iter()
            .find(|c| c.header("webhook-inbox-event-id") == Some(id))
            .map(|c| c.header("traceparent").map(String::from))
            .expect("called")
    };
    assert_eq!(header_of("o-unsampled"), Some(unsampled.clone()));
    assert_eq!(header_of("o-new"), None);
    let pulled =
        |id: &str| claims.iter().find(|c| c["event_id"] == id).unwrap()["traceparent"].clone();
    assert_eq!(pulled("o-unsampled"), json!(unsampled));
    assert_eq!(pulled("o-new"), Value::Null);
    assert_eq!(
        parts(pulled("o-sampled").as_str().unwrap()).0,
        sampled_trace
    );
}
