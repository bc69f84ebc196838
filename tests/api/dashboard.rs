//! The ops dashboard in a real browser (headless chromium through chromedriver), against the
//! real binary on a random port. Screenshots of the main views land in `target/ui-screenshots/`;
//! a test that fails leaves one of the failing view there too (`FAILED-<test>-<width>.png`,
//! named in its panic message).

use std::time::Duration;

use fantoccini::{Client, Locator, key::Key};
use serde_json::{Value, json};

use crate::browser::{
    Driver, click, click_located, js, screenshot, type_into, wait_at_most, wait_until,
};
use crate::helpers::{ADMIN_TOKEN, order_body, sign_for, sign_with};
use crate::process::{ServerProcess, free_port, send_signed, write_config};
use crate::requires;

/// The binary with no consumers running: events are processed only by `POST /events/run`, so
/// each test sets up exactly the states it looks at.
struct Seeded {
    server: ServerProcess,
    settings: webhook_inbox::config::Settings,
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
    Seeded {
        server,
        settings,
        _dir: dir,
    }
}

/// An order event the loyalty consumer refuses at once: no `order_id`.
fn bad_order() -> String {
    r#"{"type":"order.completed","data":{"customer_id":"c-9","points":5}}"#.into()
}

/// The shape of the ids some providers send.
const GUID: &str = "3f2b8c1e-9a4d-4e6b-8f1a-2c7d9e0b5a64";
const LONG_ID: &str = "evt_fail_with_a_rather_long_identifier_0123456789abcdef0123456789";

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

/// A signed delivery from inside the browser test's runtime.
async fn deliver(seeded: &Seeded, event_id: &str, body: &str) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/webhooks/shop", seeded.server.base))
        .body(body.to_string());
    for (k, v) in sign_for(&seeded.settings, "shop", event_id, body.as_bytes()) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200);
}

pub async fn sign_in(c: &Client, token: &str) {
    // The button is enabled once main.js has taken the form over.
    wait_until(
        c,
        "const b = document.querySelector('#login-form button[type=submit]'); return !!b && !b.disabled;",
        "the sign-in form to be ready",
    )
    .await;
    type_into(c, "input[name=token]", token).await;
    click(c, "#login-form button[type=submit]").await;
}

fn row(event_id: &str) -> String {
    format!("tr[data-event=\"shop/{event_id}\"]")
}

