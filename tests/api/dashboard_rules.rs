//! The subscription editor's filter, transform and broker kinds in a real browser (headless
//! chromium), against the real binary on a random port (issues 61 and 62): a filter previewed
//! on stored events before the subscription exists, then saved, applied by the fan-out, shown
//! on the event page it left out, edited and removed; a refused filter beside its field;
//! hostile filter values, bodies and messages kept as text; a `nats` subscription made and
//! edited through the form. The transform's and `amqp`'s tests wait for their merges.

use fantoccini::{Client, Locator};
use serde_json::{Value, json};
use webhook_inbox::config::Settings;

use crate::browser::{Driver, click, js, screenshot, type_into, wait_until};
use crate::dashboard::{browser_found, sign_in};
use crate::dashboard_editor::{admin, calls, deliver, start, subscription, text_of};
use crate::helpers::{ADMIN_TOKEN, sign_for};
use crate::process::free_port;
use crate::receiver::Receiver;

const FILTER: &str = r#"{"all": [{"path": "/data/object/currency", "eq": "usd"}, {"path": "/data/object/amount", "gte": 1000}]}"#;
const XSS: &str = "<img src=x onerror=window.__xss=1>";

fn charge(currency: &str, amount: i64) -> Value {
    json!({"type": "charge.succeeded",
        "data": {"object": {"id": "ch_1", "currency": currency, "amount": amount, "note": XSS}}})
}

/// A delivery as providers send one, declared JSON: the preview shows its value pretty-printed
/// (a body not declared JSON is delivered, and shown, as its text).
async fn deliver_json(base: &str, settings: &Settings, id: &str, body: &Value) {
    let body = body.to_string();
    let mut req = reqwest::Client::new()
        .post(format!("{base}/webhooks/shop"))
        .header("content-type", "application/json")
        .body(body.clone());
    for (k, v) in sign_for(settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200);
}

/// Watch for markup that ran or a policy the page broke, from the page's first load.
async fn open(c: &Client, base: &str) {
    c.goto(&format!("{base}/ui/")).await.unwrap();
    js(c, "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));").await;
    sign_in(c, ADMIN_TOKEN).await;
    click(c, "nav a[href='#subscriptions']").await;
    wait_until(
        c,
        "return document.querySelectorAll('#subscriptions-body tr').length >= 3;",
        "the subscriptions",
    )
    .await;
}

async fn inert(c: &Client) {
    assert_eq!(
        js(c, "return document.querySelectorAll('main img').length;").await,
        0
    );
    assert_eq!(
        js(c, "return window.__xss === undefined;").await,
        true,
        "the markup ran"
    );
    assert_eq!(js(c, "return window.__violations;").await, json!([]));
}

/// Picks the recent event whose label starts with `label` from the preview's list.
async fn pick(c: &Client, label: &str) {
    let script = format!(
        "const o = [...document.querySelectorAll('#sp-pick option')].find(o => o.textContent.startsWith('{label} ')); return o ? o.value : null;"
    );
    let value = js(c, &script).await;
    let value = value
        .as_str()
        .unwrap_or_else(|| panic!("{label} is not offered"));
    let select = c.find(Locator::Css("#sp-pick")).await.unwrap();
    select.select_by_value(value).await.unwrap();
}

/// Presses Preview and answers `[matches, verdict, delivered text or null]`.
async fn preview(c: &Client) -> Value {
    click(c, "#sp-run").await;
    wait_until(c, "return !!document.getElementById('sp-verdict') && !document.getElementById('sp-run').disabled;", "the preview's answer").await;
    js(c, "const d = document.getElementById('sp-delivered'); const v = document.getElementById('sp-verdict'); return [v.dataset.matches ?? null, v.textContent, d ? d.textContent : null];").await
}

fn value_of(field: &str) -> String {
    format!("return document.getElementById('{field}').value;")
}

