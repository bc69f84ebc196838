//! The dashboard's subscription editor in a real browser (headless chromium), against the real
//! binary on a random port: an `http` subscription created through the form forwards a signed
//! event to a real local endpoint; its types edited; the API's refusals (422 naming the field,
//! 409 for a taken name) shown beside the form, which keeps what was typed; deleted through a
//! confirmation; a `listen` session badged, shown alone, and given no editor; a token rotated.

use std::time::{Duration, Instant};

use fantoccini::Client;
use serde_json::{Value, json};

use crate::browser::{Driver, click, js, screenshot, type_into, wait_until};
use crate::dashboard::{browser_found, sign_in};
use crate::helpers::{ADMIN_TOKEN, order_body, sign_for};
use crate::process::{ServerProcess, free_port, write_config};
use crate::receiver::{Call, Receiver};

/// The binary with its consumers running (the forwarders must call), retries quick.
pub fn start(dir: &std::path::Path) -> (ServerProcess, webhook_inbox::config::Settings) {
    let port = free_port();
    let consumers = "backoff_base_ms = 10\nbackoff_max_ms = 100";
    let (config, settings) = write_config(dir, port, "", consumers);
    (
        ServerProcess::start(dir, &config, port, "server.log"),
        settings,
    )
}

pub async fn admin(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(ADMIN_TOKEN)
        .timeout(Duration::from_secs(10));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub async fn subscription(base: &str, name: &str) -> (u16, Value) {
    let url = format!("{base}/subscriptions/{name}");
    admin(reqwest::Method::GET, url, None).await
}

pub async fn deliver(base: &str, settings: &webhook_inbox::config::Settings, id: &str, body: &str) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/webhooks/shop"))
        .body(body.to_string());
    for (k, v) in sign_for(settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200);
}