async fn click_in_row(c: &Client, event_id: &str, label: &str) {
    let xpath = format!("//tr[@data-event='shop/{event_id}']//button[normalize-space()='{label}']");
    click_located(
        c,
        Locator::XPath(&xpath),
        &format!("the {label} button for {event_id}"),
    )
    .await;
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

/// The event ids of the list's rows, sorted.
async fn listed_ids(c: &Client) -> Value {
    js(c, "return [...document.querySelectorAll('#events-body tr td:first-child a')].map(a => a.textContent).sort();").await
}

/// How many lines the text of an element takes: the distinct tops of its text's rectangles (a
/// text cut with an ellipsis has more than one rectangle, on one line).
const LINES: &str = "const lines = (el) => { const r = document.createRange(); r.selectNodeContents(el); return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; };";

pub fn browser_found() -> bool {
    requires::available("chromium and chromedriver", crate::browser::found())
}

#[test]
fn dashboard_signs_in_inspects_and_retries_in_a_real_browser() {
    if !browser_found() {
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
        driver.run("signs-in-inspects-retries", 1280, |c| async move {
        c.goto(&format!("{base}/ui/")).await.unwrap();

        // A wrong token is refused and not kept.
        sign_in(&c, "not-the-token").await;
        wait_until(&c, "const e = document.getElementById('login-error'); return !e.hidden && e.textContent.includes('Wrong token');", "the wrong-token message").await;
        assert_eq!(js(&c, "return sessionStorage.length;").await, 0);
        screenshot(&c, "login-wrong-token-1280").await;

        // The right one: overview with the counts; the token only in sessionStorage.
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "const f = document.querySelector('#counts .status-failed .count'); return !!f && f.textContent === '3';", "3 failed in the overview").await;
        assert_eq!(js(&c, "return Object.values(sessionStorage);").await, json!([ADMIN_TOKEN]));
        assert_eq!(js(&c, "return localStorage.length + document.cookie.length;").await, 0);
        let href = js(&c, "return location.href;").await;
        assert!(!href.as_str().unwrap().contains(ADMIN_TOKEN), "token in the URL: {href}");
        wait_until(&c, "return document.querySelectorAll('#chart rect.bar').length === 60;", "the per-minute chart").await;
        screenshot(&c, "overview-1280").await;

        // The list opens on failed events; each row shows its event id as text.
        click(&c, "nav a[href='#events']").await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 3;", "3 failed rows").await;
        assert_eq!(listed_ids(&c).await, json!(["evt_fail_1", "evt_fail_2", "evt_fail_3"]));
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

        // A completed event shows its outcome in the list, and no Force retry: the one action
        // that repeats an effect is on the event's own page only.
        set_status_filter(&c, "completed").await;
        wait_until(&c, &format!("const r = document.querySelector('{}'); return !!r && r.querySelector('td:nth-child(6)').textContent === 'credited';", row("evt_done_1")), "the outcome credited in the list").await;
        assert_eq!(
            js(&c, "return [...document.querySelectorAll('#events-body button')].map(b => b.textContent).filter(t => t !== 'Copy');").await,
            json!([]),
            "the list offers no retry of a completed event"
        );
        click(&c, &format!("{} a.event-id", row("evt_done_1"))).await;

        // There, Force retry asks first: Escape cancels, the confirmation says why.
        let force = "//div[@id='event-detail']//button[normalize-space()='Force retry']";
        click_located(&c, Locator::XPath(force), "the Force retry button on the completed event's page").await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-text').textContent.includes('already completed') && document.getElementById('confirm-text').textContent.includes('credited');", "the force-retry confirmation").await;
        screenshot(&c, "force-retry-confirmation-1280").await;
        c.active_element().await.unwrap().send_keys(&Key::Escape.to_string()).await.unwrap();
        wait_until(&c, "return !document.getElementById('confirm').open;", "Escape closing the dialog").await;
        assert_eq!(status_of(&base, "evt_done_1").await, "completed");
        click_located(&c, Locator::XPath(force), "the Force retry button").await;
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "const s = document.getElementById('detail-status'); return !!s && s.textContent === 'shop/evt_done_1 is now pending.';", "the detail after the forced retry").await;
        assert_eq!(status_of(&base, "evt_done_1").await, "pending");

        // Bulk retry of what the filters match, after a confirmation with the count.
        click(&c, "nav a[href='#events']").await;
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
        }).await;
    });
}

/// At 1280 px an id, a GUID, a type like `order.completed` and every button take one line:
/// ids in a monospace column cut with an ellipsis (the whole id on hover, a Copy button), and
/// the outcome of completed events in the list.
#[test]
fn dashboard_list_keeps_ids_types_and_buttons_on_one_line_at_1280() {
    if !browser_found() {
        return;
    }
    let seeded = start_and_seed(&[
        (GUID, order_body("ord-1", "c-1", 7)),
        ("evt_again", order_body("ord-1", "c-1", 7)),
        (LONG_ID, bad_order()),
    ]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("list-one-line", 1280, |c| async move {
        c.goto(&format!("{base}/ui/#events?status=any")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 3;", "3 rows").await;
        screenshot(&c, "events-any-1280").await;

        // Each id, type and source on one line, and every button of the view too.
        let wrapped = js(&c, &format!("{LINES} return [...document.querySelectorAll('#events-body a.event-id, #events-body .type, #events-body .source, #view-events button:not([hidden])')].filter(e => lines(e) !== 1).map(e => e.textContent);")).await;
        assert_eq!(wrapped, json!([]), "wrapped at 1280 px");
        // A GUID is shown whole; a longer id is cut with an ellipsis, whole in its title.
        let id = |event_id: &str| format!("document.querySelector('{} a.event-id')", row(event_id));
        assert_eq!(js(&c, &format!("const a = {}; return a.scrollWidth <= a.clientWidth && a.title;", id(GUID))).await, json!(GUID), "the GUID is cut");
        assert_eq!(js(&c, &format!("const a = {}; return a.scrollWidth > a.clientWidth && getComputedStyle(a).textOverflow === 'ellipsis' && a.title;", id(LONG_ID))).await, json!(LONG_ID));
        assert_eq!(js(&c, "return getComputedStyle(document.querySelector('a.event-id')).fontFamily.includes('Mono');").await, true);
        assert_eq!(js(&c, "return document.documentElement.scrollWidth <= window.innerWidth;").await, true, "the list scrolls sideways");

        // Outcomes of completed events, the error of the failed one, no Force retry anywhere.
        let result = |event_id: &str| format!("return document.querySelector('{} td:nth-child(6)').textContent;", row(event_id));
        assert_eq!(js(&c, &result(GUID)).await, "credited");
        assert_eq!(js(&c, &result("evt_again")).await, "duplicate_order");
        assert!(js(&c, &result(LONG_ID)).await.as_str().unwrap().contains("order_id"));
        let labels = js(&c, "return [...document.querySelectorAll('#events-body button')].map(b => b.getAttribute('aria-label')).sort();").await;
        assert_eq!(labels, json!(["Copy event id", "Copy event id", "Copy event id", format!("Retry shop/{LONG_ID}")]));

        // Copy puts the whole id on the clipboard (the clipboard API, stubbed to record it).
        js(&c, "navigator.clipboard.writeText = (t) => { window.__copied = t; return Promise.resolve(); };").await;
        click(&c, &format!("{} button.copy", row(GUID))).await;
        wait_until(&c, &format!("return window.__copied === '{GUID}' && document.getElementById('list-status').textContent.includes('Copied');"), "the copied id").await;
        }).await;
    });
}