#[test]
fn dashboard_previews_saves_and_removes_a_filter() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, settings) = start(dir.path());
    let receiver = Receiver::start(std::time::Duration::ZERO, 200);
    let base = server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Stored before the subscription exists: what its preview is tried on.
        deliver_json(&base, &settings, "usd-big", &charge("usd", 1200)).await;
        deliver_json(&base, &settings, "eur-small", &charge("eur", 50)).await;
        deliver(&base, &settings, "plain", r#"{"type":"order.completed"}"#).await;
        let driver = Driver::start().await;
        let (base, settings, receiver) = (&base, &settings, &receiver);
        driver.run("subscription-filter", 1280, |c| async move {
        open(&c, base).await;
        click(&c, "#subscriptions-new").await;
        type_into(&c, "#sf-name", "big-usd").await;
        type_into(&c, "#sf-types", "charge.*").await;
        type_into(&c, "#sf-url", &receiver.url).await;
        type_into(&c, "#sf-filter", FILTER).await;

        // The recent events the route takes (charge.*, not the order), newest first.
        click(&c, "#sp-recent").await;
        wait_until(&c, "return document.querySelectorAll('#sp-pick option').length > 1;", "the recent events").await;
        let offered = js(&c, "return [...document.querySelectorAll('#sp-pick option')].slice(1).map(o => o.textContent.split(' ')[0]);").await;
        assert_eq!(offered, json!(["shop/eur-small", "shop/usd-big"]));
        pick(&c, "shop/usd-big").await;
        assert_eq!(js(&c, "return [document.getElementById('sp-source').value, document.getElementById('sp-event_id').value];").await, json!(["shop", "usd-big"]));
        let [matches, verdict, delivered] = preview(&c).await.as_array().unwrap().clone().try_into().unwrap();
        assert_eq!(matches, "true", "{verdict}");
        let delivered = delivered.as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(delivered).unwrap(), charge("usd", 1200));
        assert!(delivered.contains("\n  \"data\""), "not pretty-printed: {delivered}");
        screenshot(&c, "subscription-filter-preview-1280").await;

        // Typed rather than picked: the one the filter leaves out, then one that is not there.
        type_into(&c, "#sp-event_id", "eur-small").await;
        let answer = preview(&c).await;
        assert_eq!(answer[0], "false", "{answer}");
        assert!(answer[1].as_str().unwrap().contains("the filter leaves it out"), "{answer}");
        assert_eq!(answer[2], Value::Null);
        type_into(&c, "#sp-event_id", XSS).await;
        let answer = preview(&c).await;
        assert_eq!(answer[0], Value::Null);
        assert!(answer[1].as_str().unwrap().contains(&format!("no event `{XSS}`")), "{answer}");
        inert(&c).await;
        // Nothing was saved by any of it.
        assert_eq!(subscription(base, "big-usd").await.0, 404);

        click(&c, "#sf-submit").await;
        wait_until(&c, "return !document.getElementById('sub-secret').hidden;", "the subscription made").await;
        let (_, list) = admin(reqwest::Method::GET, format!("{base}/subscriptions"), None).await;
        let made = list["subscriptions"].as_array().unwrap().iter().find(|s| s["name"] == "big-usd").unwrap();
        assert_eq!(made["filter"], serde_json::from_str::<Value>(FILTER).unwrap(), "{made}");

        // The fan-out applies it: eur-2 is left out, usd-2 forwarded (after eur-2, so that
        // eur-2's fan-out has been decided when usd-2 arrives).
        deliver_json(base, settings, "eur-2", &charge("eur", 5000)).await;
        deliver_json(base, settings, "usd-2", &charge("usd", 1000)).await;
        let forwarded = calls(receiver, 1).await;
        assert_eq!(forwarded[0].header("webhook-inbox-event-id"), Some("usd-2"));
        let (_, event) = admin(reqwest::Method::GET, format!("{base}/events/shop/eur-2"), None).await;
        assert_eq!(event["filtered_out"], json!(["big-usd"]), "{event}");

        // The event page says so, and shows no state of big-usd.
        c.goto(&format!("{base}/ui/#event/shop/eur-2")).await.unwrap();
        wait_until(&c, "return !!document.getElementById('event-filtered-out');", "the filtered-out line").await;
        assert_eq!(text_of(&c, "event-filtered-out").await,
            "Left out by the filter of: big-usd (no state there: never delivered to it).");
        assert_eq!(js(&c, "return !!document.querySelector('#event-subscriptions tr[data-subscription=\"big-usd\"]');").await, false);
        screenshot(&c, "event-filtered-out-1280").await;
        c.goto(&format!("{base}/ui/#event/shop/usd-2")).await.unwrap();
        wait_until(&c, "return !!document.querySelector('#event-subscriptions tr[data-subscription=\"big-usd\"]');", "usd-2's state in big-usd").await;
        assert_eq!(js(&c, "return !!document.getElementById('event-filtered-out');").await, false);

        // Edited: the filter shown pretty-printed; cleared, it is removed (PATCH filter: null).
        click(&c, "nav a[href='#subscriptions']").await;
        click(&c, "#subscriptions-body tr[data-name='big-usd'] button[aria-label='Edit big-usd']").await;
        wait_until(&c, "return document.getElementById('sf-name').value === 'big-usd';", "the editor on big-usd").await;
        let shown = js(&c, &value_of("sf-filter")).await;
        let shown = shown.as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(shown).unwrap(), made["filter"]);
        assert!(shown.contains("\n  \"all\": ["), "not pretty-printed: {shown}");
        // The preview of an edit runs the form's filter, not the saved one.
        type_into(&c, "#sf-filter", r#"{"path": "/data/object/currency", "eq": "eur"}"#).await;
        type_into(&c, "#sp-source", "shop").await;
        type_into(&c, "#sp-event_id", "eur-small").await;
        assert_eq!(preview(&c).await[0], "true");
        type_into(&c, "#sf-filter", "").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Saved big-usd: filter changed.';", "the filter removed").await;
        let (_, changed) = subscription(base, "big-usd").await;
        assert!(changed.get("filter").is_none(), "{changed}");
        assert_eq!(changed["route"]["types"], json!(["charge.*"]));
        inert(&c).await;
        }).await;
    });
}