/// Wait (at most 20 s) until the receiver has had `n` calls.
pub async fn calls(receiver: &Receiver, n: usize) -> Vec<Call> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let calls = receiver.calls();
        if calls.len() >= n {
            return calls;
        }
        assert!(
            Instant::now() < deadline,
            "{} calls, {n} expected",
            calls.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `call` carries a Standard Webhooks signature made with `secret`.
fn signed_with(call: &Call, secret: &str) -> bool {
    let secret = webhook_inbox::signature::Secret::new(secret);
    let resigned = webhook_inbox::signature::Scheme::StandardWebhooks
        .sign(
            &secret,
            call.header("webhook-id").unwrap(),
            "",
            &call.body,
            call.header("webhook-timestamp").unwrap().parse().unwrap(),
        )
        .unwrap();
    let expected = &resigned
        .iter()
        .find(|(h, _)| h == "webhook-signature")
        .unwrap()
        .1;
    call.header("webhook-signature")
        .is_some_and(|s| s.contains(expected.as_str()))
}

pub async fn text_of(c: &Client, id: &str) -> String {
    let script = format!("return document.getElementById('{id}').textContent;");
    js(c, &script).await.as_str().unwrap().to_string()
}

/// The editor's error, once shown.
async fn form_error(c: &Client) -> String {
    wait_until(c, "const e = document.getElementById('sf-error'); return !e.hidden && e.classList.contains('error');", "the form's error").await;
    text_of(c, "sf-error").await
}

const INVALID: &str =
    "return [...document.querySelectorAll('#sub-editor [aria-invalid=true]')].map(e => e.id);";

#[test]
fn dashboard_creates_edits_and_deletes_an_http_subscription() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, settings) = start(dir.path());
    let receiver = Receiver::start(Duration::ZERO, 200);
    // A credential in the query: it must never come back, from the API or on the page.
    let url = format!("{}?key=sekrit-in-the-query", receiver.url);
    let origin = receiver.url.trim_end_matches("/in").to_string();
    let base = server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let (settings, receiver) = (&settings, &receiver);
        driver.run("subscription-editor", 1280, |c| async move {
        c.goto(&format!("{base}/ui/")).await.unwrap();
        js(&c, "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));").await;
        sign_in(&c, ADMIN_TOKEN).await;
        click(&c, "nav a[href='#subscriptions']").await;
        wait_until(&c, "return document.querySelectorAll('#subscriptions-body tr').length === 3;", "the implicit three").await;

        // Created through the form: the secret shown once, with the warning.
        click(&c, "#subscriptions-new").await;
        type_into(&c, "#sf-name", "hooks").await;
        type_into(&c, "#sf-types", "order.*").await;
        type_into(&c, "#sf-url", &url).await;
        type_into(&c, "#sf-timeout_ms", "2000").await;
        screenshot(&c, "subscription-new-1280").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return !document.getElementById('sub-secret').hidden;", "the generated secret").await;
        let secret = text_of(&c, "sub-secret-value").await;
        assert!(secret.starts_with("whsec_"), "{secret}");
        assert!(text_of(&c, "sub-secret-warning").await.contains("shown this once"));
        assert_eq!(text_of(&c, "sub-secret-title").await, "The signing secret of hooks");
        wait_until(&c, "return !!document.querySelector('#subscriptions-body tr[data-name=\"hooks\"]');", "the new row").await;
        screenshot(&c, "subscription-secret-1280").await;
        let (status, made) = subscription(&base, "hooks").await;
        assert_eq!(status, 200, "{made}");
        assert_eq!((made["kind"].as_str(), made["origin"].as_str()), (Some("http"), Some("api")));
        assert_eq!(made["route"]["types"], json!(["order.*"]));
        assert_eq!(made["url_origin"], origin.as_str());
        assert_eq!(made["timeout_ms"], 2000);
        let (_, list) = admin(reqwest::Method::GET, format!("{base}/subscriptions"), None).await;
        assert!(!list.to_string().contains("sekrit"), "{list}");
        assert!(!js(&c, "return document.body.textContent;").await.to_string().contains("sekrit"));

        // A real endpoint gets the event, signed with the secret the page showed.
        deliver(&base, settings, "o1", &order_body("o1", "c1", 1)).await;
        let call = calls(receiver, 1).await.remove(0);
        assert_eq!(call.header("webhook-inbox-event-id"), Some("o1"));
        assert!(signed_with(&call, &secret), "not signed with the shown secret");
        click(&c, "#sub-secret-done").await;
        assert_eq!(text_of(&c, "sub-secret-value").await, "");

        // A bad URL: the API's 422 beside the form, the field marked, what was typed kept.
        click(&c, "#subscriptions-body tr[data-name='hooks'] button[aria-label='Edit hooks']").await;
        wait_until(&c, "return document.getElementById('sf-types').value === 'order.*' && document.getElementById('sf-name').disabled;", "the editor on hooks").await;
        assert_eq!(js(&c, "return document.getElementById('sf-url').value;").await, "");
        type_into(&c, "#sf-types", "invoice.*").await;
        type_into(&c, "#sf-url", "ftp://nowhere").await;
        click(&c, "#sf-submit").await;
        let error = form_error(&c).await;
        assert!(error.starts_with("url: "), "{error}");
        assert_eq!(js(&c, INVALID).await, json!(["sf-url"]));
        assert_eq!(js(&c, "return [document.getElementById('sf-types').value, document.getElementById('sf-url').value, document.getElementById('sub-editor').hidden];").await,
            json!(["invoice.*", "ftp://nowhere", false]));
        screenshot(&c, "subscription-refused-1280").await;
        // Unchanged by the refusal.
        assert_eq!(subscription(&base, "hooks").await.1["route"]["types"], json!(["order.*"]));

        // Only the types change: the URL (left empty) is kept.
        type_into(&c, "#sf-url", "").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Saved hooks: types changed.';", "the change saved").await;
        assert!(js(&c, "return document.getElementById('sub-editor').hidden;").await == true);
        let (_, changed) = subscription(&base, "hooks").await;
        assert_eq!(changed["route"]["types"], json!(["invoice.*"]));
        assert_eq!(changed["url_origin"], origin.as_str());
        let route = js(&c, "return document.querySelector('#subscriptions-body tr[data-name=\"hooks\"] td[data-label=\"Route\"]').textContent;").await;
        assert_eq!(route, "every source · invoice.*");
        deliver(&base, settings, "i1", r#"{"type":"invoice.paid"}"#).await;
        let forwarded = calls(receiver, 2).await;
        assert_eq!(forwarded[1].header("webhook-inbox-event-id"), Some("i1"));

        // A taken name: 409 beside the form, the name marked. Markup in a refused value is
        // shown as its characters.
        click(&c, "#subscriptions-new").await;
        type_into(&c, "#sf-name", "hooks").await;
        type_into(&c, "#sf-url", "http://127.0.0.1:9/x").await;
        click(&c, "#sf-submit").await;
        assert!(form_error(&c).await.contains("`hooks` exists"));
        assert_eq!(js(&c, INVALID).await, json!(["sf-name"]));
        type_into(&c, "#sf-name", "other").await;
        type_into(&c, "#sf-sources", "<img src=x onerror=window.__xss=1>").await;
        click(&c, "#sf-submit").await;
        wait_until(&c, "return document.getElementById('sf-error').textContent.startsWith('sources: ');", "the refused source").await;
        assert!(text_of(&c, "sf-error").await.contains("<img src=x onerror=window.__xss=1>"));
        assert_eq!(js(&c, "return document.querySelectorAll('main img').length;").await, 0);
        assert_eq!(js(&c, "return window.__xss === undefined;").await, true, "the markup ran");
        assert_eq!(js(&c, "return window.__violations;").await, json!([]));
        click(&c, "#sf-cancel").await;

        // Delete asks first, naming it and what happens to its unfinished events.
        let paused = admin(reqwest::Method::POST, format!("{base}/subscriptions/hooks/pause"), None).await;
        assert_eq!(paused.0, 200);
        deliver(&base, settings, "i2", r#"{"type":"invoice.paid"}"#).await;
        // Fanned out (a state of its own), so that the removal finishes it.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, event) = admin(reqwest::Method::GET, format!("{base}/events/shop/i2"), None).await;
            let subs = event["subscriptions"].as_array().cloned().unwrap_or_default();
            if subs.iter().any(|s| s["name"] == "hooks" && s["status"] == "pending") {
                break;
            }
            assert!(Instant::now() < deadline, "i2 never pending for hooks: {event}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        click(&c, "#subscriptions-refresh").await;
        wait_until(&c, "const t = document.querySelector('#subscriptions-body tr[data-name=\"hooks\"] td[data-label=\"Pending\"]'); return !!t && t.textContent === '1';", "hooks' pending event").await;
        let delete = "#subscriptions-body tr[data-name='hooks'] button[aria-label='Delete hooks']";
        click(&c, delete).await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-title').textContent === 'Delete hooks?';", "the delete confirmation").await;
        let warning = text_of(&c, "confirm-text").await;
        assert!(warning.contains("Its 1 unfinished event (1 pending, 0 claimed) ends completed with outcome \"removed\": hooks never gets it."), "{warning}");
        screenshot(&c, "subscription-delete-1280").await;
        click(&c, "#confirm[open] button[value='cancel']").await;
        wait_until(&c, "return !document.getElementById('confirm').open;", "the dialog closed").await;
        assert_eq!(subscription(&base, "hooks").await.0, 200);
        click(&c, delete).await;
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'Deleted hooks: 1 unfinished event completed with outcome \"removed\".';", "the deletion and its count").await;
        assert_eq!(subscription(&base, "hooks").await.0, 404);
        // Its row stays, removed, with nothing left to do.
        let row = "#subscriptions-body tr[data-name=\"hooks\"]";
        assert_eq!(js(&c, &format!("const r = document.querySelector('{row}'); return [r.querySelector('td[data-label=State]').textContent, r.querySelectorAll('button').length];")).await, json!(["removed", 0]));
        }).await;
    });
}