/// Filters live in the URL: applying them changes it, and the URL pasted into a new tab (the
/// token typed again) shows the same filtered rows; "Back to events" keeps them too.
#[test]
fn dashboard_filters_live_in_the_url() {
    if !browser_found() {
        return;
    }
    let seeded = start_and_seed(&[
        ("evt_order_1", order_body("ord-1", "c-1", 7)),
        ("evt_order_2", order_body("ord-2", "c-1", 3)),
        ("evt_failed", bad_order()),
        ("evt_note", r#"{"type":"note.created"}"#.to_string()),
    ]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("filters-in-url", 1280, |c| async move {
        c.goto(&format!("{base}/ui/")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        click(&c, "nav a[href='#events']").await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 1;", "the failed row").await;

        js(&c, "document.getElementById('f-status').value = 'completed'; document.getElementById('f-after').value = '2000-01-01T00:00:00';").await;
        type_into(&c, "#f-type", "order.completed").await;
        click(&c, "#filters button[type=submit]").await;
        wait_until(&c, "return location.hash.includes('type=order.completed') && document.querySelectorAll('#events-body tr').length === 2;", "the filtered rows and URL").await;
        assert_eq!(listed_ids(&c).await, json!(["evt_order_1", "evt_order_2"]));
        let url = js(&c, "return location.href;").await.as_str().unwrap().to_string();
        assert!(url.contains("status=completed") && url.contains("received_after=2000-01-01T"), "{url}");
        assert!(!url.contains(ADMIN_TOKEN), "{url}");

        // "Back to events" from an event returns to the filtered list.
        click(&c, &format!("{} a.event-id", row("evt_order_1"))).await;
        wait_until(&c, "return !!document.getElementById('event-body');", "the event's page").await;
        click(&c, "#back-to-events").await;
        wait_until(&c, "return location.hash.includes('type=order.completed') && document.querySelectorAll('#events-body tr').length === 2;", "the filtered list again").await;

        // The URL in a new tab: sign in again, the same filters and rows.
        let tab = c.new_window(true).await.unwrap();
        c.switch_to_window(tab.handle).await.unwrap();
        c.goto(&url).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 2;", "the filtered rows in the new tab").await;
        assert_eq!(listed_ids(&c).await, json!(["evt_order_1", "evt_order_2"]));
        let form = js(&c, "return ['f-status', 'f-source', 'f-type', 'f-after', 'f-before'].map(id => document.getElementById(id).value);").await;
        assert_eq!(form, json!(["completed", "", "order.completed", "2000-01-01T00:00", ""]));

        // A reload keeps them; a URL without filters is the default view (failed events).
        c.refresh().await.unwrap();
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 2 && document.getElementById('f-type').value === 'order.completed';", "the filtered rows after a reload").await;
        c.goto(&format!("{base}/ui/#events")).await.unwrap();
        wait_until(&c, "return document.getElementById('f-status').value === 'failed' && document.getElementById('f-type').value === '' && document.querySelectorAll('#events-body tr').length === 1;", "the default filters").await;
        }).await;
    });
}

/// The overview refreshes itself: a delivery sent after the page loaded shows in its counts
/// without a reload, and a hidden tab makes no calls. Its chart has axes with labels.
#[test]
fn dashboard_overview_refreshes_itself_while_visible() {
    if !browser_found() {
        return;
    }
    let seeded = start_and_seed(&[("evt_done", order_body("ord-1", "c-1", 7))]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let seeded = &seeded;
        driver.run("overview-refresh", 1280, |c| async move {
        c.goto(&format!("{base}/ui/")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        let count = |status: &str| format!("const n = document.querySelector('#counts .status-{status} .count'); return n ? n.textContent : null;");
        wait_until(&c, "const n = document.querySelector('#counts .status-completed .count'); return !!n && n.textContent === '1';", "the overview").await;
        assert_eq!(js(&c, &count("pending")).await, "0");

        // The chart: counts on the y axis, local times on the x axis, a label for readers.
        let ticks = js(&c, "return [...document.querySelectorAll('#chart svg text.tick')].map(t => t.textContent);").await;
        let ticks: Vec<&str> = ticks.as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        assert!(ticks.contains(&"0") && ticks.contains(&"1"), "count labels: {ticks:?}");
        let times = ticks.iter().filter(|t| t.contains(':')).count();
        assert!(times >= 5, "time labels: {ticks:?}");
        let label = js(&c, "return document.querySelector('#chart svg').getAttribute('aria-label');").await;
        assert!(label.as_str().unwrap().starts_with("Events received per minute") && label.as_str().unwrap().contains("1 in all"), "{label}");
        assert_eq!(js(&c, "return document.querySelector('#overview-auto').checked && document.querySelector('label[for], label.check').textContent.length > 0;").await, true);
        screenshot(&c, "overview-axes-1280").await;

        // Count the page's reads of the stats from here on; a marker tells a reload apart.
        js(&c, "window.__marker = 1; window.__reads = 0; const f = window.fetch; window.fetch = (u, o) => { if (String(u).includes('/events/stats')) window.__reads++; return f(u, o); };").await;
        deliver(seeded, "evt_late", &order_body("ord-2", "c-1", 3)).await;
        // A refresh every 5 s: within 10 s without a reload.
        wait_at_most(&c, Duration::from_secs(10), "const n = document.querySelector('#counts .status-pending .count'); return !!n && n.textContent === '1' && window.__marker === 1;", "the new delivery counted without a reload").await;
        wait_until(&c, "return document.querySelector('#chart svg').getAttribute('aria-label').includes('2 in all');", "the chart with the new delivery").await;

        // A hidden tab makes no call; visible again, it catches up at once.
        js(&c, "Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' }); document.dispatchEvent(new Event('visibilitychange')); window.__hiddenReads = window.__reads;").await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(js(&c, "return window.__reads - window.__hiddenReads;").await, 0, "calls while hidden");
        js(&c, "Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'visible' }); document.dispatchEvent(new Event('visibilitychange'));").await;
        wait_at_most(&c, Duration::from_secs(2), "return window.__reads > window.__hiddenReads;", "a read when shown again").await;
        }).await;
    });
}

/// `/docs/`: descriptions rendered from their Markdown as elements (never as markup), the
/// routes a provider or an integrator needs first, labelled `METHOD /path`, the pages' own
/// files not listed; it fits a phone.
#[test]
fn api_reference_renders_markdown_and_lists_the_routes_newcomers_need_first() {
    if !browser_found() {
        return;
    }
    let seeded = start_and_seed(&[]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let docs = format!("{base}/docs/");
        driver.run("api-reference", 1280, |c| async move {
        c.goto(&docs).await.unwrap();
        js(&c, "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));").await;
        wait_until(&c, "return document.querySelectorAll('#operations .op').length > 10;", "the operations").await;
        screenshot(&c, "api-reference-1280").await;

        let routes = js(&c, "return [...document.querySelectorAll('#toc li li a')].map(a => a.textContent);").await;
        let routes: Vec<&str> = routes.as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
        assert_eq!(routes.first(), Some(&"POST /webhooks/{source}"), "{routes:?}");
        assert_eq!(js(&c, "return document.querySelector('#operations .op h3').textContent;").await, "POST /webhooks/{source}");
        assert!(routes.iter().all(|r| ["GET /", "POST /", "PATCH /", "DELETE /"].iter().any(|m| r.starts_with(m))), "{routes:?}");
        assert!(!routes.iter().any(|r| r.contains("{asset}")), "{routes:?}");
        assert!(routes.contains(&"GET /events") && routes.contains(&"POST /events/{source}/{event_id}/retry"), "{routes:?}");
        let requests = routes.iter().position(|r| *r == "POST /requests").unwrap();
        let events = routes.iter().position(|r| *r == "GET /events").unwrap();
        assert!(requests < events, "the integrator's routes before the ops ones: {routes:?}");
        assert_eq!(js(&c, "return [...document.querySelectorAll('#operations h3')].filter(h => h.textContent.includes('{asset}')).length;").await, 0);
        let wrapped = js(&c, &format!("{LINES} return [...document.querySelectorAll('#toc li li a, #operations .op h3')].filter(e => lines(e) !== 1).map(e => e.textContent);")).await;
        assert_eq!(wrapped, json!([]), "route labels on more than one line at 1280 px");

        // Backticks are code elements; no description shows a backtick any more.
        let code = js(&c, "return [...document.querySelectorAll('#operations .desc code')].map(c => c.textContent);").await;
        assert!(code.as_array().unwrap().contains(&json!("force=true")), "{code}");
        assert_eq!(js(&c, "return [...document.querySelectorAll('#intro, #operations .desc, #operations summary')].filter(e => e.textContent.includes('`')).map(e => e.textContent);").await, json!([]));
        assert_eq!(js(&c, "return document.querySelector('#intro code').textContent;").await, r#"{"error": code, "message": text}"#);

        // The renderer itself: bold, code, paragraphs and lists as elements, markup as text.
        let rendered = js(&c, r#"return import('/docs/markdown.js').then(m => {
            const box = document.createElement('div');
            box.append(...m.markdown('**Bold** and `a <b>` code,\nand <img src=x onerror=window.__xss=1>\n\nSecond\n\n- one\n- **two**'));
            return { tags: [...box.children].map(e => e.tagName), strong: [...box.querySelectorAll('strong')].map(e => e.textContent),
              code: [...box.querySelectorAll('code')].map(e => e.textContent), elements: box.querySelectorAll('img, b').length,
              first: box.firstChild.textContent, items: box.querySelectorAll('li').length };
        });"#).await;
        assert_eq!(rendered, json!({
            "tags": ["P", "P", "UL"], "strong": ["Bold", "two"], "code": ["a <b>"], "elements": 0,
            "first": "Bold and a <b> code, and <img src=x onerror=window.__xss=1>", "items": 2,
        }));
        assert_eq!(js(&c, "return window.__xss === undefined && window.__violations.length === 0;").await, true);
        js(&c, "document.getElementById('post-events-source-event-id-retry').scrollIntoView();").await;
        screenshot(&c, "api-reference-retry-1280").await;
        }).await;

        let docs = format!("{base}/docs/");
        driver.run("api-reference", 390, |c| async move {
        c.goto(&docs).await.unwrap();
        wait_until(&c, "return document.querySelectorAll('#operations .op').length > 10;", "the operations").await;
        wait_until(&c, "return document.documentElement.scrollWidth <= window.innerWidth;", "the reference to fit a phone").await;
        screenshot(&c, "api-reference-390").await;
        }).await;
    });
}