#[test]
fn dashboard_shows_a_refused_filter_beside_its_field() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, settings) = start(dir.path());
    let base = server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        deliver_json(&base, &settings, "e1", &charge("usd", 1200)).await;
        // Markup in a saved filter's value: the editor shows it as the text it is.
        let hostile = json!({"name": "marked", "kind": "pull", "filter": {"path": "/note", "eq": XSS}});
        let made = admin(reqwest::Method::POST, format!("{base}/subscriptions"), Some(hostile)).await;
        assert_eq!(made.0, 201, "{}", made.1);
        let driver = Driver::start().await;
        let base = &base;
        driver.run("subscription-filter-refused", 1280, |c| async move {
        open(&c, base).await;
        click(&c, "#subscriptions-new").await;
        type_into(&c, "#sf-name", "refused").await;
        type_into(&c, "#sf-url", "http://127.0.0.1:9/in").await;
        let error = "return [document.getElementById('sf-filter-error').hidden, document.getElementById('sf-filter-error').textContent, document.getElementById('sf-error').hidden];";
        let invalid = "return [...document.querySelectorAll('#sub-editor [aria-invalid=true]')].map(e => e.id);";

        // Not JSON: said before anything is sent.
        type_into(&c, "#sf-filter", "{path: /a}").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return !document.getElementById('sf-filter-error').hidden;", "the filter's error").await;
        let shown = js(&c, error).await;
        assert!(shown[1].as_str().unwrap().starts_with("filter: is not JSON"), "{shown}");
        assert_eq!(js(&c, invalid).await, json!(["sf-filter"]));

        // The API's 422, naming the place, path and operator, beside the field; the form kept.
        let bad = r#"{"all": [{"path": "/currency", "eq": "usd"}, {"path": "/amount", "gte": {"x": 1}}]}"#;
        type_into(&c, "#sf-filter", bad).await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('sf-filter-error').textContent.startsWith('filter: all[1]');", "the API's refusal").await;
        let shown = js(&c, error).await;
        let message = shown[1].as_str().unwrap();
        assert!(message.contains("`/amount`") && message.contains("`gte`"), "{message}");
        assert_eq!((&shown[0], &shown[2]), (&json!(false), &json!(true)), "{shown}");
        assert_eq!(js(&c, invalid).await, json!(["sf-filter"]));
        assert_eq!(js(&c, "return document.activeElement.id;").await, "sf-filter");
        assert_eq!(js(&c, &value_of("sf-filter")).await, bad);
        assert_eq!(js(&c, &value_of("sf-name")).await, "refused");
        screenshot(&c, "subscription-filter-refused-1280").await;
        assert_eq!(subscription(base, "refused").await.0, 404);

        // The preview refuses it the same way, beside the field; markup in the path is text.
        type_into(&c, "#sf-filter", &format!(r#"{{"path": "/a", "{XSS}": 1}}"#)).await;
        type_into(&c, "#sp-source", "shop").await;
        type_into(&c, "#sp-event_id", "e1").await;
        click(&c, "#sp-run").await;
        wait_until(&c, "return !document.getElementById('sf-filter-error').hidden;", "the preview's refusal").await;
        let shown = js(&c, error).await;
        assert!(shown[1].as_str().unwrap().contains(&format!("unknown operator `{XSS}`")), "{shown}");
        assert_eq!(js(&c, "return document.getElementById('sp-result').textContent;").await, "");
        // Fixed, the marks go.
        type_into(&c, "#sf-filter", r#"{"path": "/data/object/amount", "gte": 1000}"#).await;
        assert_eq!(preview(&c).await[0], "true");
        assert_eq!(js(&c, invalid).await, json!([]));
        assert_eq!(js(&c, error).await[0], true);
        click(&c, "#sf-cancel").await;

        click(&c, "#subscriptions-body tr[data-name='marked'] button[aria-label='Edit marked']").await;
        wait_until(&c, "return document.getElementById('sf-name').value === 'marked';", "the editor on marked").await;
        let shown = js(&c, &value_of("sf-filter")).await;
        assert_eq!(serde_json::from_str::<Value>(shown.as_str().unwrap()).unwrap()["eq"], XSS);
        inert(&c).await;
        }).await;
    });
}