#[test]
fn dashboard_badges_sessions_and_rotates_a_pull_token() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path());
    let base = server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let made = |query: &'static str, name: &'static str| {
            let url = format!("{base}/subscriptions{query}");
            admin(reqwest::Method::POST, url, Some(json!({"name": name, "kind": "pull"})))
        };
        assert_eq!(made("?session=true", "listen-7f3a").await.0, 201);
        let (status, workers) = made("", "workers").await;
        assert_eq!(status, 201);
        let old_token = workers["token"].as_str().unwrap().to_string();
        let driver = Driver::start().await;
        let base = &base;
        driver.run("subscription-sessions-phone", 390, |c| async move {
        c.goto(&format!("{base}/ui/#subscriptions")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        let row = |name: &str| format!("#subscriptions-body tr[data-name=\"{name}\"]");
        wait_until(&c, &format!("return !!document.querySelector('{}');", row("listen-7f3a")), "the session's row").await;
        let badge = |name: &str| format!("return document.querySelector('{} .badge.origin').textContent;", row(name));
        assert_eq!(js(&c, &badge("listen-7f3a")).await, "listen session");
        assert_eq!(js(&c, &badge("workers")).await, "api");
        assert_eq!(js(&c, &badge("audit")).await, "config");
        // A session has no editor (it ends with its listen); it can be deleted.
        let labels = |name: &str| format!("return [...document.querySelectorAll('{} button')].map(b => b.textContent);", row(name));
        assert_eq!(js(&c, &labels("listen-7f3a")).await, json!(["Pause", "Delete"]));
        assert_eq!(js(&c, &labels("workers")).await, json!(["Pause", "Edit", "Delete"]));
        // Shown alone.
        js(&c, "const s = document.getElementById('subscriptions-origin'); s.value = 'session'; s.dispatchEvent(new Event('change'));").await;
        wait_until(&c, "const names = [...document.querySelectorAll('#subscriptions-body tr')].map(r => r.dataset.name); return names.length === 1 && names[0] === 'listen-7f3a';", "only the session").await;
        let fits = "return document.documentElement.scrollWidth <= window.innerWidth;";
        wait_until(&c, fits, "the sessions to fit a phone").await;
        screenshot(&c, "subscriptions-sessions-390").await;
        js(&c, "const s = document.getElementById('subscriptions-origin'); s.value = ''; s.dispatchEvent(new Event('change'));").await;

        // The editor of a pull subscription: no http fields; its token rotates behind a
        // confirmation, the new one shown once.
        click(&c, &format!("{} button[aria-label='Edit workers']", row("workers"))).await;
        wait_until(&c, "return !document.getElementById('sub-editor').hidden && document.getElementById('sf-http').hidden && !document.getElementById('sub-rotate').hidden;", "the editor of workers").await;
        wait_until(&c, fits, "the editor to fit a phone").await;
        screenshot(&c, "subscription-edit-390").await;
        type_into(&c, "#sr-grace", "1").await;
        click(&c, "#sr-submit").await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-title').textContent === 'Rotate the token of workers?';", "the rotation's confirmation").await;
        assert!(text_of(&c, "confirm-text").await.contains("keeps opening its routes for 1 hour"));
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return !document.getElementById('sub-secret').hidden;", "the new token").await;
        let token = text_of(&c, "sub-secret-value").await;
        assert!(text_of(&c, "sub-secret-warning").await.contains("cannot be read again"));
        assert_ne!(token, old_token);
        for t in [&token, &old_token] {
            let claim = reqwest::Client::new()
                .post(format!("{base}/subscriptions/workers/claim"))
                .bearer_auth(t)
                .json(&json!({"wait_ms": 0}))
                .send()
                .await
                .unwrap();
            assert_eq!(claim.status(), 200, "a token refused after the rotation");
        }
        // Deleted, the session is gone from the registry.
        click(&c, &format!("{} button[aria-label='Delete listen-7f3a']", row("listen-7f3a"))).await;
        wait_until(&c, "return document.getElementById('confirm').open;", "the delete confirmation").await;
        assert!(text_of(&c, "confirm-text").await.contains("The listen session using it stops receiving events."));
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent.startsWith('Deleted listen-7f3a: 0 unfinished events');", "the session deleted").await;
        assert_eq!(subscription(base, "listen-7f3a").await.0, 404);
        // Signing out takes the token shown off the page.
        assert!(!js(&c, "return document.getElementById('sub-secret').hidden;").await.as_bool().unwrap());
        click(&c, "#logout").await;
        sign_in(&c, ADMIN_TOKEN).await;
        c.goto(&format!("{base}/ui/#subscriptions")).await.unwrap();
        wait_until(&c, "return !!document.querySelector('#subscriptions-body tr[data-name=\"workers\"]');", "the view again").await;
        assert_eq!(js(&c, "return [document.getElementById('sub-secret').hidden, document.getElementById('sub-secret-value').textContent];").await, json!([true, ""]));
        }).await;
    });
}