/// Bodies are attacker-controlled: markup in one is shown as characters and runs nothing.
/// At 390 px wide no view scrolls sideways.
#[test]
fn dashboard_shows_hostile_bodies_as_text_and_fits_a_phone() {
    if !browser_found() {
        return;
    }
    let hostile = json!({
        "type": "note.created",
        // No quotes: JSON would escape them, and the escaped handler would not parse as code.
        "img": "<img src=x onerror=window.__xss=1>",
        "script": "<script>window.__xss = 2</script>",
        "long": "x".repeat(300),
    })
    .to_string();
    let seeded = start_and_seed(&[
        ("evt_hostile", hostile),
        (LONG_ID, bad_order()),
        ("evt_order", order_body("ord-7", "cust-7", 12)),
    ]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("hostile-bodies-phone", 390, |c| async move {
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
        // The long id is cut to the card's width, on one line.
        assert_eq!(js(&c, &format!("{LINES} const a = document.querySelector('a.event-id'); return lines(a) === 1 && a.scrollWidth > a.clientWidth && a.title;")).await, json!(LONG_ID));
        screenshot(&c, "events-failed-390").await;

        c.goto(&format!("{base}/ui/#event/shop/evt_hostile")).await.unwrap();
        wait_until(&c, "const b = document.getElementById('event-body'); return !!b && b.textContent.includes('note.created');", "the hostile event's body").await;
        // Nothing in it became an element, nothing ran, nothing even tried to.
        assert_eq!(js(&c, "return document.querySelectorAll('main img, main script').length;").await, 0);
        assert_eq!(js(&c, "return window.__xss === undefined;").await, true, "the injected code ran");
        assert_eq!(js(&c, "return window.__violations;").await, json!([]));
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
        }).await;
    });
}