#[test]
fn dashboard_creates_and_edits_a_nats_subscription() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path());
    let base = server.base.clone();
    // The API checks the settings without connecting; no event is routed to it here.
    let broker = format!("nats://127.0.0.1:{}", free_port());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let (base, broker) = (&base, &broker);
        driver.run("subscription-nats-phone", 390, |c| async move {
        open(&c, base).await;
        click(&c, "#subscriptions-new").await;
        let shown = "return ['sf-url', 'sf-subject', 'sf-stream', 'sf-exchange', 'sf-routing_key', 'sf-transform', 'sf-timeout_ms'].filter(id => document.getElementById(id).offsetParent !== null);";
        assert_eq!(js(&c, shown).await, json!(["sf-url", "sf-transform", "sf-timeout_ms"]));
        let kind = c.find(Locator::Css("#sf-kind")).await.unwrap();
        kind.select_by_value("amqp").await.unwrap();
        assert_eq!(js(&c, shown).await, json!(["sf-url", "sf-exchange", "sf-routing_key", "sf-transform", "sf-timeout_ms"]));
        assert_eq!(text_of(&c, "sf-http-legend").await, "Broker (amqp)");
        kind.select_by_value("audit").await.unwrap();
        assert_eq!(js(&c, shown).await, json!([]));
        kind.select_by_value("nats").await.unwrap();
        assert_eq!(js(&c, shown).await, json!(["sf-url", "sf-subject", "sf-stream", "sf-transform", "sf-timeout_ms"]));
        assert_eq!(text_of(&c, "sf-http-legend").await, "Broker (nats)");

        type_into(&c, "#sf-name", "bus").await;
        type_into(&c, "#sf-sources", "shop").await;
        type_into(&c, "#sf-url", &broker.replace("nats://", "nats://bus:sekrit@")).await;
        type_into(&c, "#sf-subject", "webhooks.{source}.{type}").await;
        type_into(&c, "#sf-stream", "WEBHOOKS").await;
        type_into(&c, "#sf-timeout_ms", "3000").await;
        let fits = "return document.documentElement.scrollWidth <= window.innerWidth;";
        wait_until(&c, fits, "the editor to fit a phone").await;
        screenshot(&c, "subscription-nats-390").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Created bus.';", "bus made").await;
        // No secret: the broker's credentials are in its URL.
        assert_eq!(js(&c, "return document.getElementById('sub-secret').hidden;").await, true);
        let (status, made) = subscription(base, "bus").await;
        assert_eq!(status, 200, "{made}");
        assert_eq!((made["kind"].as_str(), made["subject"].as_str(), made["stream"].as_str()),
            (Some("nats"), Some("webhooks.{source}.{type}"), Some("WEBHOOKS")), "{made}");
        assert_eq!((made["url_origin"].as_str(), made["timeout_ms"].as_u64()), (Some(broker.as_str()), Some(3000)));

        click(&c, "#subscriptions-body tr[data-name='bus'] button[aria-label='Edit bus']").await;
        wait_until(&c, "return document.getElementById('sf-name').value === 'bus';", "the editor on bus").await;
        let values = "return ['sf-kind', 'sf-subject', 'sf-stream', 'sf-url', 'sf-timeout_ms'].map(id => document.getElementById(id).value);";
        assert_eq!(js(&c, values).await, json!(["nats", "webhooks.{source}.{type}", "WEBHOOKS", "", "3000"]));
        assert!(text_of(&c, "sf-url-hint").await.starts_with(&format!("Now publishes to {broker} ")));
        assert!(!js(&c, "return document.body.textContent;").await.to_string().contains("sekrit"));
        screenshot(&c, "subscription-nats-edit-390").await;
        type_into(&c, "#sf-subject", "events.{type}").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Saved bus: subject changed.';", "the subject changed").await;
        let (_, changed) = subscription(base, "bus").await;
        assert_eq!((changed["subject"].as_str(), changed["stream"].as_str()), (Some("events.{type}"), Some("WEBHOOKS")));
        inert(&c).await;
        }).await;
    });
}

