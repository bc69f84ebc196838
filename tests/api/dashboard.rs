//! The ops dashboard in a real browser (headless chromium through chromedriver), against the
//! real binary on a random port. Screenshots of the main views land in `target/ui-screenshots/`.

use std::time::Duration;

use fantoccini::{Client, Locator, key::Key};
use serde_json::Value;

use crate::browser::{Driver, click, js, screenshot, type_into, wait_until};
use crate::helpers::{ADMIN_TOKEN, order_body};
use crate::process::{ServerProcess, free_port, send_signed, write_config};
use crate::requires;

/// The binary with no consumers running: events are processed only by `POST /events/run`, so
/// each test sets up exactly the states it looks at.
struct Seeded {
    server: ServerProcess,
    _dir: tempfile::TempDir,
}

fn start_and_seed(deliveries: &[(&str, String)]) -> Seeded {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (config, settings) = write_config(dir.path(), port, "", "workers = 0\nmax_attempts = 3");
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for (id, body) in deliveries {
        assert_eq!(send_signed(&client, &server.base, &settings, id, body), 200);
    }
    let run = client
        .post(format!("{}/events/run?limit=100", server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap();
    assert_eq!(run.status(), 200);
    Seeded { server, _dir: dir }
}

/// An order event the loyalty consumer refuses at once: no `order_id`.
fn bad_order() -> String {
    r#"{"type":"order.completed","data":{"customer_id":"c-9","points":5}}"#.into()
}

async fn status_of(base: &str, event_id: &str) -> String {
    let event: Value = reqwest::Client::new()
        .get(format!("{base}/events/shop/{event_id}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    event["status"].as_str().unwrap().to_string()
}

async fn sign_in(c: &Client, token: &str) {
    type_into(c, "input[name=token]", token).await;
    click(c, "#login-form button[type=submit]").await;
}

fn row(event_id: &str) -> String {
    format!("tr[data-event=\"shop/{event_id}\"]")
}

async fn click_in_row(c: &Client, event_id: &str, label: &str) {
    let xpath = format!("//tr[@data-event='shop/{event_id}']//button[normalize-space()='{label}']");
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath(&xpath))
        .await
        .unwrap_or_else(|e| panic!("no {label} button for {event_id}: {e}"))
        .click()
        .await
        .unwrap();
}

async fn row_says(c: &Client, event_id: &str, status: &str) {
    let script = format!(
        "const r = document.querySelector('{}'); return !!r && r.querySelector('.badge').textContent === '{status}';",
        row(event_id)
    );
    wait_until(c, &script, &format!("{event_id} shown as {status}")).await;
}

async fn set_status_filter(c: &Client, status: &str) {
    js(
        c,
        &format!("document.getElementById('f-status').value = '{status}';"),
    )
    .await;
    click(c, "#filters button[type=submit]").await;
}

#[test]
fn dashboard_signs_in_inspects_and_retries_in_a_real_browser() {
    if !requires::available("chromium and chromedriver", crate::browser::found()) {
        return;
    }
    let seeded = start_and_seed(&[
        ("evt_fail_1", bad_order()),
        ("evt_fail_2", bad_order()),
        ("evt_fail_3", bad_order()),
        ("evt_done_1", order_body("ord-1", "c-1", 7)),
    ]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let c = driver.session(1280).await;
        c.goto(&format!("{base}/ui/")).await.unwrap();

        // A wrong token is refused and not kept.
        sign_in(&c, "not-the-token").await;
        wait_until(&c, "const e = document.getElementById('login-error'); return !e.hidden && e.textContent.includes('Wrong token');", "the wrong-token message").await;
        assert_eq!(js(&c, "return sessionStorage.length;").await, 0);
        screenshot(&c, "login-wrong-token-1280").await;

        // The right one: overview with the counts; the token only in sessionStorage.
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "const f = document.querySelector('#counts .status-failed .count'); return !!f && f.textContent === '3';", "3 failed in the overview").await;
        assert_eq!(js(&c, "return Object.values(sessionStorage);").await, serde_json::json!([ADMIN_TOKEN]));
        assert_eq!(js(&c, "return localStorage.length + document.cookie.length;").await, 0);
        let href = js(&c, "return location.href;").await;
        assert!(!href.as_str().unwrap().contains(ADMIN_TOKEN), "token in the URL: {href}");
        wait_until(&c, "return document.querySelectorAll('#chart rect.bar').length === 60;", "the per-minute chart").await;
        screenshot(&c, "overview-1280").await;

        // The list opens on failed events; each row shows its event id as text.
        click(&c, "nav a[href='#events']").await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 3;", "3 failed rows").await;
        let ids = js(&c, "return [...document.querySelectorAll('#events-body tr td:first-child a')].map(a => a.textContent).sort();").await;
        assert_eq!(ids, serde_json::json!(["evt_fail_1", "evt_fail_2", "evt_fail_3"]));
        assert!(js(&c, &format!("return document.querySelector('{} td:nth-child(6)').textContent;", row("evt_fail_1"))).await.as_str().unwrap().contains("order_id"));
        screenshot(&c, "events-failed-1280").await;

        // The detail: body as text, the attempt timeline.
        click(&c, &format!("{} a", row("evt_fail_1"))).await;
        wait_until(&c, "const b = document.getElementById('event-body'); return !!b && b.textContent.includes('\"customer_id\": \"c-9\"');", "the pretty-printed body").await;
        wait_until(&c, "return document.querySelectorAll('.timeline li').length === 1 && document.querySelector('.timeline').textContent.includes('permanent_error');", "the attempt timeline").await;
        screenshot(&c, "event-detail-1280").await;

        // Retry from the list: the row shows the new state, and the API agrees.
        click(&c, "nav a[href='#events']").await;
        click_in_row(&c, "evt_fail_1", "Retry").await;
        row_says(&c, "evt_fail_1", "pending").await;
        assert_eq!(status_of(&base, "evt_fail_1").await, "pending");

        // Force retry of a completed event: Escape cancels, the confirmation says why.
        set_status_filter(&c, "completed").await;
        click_in_row(&c, "evt_done_1", "Force retry").await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-text').textContent.includes('already completed');", "the force-retry confirmation").await;
        screenshot(&c, "force-retry-confirmation-1280").await;
        c.active_element().await.unwrap().send_keys(&Key::Escape.to_string()).await.unwrap();
        wait_until(&c, "return !document.getElementById('confirm').open;", "Escape closing the dialog").await;
        assert_eq!(status_of(&base, "evt_done_1").await, "completed");
        click_in_row(&c, "evt_done_1", "Force retry").await;
        click(&c, "#confirm[open] #confirm-ok").await;
        row_says(&c, "evt_done_1", "pending").await;
        assert_eq!(status_of(&base, "evt_done_1").await, "pending");

        // Bulk retry of what the filters match, after a confirmation with the count.
        set_status_filter(&c, "failed").await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 2;", "2 failed rows left").await;
        click(&c, "#bulk-retry").await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-title').textContent === 'Retry 2 failed events?';", "the bulk confirmation with its count").await;
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return document.getElementById('list-status').textContent === 'Retried 2 events.';", "the bulk answer").await;
        for id in ["evt_fail_2", "evt_fail_3"] {
            assert_eq!(status_of(&base, id).await, "pending");
        }

        // Log out: the token is gone and the form is back.
        click(&c, "#logout").await;
        wait_until(&c, "return !document.getElementById('view-login').hidden && sessionStorage.length === 0;", "the sign-in form after logout").await;
        c.close().await.unwrap();
    });
}

/// Bodies are attacker-controlled: markup in one is shown as characters and runs nothing.
/// At 390 px wide no view scrolls sideways.
#[test]
fn dashboard_shows_hostile_bodies_as_text_and_fits_a_phone() {
    if !requires::available("chromium and chromedriver", crate::browser::found()) {
        return;
    }
    let hostile = serde_json::json!({
        "type": "note.created",
        // No quotes: JSON would escape them, and the escaped handler would not parse as code.
        "img": "<img src=x onerror=window.__xss=1>",
        "script": "<script>window.__xss = 2</script>",
        "long": "x".repeat(300),
    })
    .to_string();
    let seeded = start_and_seed(&[
        ("evt_hostile", hostile),
        (
            "evt_fail_with_a_rather_long_identifier_0123456789abcdef0123456789",
            bad_order(),
        ),
        ("evt_order", order_body("ord-7", "cust-7", 12)),
    ]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let c = driver.session(390).await;
        c.goto(&format!("{base}/ui/")).await.unwrap();
        assert_eq!(js(&c, "return window.innerWidth;").await, 390);
        // Any attempt to run inline code would also be refused by the CSP: record those too.
        js(&c, "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));").await;
        let fits = "return document.documentElement.scrollWidth <= window.innerWidth;";

        wait_until(&c, fits, "the sign-in form to fit").await;
        screenshot(&c, "login-390").await;
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#chart rect.bar').length === 60;", "the overview").await;
        wait_until(&c, fits, "the overview to fit").await;
        screenshot(&c, "overview-390").await;

        click(&c, "nav a[href='#events']").await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 1;", "the failed row").await;
        wait_until(&c, fits, "the event list to fit").await;
        screenshot(&c, "events-failed-390").await;

        c.goto(&format!("{base}/ui/#event/shop/evt_hostile")).await.unwrap();
        wait_until(&c, "const b = document.getElementById('event-body'); return !!b && b.textContent.includes('note.created');", "the hostile event's body").await;
        // Nothing in it became an element, nothing ran, nothing even tried to.
        assert_eq!(js(&c, "return document.querySelectorAll('main img, main script').length;").await, 0);
        assert_eq!(js(&c, "return window.__xss === undefined;").await, true, "the injected code ran");
        assert_eq!(js(&c, "return window.__violations;").await, serde_json::json!([]));
        // It is shown as the characters it is made of.
        let body = js(&c, "return document.getElementById('event-body').textContent;").await;
        let body = body.as_str().unwrap();
        assert!(body.contains("<img src=x onerror=window.__xss=1>"), "{body}");
        assert!(body.contains("<script>window.__xss = 2</script>"), "{body}");
        wait_until(&c, fits, "the event detail to fit").await;
        js(&c, "document.getElementById('event-body').scrollIntoView();").await;
        screenshot(&c, "event-detail-hostile-390").await;

        click(&c, "nav a[href='#loyalty']").await;
        type_into(&c, "#customer", "cust-7").await;
        click(&c, "#loyalty-form button").await;
        wait_until(&c, "return document.getElementById('loyalty-result').textContent.includes(': 12 points');", "the balance").await;
        wait_until(&c, fits, "the loyalty view to fit").await;

        click(&c, "nav a[href='#requests']").await;
        wait_until(&c, "return document.getElementById('requests-status').textContent !== '';", "the requests view").await;
        wait_until(&c, fits, "the requests view to fit").await;
        c.close().await.unwrap();
    });
}