/// `POST /webhooks/{source}` with these headers, from inside the browser test's runtime;
/// answers the status.
async fn post_webhook(base: &str, source: &str, headers: &[(String, String)], body: &str) -> u16 {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/webhooks/{source}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    req.send().await.unwrap().status().as_u16()
}

/// The kept refusals (`GET /rejections`), once there are `n`: a background task writes them,
/// so this waits, at most 10 s.
async fn rejections_kept(base: &str, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page: Value = reqwest::Client::new()
            .get(format!("{base}/rejections?limit=500"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let rows = page["rejections"].as_array().unwrap().clone();
        if rows.len() >= n {
            return rows;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} refusals kept, {n} expected: {rows:?}",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Markup in a refused request's header: it must reach the page as characters.
const HOSTILE_AGENT: &str = "<img src=x onerror=window.__xss=1>";

/// The reasons of the Rejected view's rows, top to bottom.
const REASONS: &str = "return [...document.querySelectorAll('#rejected-body tr[data-rejection] .reason')].map(e => e.textContent);";

/// The value cell of header `name` in the opened details of the first `reason` row.
fn header_value(reason: &str, name: &str) -> String {
    format!(
        "const d = document.querySelector('#rejected-body tr[data-reason=\"{reason}\"] + tr.detail-row'); const r = d && !d.hidden && d.querySelector('tr[data-header=\"{name}\"] td:nth-child(2)'); return r ? r.textContent : null;"
    )
}

/// Whether [`header_value`] is `value` (for [`wait_until`]).
fn header_is(reason: &str, name: &str, value: &str) -> String {
    format!(
        "return (() => {{ {} }})() === '{value}';",
        header_value(reason, name)
    )
}

/// Deliveries refused at the edge, in their own view: the empty state says what the view is
/// for; a forged signature and an unknown source show with their reasons; a row opens (by
/// keyboard) onto its headers, secrets shown as "(not kept)" and markup as text; the reason
/// filter lives in the URL (pasted in a new tab, the same row); older refusals page in; a
/// 390 px phone does not scroll sideways.
#[test]
fn dashboard_rejected_view_lists_refusals_with_filters_in_the_url() {
    if !browser_found() {
        return;
    }
    let seeded = start_and_seed(&[]);
    let base = seeded.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let seeded = &seeded;
        let b = base.clone();
        driver.run("rejected", 1280, |c| async move {
        let base = b;
        c.goto(&format!("{base}/ui/")).await.unwrap();
        js(&c, "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));").await;
        sign_in(&c, ADMIN_TOKEN).await;
        click(&c, "nav a[href='#rejected']").await;

        // Nothing refused yet: the view says what it is for.
        wait_until(&c, "const s = document.getElementById('rejected-status'); return location.hash === '#rejected' && s.classList.contains('empty') && s.textContent.includes('None kept yet.');", "the empty state").await;
        let empty = js(&c, "return document.getElementById('rejected-status').textContent;").await;
        assert_eq!(empty, "Deliveries refused at the edge: bad signature, stale timestamp, unknown source, oversize, bad body, forbidden sender. None kept yet.");
        assert_eq!(js(&c, "return document.getElementById('rejected-table').hidden && document.querySelector('nav a[aria-current=page]').textContent;").await, "Rejected");
        screenshot(&c, "rejected-empty-1280").await;

        // A delivery to `shop` signed with another secret, with markup in a header, then one
        // to a source nobody configured.
        let body = order_body("o-1", "c-1", 1);
        let mut forged = sign_with(
            webhook_inbox::signature::Scheme::StandardWebhooks,
            "whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI=",
            "forged-1",
            body.as_bytes(),
            webhook_inbox::domain::time::now_secs(),
        );
        forged.push(("user-agent".into(), HOSTILE_AGENT.into()));
        assert_eq!(post_webhook(&base, "shop", &forged, &body).await, 401);
        let signed = sign_for(&seeded.settings, "shop", "x-1", b"{}");
        assert_eq!(post_webhook(&base, "nope", &signed, "{}").await, 404);
        rejections_kept(&base, 2).await;

        // Refresh shows them, newest first, each field as text.
        click(&c, "#rejected-refresh").await;
        wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 2;", "the 2 refusals").await;
        assert_eq!(js(&c, REASONS).await, json!(["unknown_source", "invalid_signature"]));
        let cells = js(&c, "return [...document.querySelectorAll('#rejected-body tr[data-rejection]')].map(r => [...r.querySelectorAll('td')].slice(1, 7).map(td => td.textContent));").await;
        let cells = cells.as_array().unwrap();
        assert_eq!(cells[0].as_array().unwrap()[..5], [json!("nope"), json!("unknown_source"), json!("404"), json!("127.0.0.1"), json!("2 B")], "{cells:?}");
        assert_eq!(cells[1].as_array().unwrap()[..5], [json!("shop"), json!("invalid_signature"), json!("401"), json!("127.0.0.1"), json!(format!("{} B", body.len()))], "{cells:?}");
        assert!(cells[0][5].as_str().unwrap().contains("nope"), "the message: {cells:?}");
        assert!(!cells[1][5].as_str().unwrap().is_empty(), "the message: {cells:?}");
        // Received in local time, UTC on hover; the reason in monospace.
        let title = js(&c, "return document.querySelector('#rejected-body tr[data-rejection] time').title;").await;
        assert!(title.as_str().unwrap().ends_with("Z (UTC)"), "{title}");
        assert_eq!(js(&c, "return getComputedStyle(document.querySelector('#rejected-body .reason')).fontFamily.includes('Mono');").await, true);
        assert_eq!(js(&c, "return document.querySelector('#rejected-status').textContent;").await, "2 refused deliveries shown.");
        assert_eq!(js(&c, "return document.documentElement.scrollWidth <= window.innerWidth;").await, true, "the list scrolls sideways");
        let wrapped = js(&c, &format!("{LINES} return [...document.querySelectorAll('#rejected-body .reason, #rejected-body time, #view-rejected button:not([hidden])')].filter(e => lines(e) !== 1).map(e => e.textContent);")).await;
        assert_eq!(wrapped, json!([]), "wrapped at 1280 px");
        screenshot(&c, "rejected-1280").await;

        // The invalid_signature row opens by keyboard onto its headers and body digest.
        let toggle = "#rejected-body tr[data-reason='invalid_signature'] button.details";
        assert_eq!(js(&c, &format!("const b = document.querySelector(\"{toggle}\"); return b.getAttribute('aria-expanded') + ' ' + b.getAttribute('aria-label');")).await, "false Details of refusal 1: headers and body digest");
        c.find(Locator::Css(toggle)).await.unwrap().send_keys(&Key::Enter.to_string()).await.unwrap();
        wait_until(&c, &header_is("invalid_signature", "webhook-id", "forged-1"), "the webhook-id header").await;
        assert_eq!(js(&c, &header_value("invalid_signature", "webhook-id")).await, "forged-1");
        assert_eq!(js(&c, &header_value("invalid_signature", "webhook-signature")).await, "(not kept)");
        assert_eq!(js(&c, &header_value("invalid_signature", "webhook-timestamp")).await.as_str().map(|t| t.parse::<i64>().is_ok()), Some(true));
        assert_eq!(js(&c, &format!("return document.querySelector(\"{toggle}\").getAttribute('aria-expanded');")).await, "true");
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body.as_bytes()));
        assert_eq!(js(&c, "return document.querySelector('#rejected-body tr.detail-row:not([hidden]) .sha').textContent;").await, json!(digest));
        // The markup in the user-agent header is shown as its characters; nothing ran.
        assert_eq!(js(&c, &header_value("invalid_signature", "user-agent")).await, HOSTILE_AGENT);
        assert_eq!(js(&c, "return document.querySelectorAll('main img, main script').length;").await, 0);
        assert_eq!(js(&c, "return window.__xss === undefined && window.__violations.length === 0;").await, true);
        js(&c, "document.querySelector('#rejected-body tr.detail-row:not([hidden])').scrollIntoView();").await;
        screenshot(&c, "rejected-details-1280").await;
        // Closed again by keyboard.
        c.find(Locator::Css(toggle)).await.unwrap().send_keys(&Key::Enter.to_string()).await.unwrap();
        wait_until(&c, "return document.querySelector('#rejected-body tr.detail-row:not([hidden])') === null;", "the details closed").await;

        // The reason filter, through the form: the URL says it, one row is left.
        type_into(&c, "#r-reason", "invalid_signature").await;
        click(&c, "#rejected-filters button[type=submit]").await;
        wait_until(&c, "return location.hash === '#rejected?reason=invalid_signature' && document.querySelectorAll('#rejected-body tr[data-rejection]').length === 1;", "the filtered row and URL").await;
        assert_eq!(js(&c, REASONS).await, json!(["invalid_signature"]));
        let url = js(&c, "return location.href;").await.as_str().unwrap().to_string();
        assert!(!url.contains(ADMIN_TOKEN), "{url}");

        // The URL in a new tab: sign in again, the same filter and row.
        let first = c.window().await.unwrap();
        let tab = c.new_window(true).await.unwrap();
        c.switch_to_window(tab.handle.clone()).await.unwrap();
        c.goto(&url).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 1 && !document.getElementById('view-rejected').hidden;", "the filtered row in the new tab").await;
        assert_eq!(js(&c, REASONS).await, json!(["invalid_signature"]));
        assert_eq!(js(&c, "return ['r-source', 'r-reason', 'r-after', 'r-before'].map(id => document.getElementById(id).value);").await, json!(["", "invalid_signature", "", ""]));
        c.close_window().await.unwrap();
        c.switch_to_window(first).await.unwrap();

        // A filter nothing matches says so; Reset is every refusal again.
        js(&c, "document.getElementById('r-after').value = '2999-01-01T00:00:00';").await;
        click(&c, "#rejected-filters button[type=submit]").await;
        wait_until(&c, "return location.hash.includes('received_after=2999-') && document.getElementById('rejected-status').textContent === 'No refused delivery matches these filters.' && document.getElementById('rejected-table').hidden;", "no match").await;
        click(&c, "#r-reset").await;
        wait_until(&c, "return location.hash === '#rejected' && document.querySelectorAll('#rejected-body tr[data-rejection]').length === 2;", "every refusal after Reset").await;

        // Older refusals page in through the cursor, 50 at a time.
        for i in 0..50 {
            let signed = sign_for(&seeded.settings, "shop", &format!("n-{i}"), b"{}");
            assert_eq!(post_webhook(&base, "nope", &signed, "{}").await, 404);
        }
        rejections_kept(&base, 52).await;
        click(&c, "#rejected-refresh").await;
        wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 50 && !document.getElementById('rejected-more').hidden;", "the first page").await;
        assert_eq!(js(&c, "return document.getElementById('rejected-status').textContent;").await, "50 refused deliveries shown; older ones on the next page.");
        click(&c, "#rejected-more").await;
        wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 52 && document.getElementById('rejected-more').hidden;", "the second page").await;
        assert_eq!(js(&c, "return [...document.querySelectorAll('#rejected-body tr[data-rejection]')].slice(-1)[0].dataset.reason;").await, "invalid_signature");
        }).await;

        driver.run("rejected", 390, |c| async move {
        let fits = "return document.documentElement.scrollWidth <= window.innerWidth;";
        c.goto(&format!("{base}/ui/#rejected")).await.unwrap();
        assert_eq!(js(&c, "return window.innerWidth;").await, 390);
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 50;", "the refusals").await;
        wait_until(&c, fits, "the list to fit").await;
        screenshot(&c, "rejected-390").await;
        js(&c, "document.getElementById('rejected-table').scrollIntoView();").await;
        screenshot(&c, "rejected-rows-390").await;
        c.goto(&format!("{base}/ui/#rejected?reason=invalid_signature")).await.unwrap();
        wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 1;", "the filtered row").await;
        click(&c, "#rejected-body button.details").await;
        wait_until(&c, &header_is("invalid_signature", "webhook-signature", "(not kept)"), "the opened details").await;
        wait_until(&c, fits, "the opened details to fit").await;
        js(&c, "document.querySelector('#rejected-body tr.detail-row').scrollIntoView();").await;
        screenshot(&c, "rejected-details-390").await;
        }).await;
    });
}
