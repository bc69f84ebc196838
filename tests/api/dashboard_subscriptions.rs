//! The dashboard's subscriptions in a real browser (headless chromium), against the real binary:
//! the subscriptions view with its counts, Pause and Resume behind a confirmation, and an
//! event's page with each subscription's state and a Retry of one subscription alone.

use std::time::Duration;

use serde_json::Value;

use crate::browser::{Driver, click, js, screenshot, wait_until};
use crate::dashboard::{browser_found, sign_in};
use crate::helpers::{ADMIN_TOKEN, order_body};
use crate::process::{ServerProcess, free_port, send_signed, write_config};
use crate::subscriptions::FAN_OUT;

fn run_consumers(client: &reqwest::blocking::Client, base: &str) {
    let run = client
        .post(format!("{base}/events/run?limit=100"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap();
    assert_eq!(run.status(), 200);
}

async fn subscription(base: &str, name: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{base}/subscriptions/{name}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn state_in(base: &str, event_id: &str, name: &str) -> String {
    let event: Value = reqwest::Client::new()
        .get(format!("{base}/events/shop/{event_id}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    event["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .map(|s| s["status"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[test]
fn dashboard_pauses_resumes_and_retries_per_subscription() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (config, settings) =
        write_config(dir.path(), port, FAN_OUT, "workers = 0\nmax_attempts = 3");
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = server.base.clone();
    let bad = r#"{"type":"order.completed","data":{"customer_id":"c-9","points":5}}"#;
    assert_eq!(send_signed(&client, &base, &settings, "evt_bad", bad), 200);
    let good = order_body("ord-1", "c-1", 7);
    assert_eq!(
        send_signed(&client, &base, &settings, "evt_good", &good),
        200
    );
    run_consumers(&client, &base);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        let (settings, client) = (&settings, &client);
        driver.run("subscriptions", 1280, |c| async move {
        c.goto(&format!("{base}/ui/")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        click(&c, "nav a[href='#subscriptions']").await;
        wait_until(&c, "return document.querySelectorAll('#subscriptions-body tr').length === 4;", "four subscriptions").await;
        let cell = |name: &str, label: &str| format!("return document.querySelector('#subscriptions-body tr[data-name=\"{name}\"] td[data-label=\"{label}\"]').textContent;");
        assert_eq!(js(&c, &cell("points", "Failed")).await, "1");
        assert_eq!(js(&c, &cell("points", "Completed")).await, "1");
        assert_eq!(js(&c, &cell("ledger", "Completed")).await, "2");
        assert_eq!(js(&c, &cell("archive", "Route")).await, "shop, stripe · every type");
        screenshot(&c, "subscriptions-1280").await;

        // Pause asks first; Cancel changes nothing.
        click(&c, "#subscriptions-body tr[data-name='archive'] button").await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-title').textContent === 'Pause archive?';", "the pause confirmation").await;
        click(&c, "#confirm[open] button[value='cancel']").await;
        wait_until(&c, "return !document.getElementById('confirm').open;", "the dialog closed").await;
        assert_eq!(subscription(&base, "archive").await["state"], "active");
        click(&c, "#subscriptions-body tr[data-name='archive'] button").await;
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'archive is now paused.';", "archive paused").await;
        assert_eq!(subscription(&base, "archive").await["state"], "paused");

        // While paused, its events wait and its lag shows; the others go on.
        let (b, s, cl) = (base.clone(), settings.clone(), client.clone());
        tokio::task::spawn_blocking(move || {
            assert_eq!(send_signed(&cl, &b, &s, "evt_late", &order_body("ord-2", "c-1", 1)), 200);
            run_consumers(&cl, &b);
        })
        .await
        .unwrap();
        click(&c, "#subscriptions-refresh").await;
        wait_until(&c, "const t = document.querySelector('#subscriptions-body tr[data-name=\"archive\"] td[data-label=\"Lag\"]'); return !!t && t.textContent.startsWith('1 ');", "archive's lag of 1").await;
        assert_eq!(js(&c, &cell("ledger", "Lag")).await, "0");
        screenshot(&c, "subscriptions-paused-1280").await;
        click(&c, "#subscriptions-body tr[data-name='archive'] button").await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-title').textContent === 'Resume archive?';", "the resume confirmation").await;
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent === 'archive is now active.';", "archive active").await;

        // The event's page: each subscription's state; Retry of the failed one alone.
        c.goto(&format!("{base}/ui/#event/shop/evt_bad")).await.unwrap();
        wait_until(&c, "return document.querySelectorAll('#event-subscriptions tbody tr').length === 3;", "three subscription rows").await;
        let badge = |name: &str| format!("return document.querySelector('#event-subscriptions tr[data-subscription=\"{name}\"] .badge').textContent;");
        assert_eq!(js(&c, &badge("points")).await, "failed");
        assert_eq!(js(&c, &badge("ledger")).await, "completed");
        assert!(js(&c, "return document.querySelector('.timeline').textContent;").await.as_str().unwrap().contains("points · attempt 1"));
        screenshot(&c, "event-subscriptions-1280").await;
        click(&c, "#event-subscriptions tr[data-subscription='points'] button[aria-label='Retry shop/evt_bad in points']").await;
        wait_until(&c, "const s = document.getElementById('detail-status'); return !!s && s.textContent === 'shop/evt_bad is now pending.';", "the retried state").await;
        assert_eq!(state_in(&base, "evt_bad", "points").await, "pending");
        assert_eq!(state_in(&base, "evt_bad", "ledger").await, "completed");
        }).await;
    });
}

/// An ordered subscription whose failed event holds its key: the view says so under its row,
/// and the link opens that event, whose Skip lets the key go on.
#[test]
fn dashboard_shows_keys_held_by_a_failed_event() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ordered = "\n[[subscriptions]]\nname = \"points\"\nkind = \"loyalty-credit\"\n\
                   types = [\"order.completed\"]\nordered_by = \"/data/customer_id\"\n";
    let (config, settings) = write_config(dir.path(), port, ordered, "workers = 0");
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = server.base.clone();
    let bad = r#"{"type":"order.completed","data":{"customer_id":"c-9","points":5}}"#;
    assert_eq!(send_signed(&client, &base, &settings, "evt_bad", bad), 200);
    let later = order_body("ord-9", "c-9", 7);
    assert_eq!(
        send_signed(&client, &base, &settings, "evt_later", &later),
        200
    );
    run_consumers(&client, &base);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let page = base.clone();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("held-keys", 1280, |c| async move {
        let base = page;
        c.goto(&format!("{base}/ui/")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        click(&c, "nav a[href='#subscriptions']").await;
        wait_until(&c, "return !!document.querySelector('#subscriptions-body tr.held[data-held=\"points\"]');", "the held keys of points").await;
        let held = js(&c, "return document.querySelector('#subscriptions-body tr.held').textContent;").await;
        assert!(held.as_str().unwrap().contains("c-9 held by shop/evt_bad (1 waiting)"), "{held}");
        let route = js(&c, "return document.querySelector('#subscriptions-body tr[data-name=\"points\"] td[data-label=\"Route\"]').textContent;").await;
        assert!(route.as_str().unwrap().ends_with("ordered by /data/customer_id"), "{route}");
        screenshot(&c, "subscriptions-held-1280").await;
        click(&c, "#subscriptions-body tr.held a").await;
        wait_until(&c, "return location.hash === '#event/shop/evt_bad' && document.querySelectorAll('#event-subscriptions tbody tr').length === 1;", "the holding event").await;
        }).await;
    });
    // Skipped (as ops would from the API or CLI), the key goes on.
    let skip = client
        .post(format!(
            "{base}/events/shop/evt_bad/skip?subscription=points"
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap();
    assert_eq!(skip.status(), 200);
    run_consumers(&client, &base);
    assert_eq!(
        rt.block_on(state_in(&base, "evt_later", "points")),
        "completed"
    );
}