#[test]

fn dashboard_previews_saves_and_removes_a_transform() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, settings) = start(dir.path());
    let base = server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        deliver_json(&base, &settings, "usd-big", &charge("usd", 1200)).await;
        let driver = Driver::start().await;
        let base = &base;
        driver.run("subscription-transform", 1280, |c| async move {
        open(&c, base).await;
        click(&c, "#subscriptions-new").await;
        type_into(&c, "#sf-name", "shaped").await;
        type_into(&c, "#sf-url", "http://127.0.0.1:9/in").await;
        let program = "{id: .data.object.id, cents: .data.object.amount, note: .data.object.note}";
        type_into(&c, "#sf-transform", program).await;
        type_into(&c, "#sp-source", "shop").await;
        type_into(&c, "#sp-event_id", "usd-big").await;
        let answer = preview(&c).await;
        assert_eq!(answer[0], "true", "{answer}");
        let delivered: Value = serde_json::from_str(answer[2].as_str().unwrap()).unwrap();
        assert_eq!(delivered, json!({"id": "ch_1", "cents": 1200, "note": XSS}));
        // A program that fails on the body: its error, as text.
        type_into(&c, "#sf-transform", ".data.object.amount | error(\"<b>too big</b>\")").await;
        let answer = preview(&c).await;
        assert_eq!(answer[0], "true", "{answer}");
        assert!(text_of(&c, "sp-error").await.contains("<b>too big</b>"));
        type_into(&c, "#sf-transform", program).await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return !document.getElementById('sub-secret').hidden;", "shaped made").await;
        assert_eq!(subscription(base, "shaped").await.1["transform"], program);

        click(&c, "#subscriptions-body tr[data-name='shaped'] button[aria-label='Edit shaped']").await;
        wait_until(&c, "return document.getElementById('sf-name').value === 'shaped';", "the editor on shaped").await;
        assert_eq!(js(&c, &value_of("sf-transform")).await, program);
        type_into(&c, "#sf-transform", "").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Saved shaped: transform changed.';", "the transform removed").await;
        assert!(subscription(base, "shaped").await.1.get("transform").is_none());
        inert(&c).await;
        }).await;
    });
}

#[test]

fn dashboard_creates_and_edits_an_amqp_subscription() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path());
    let base = server.base.clone();
    let broker = format!("amqp://127.0.0.1:{}", free_port());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let (base, broker) = (&base, &broker);
        driver.run("subscription-amqp", 1280, |c| async move {
        open(&c, base).await;
        click(&c, "#subscriptions-new").await;
        let kind = c.find(Locator::Css("#sf-kind")).await.unwrap();
        kind.select_by_value("amqp").await.unwrap();
        type_into(&c, "#sf-name", "rabbit").await;
        type_into(&c, "#sf-url", broker).await;
        type_into(&c, "#sf-exchange", "webhooks").await;
        type_into(&c, "#sf-routing_key", "{source}.{type}").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Created rabbit.';", "rabbit made").await;
        let (_, made) = subscription(base, "rabbit").await;
        assert_eq!((made["exchange"].as_str(), made["routing_key"].as_str()),
            (Some("webhooks"), Some("{source}.{type}")), "{made}");
        click(&c, "#subscriptions-body tr[data-name='rabbit'] button[aria-label='Edit rabbit']").await;
        wait_until(&c, "return document.getElementById('sf-name').value === 'rabbit';", "the editor on rabbit").await;
        let values = "return ['sf-kind', 'sf-exchange', 'sf-routing_key'].map(id => document.getElementById(id).value);";
        assert_eq!(js(&c, values).await, json!(["amqp", "webhooks", "{source}.{type}"]));
        type_into(&c, "#sf-routing_key", "hooks.{type}").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Saved rabbit: routing_key changed.';", "the key changed").await;
        assert_eq!(subscription(base, "rabbit").await.1["routing_key"], "hooks.{type}");
        }).await;
    });
}
