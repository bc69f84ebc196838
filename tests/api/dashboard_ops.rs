//! The dashboard for ops with several subscriptions (issue 63), in a real browser against the
//! real binary: the failed list at 1280 px with long errors and types, the list filtered by a
//! subscription with a bulk retry scoped to it, the subscriptions view's counts as links and its
//! Recover, and the overview counting events.

use std::time::Duration;

use serde_json::{Value, json};

use crate::browser::{Driver, click, js, screenshot, wait_until};
use crate::dashboard::{browser_found, sign_in};
use crate::helpers::ADMIN_TOKEN;
use crate::process::{ServerProcess, free_port, send_signed, write_config};
use crate::pull::PULL_TOKEN;

/// 40 characters.
const LONG_TYPE: &str = "customer.subscription.trial_will_end.v12";
/// 60 characters.
const LONG_ERROR: &str = "upstream billing refused the customer: account frozen (c-42).";

fn subscriptions() -> String {
    format!(
        r#"
[[subscriptions]]
name = "points"
kind = "loyalty-credit"
types = ["order.completed"]

[[subscriptions]]
name = "workers"
kind = "pull"
types = ["customer.*"]
token = "{PULL_TOKEN}"

[[subscriptions]]
name = "ledger"
kind = "audit"
"#
    )
}

struct Ops {
    server: ServerProcess,
    client: reqwest::blocking::Client,
    settings: webhook_inbox::config::Settings,
    _dir: tempfile::TempDir,
}

impl Ops {
    fn start() -> Ops {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let (config, settings) = write_config(
            dir.path(),
            port,
            &subscriptions(),
            "workers = 0\nmax_attempts = 3",
        );
        let server = ServerProcess::start(dir.path(), &config, port, "server.log");
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        Ops {
            server,
            client,
            settings,
            _dir: dir,
        }
    }

    fn deliver(&self, id: &str, body: &str) {
        assert_eq!(
            send_signed(&self.client, &self.server.base, &self.settings, id, body),
            200
        );
    }

    fn run(&self) {
        let r = self
            .client
            .post(format!("{}/events/run?limit=100", self.server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
    }

    /// The pull workers claim what waits for them and fail each with `error`.
    fn fail_pulled(&self, error: &str) -> usize {
        let claims: Value = self
            .client
            .post(format!("{}/subscriptions/workers/claim", self.server.base))
            .bearer_auth(PULL_TOKEN)
            .json(&json!({"max": 100, "wait_ms": 0}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let results: Vec<Value> = claims["claims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| json!({"token": c["token"], "outcome": "fail", "error": error}))
            .collect();
        let n = results.len();
        let r = self
            .client
            .post(format!("{}/subscriptions/workers/ack", self.server.base))
            .bearer_auth(PULL_TOKEN)
            .json(&json!({ "results": results }))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        n
    }

    fn state(&self, event_id: &str, name: &str) -> String {
        let event: Value = self
            .client
            .get(format!("{}/events/shop/{event_id}", self.server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        event["subscriptions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["status"].as_str().unwrap().to_string())
            .unwrap_or_default()
    }
}

async fn state_of(base: &str, event_id: &str, name: &str) -> String {
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

fn customer(i: usize) -> String {
    format!(r#"{{"type":"{LONG_TYPE}","data":{{"customer_id":"c-{i}"}}}}"#)
}

const BAD_ORDER: &str = r#"{"type":"order.completed","data":{"customer_id":"c-9","points":5}}"#;

/// A Stripe-like id, 28 characters.
fn stripe_id(i: usize) -> String {
    format!("evt_1NqQ3bKZ0aB9cD8eF7gH6iJ{i}")
}

/// At 1280 px, failures with 60-character errors and 40-character types: each event id and
/// type is whole (not cut), the error takes a bounded column, cut short, the whole text on
/// hover (its title). Seen failing before the change: the types were cut (14vw) and the errors
/// wrapped over several lines, widening their column.
#[test]
fn dashboard_failed_list_keeps_ids_and_types_whole_beside_long_errors_at_1280() {
    if !browser_found() {
        return;
    }
    let ops = Ops::start();
    for i in 0..3 {
        ops.deliver(&stripe_id(i), &customer(i));
    }
    ops.run();
    assert_eq!(ops.fail_pulled(LONG_ERROR), 3);
    let base = ops.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("failed-long-errors", 1280, |c| async move {
        c.goto(&format!("{base}/ui/#events?status=failed")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 3;", "3 failed rows").await;
        screenshot(&c, "events-failed-long-errors-1280").await;
        let cut = js(&c, "return [...document.querySelectorAll('#events-body a.event-id, #events-body .type')].filter(e => e.scrollWidth > e.clientWidth).map(e => e.textContent);").await;
        assert_eq!(cut, json!([]), "ids or types cut at 1280 px");
        // The error: short, in a bounded column, whole on hover.
        let err = js(&c, "const e = document.querySelector('#events-body .error-text'); const td = e.closest('td'); return [e.title, td.getBoundingClientRect().width, e.getBoundingClientRect().height];").await;
        assert!(err[0].as_str().unwrap().contains(LONG_ERROR), "{err}");
        assert!(err[1].as_f64().unwrap() <= 320.0, "error column {err}");
        assert!(err[2].as_f64().unwrap() <= 50.0, "error over more than two lines {err}");
        assert_eq!(js(&c, "return document.documentElement.scrollWidth <= window.innerWidth;").await, true, "the list scrolls sideways");
        }).await;
    });
}

/// The list filtered by a subscription (`#events?subscription=…`), reached from a count in the
/// subscriptions view; its bulk retry retries that subscription's failures only, saying the
/// count and the filter first; Recover in the subscriptions view. Seen failing before the
/// change: the counts were not links and there was no subscription filter.
#[test]
fn dashboard_filters_by_subscription_retries_and_recovers_it() {
    if !browser_found() {
        return;
    }
    let ops = Ops::start();
    ops.deliver("evt_c1", &customer(1));
    ops.deliver("evt_c2", &customer(2));
    ops.deliver("evt_bad", BAD_ORDER);
    ops.run();
    assert_eq!(ops.fail_pulled(LONG_ERROR), 2);
    assert_eq!(ops.state("evt_bad", "points"), "failed");
    let base = ops.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("subscription-filter", 1280, |c| async move {
        c.goto(&format!("{base}/ui/#subscriptions")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#subscriptions-body tr').length === 3;", "three subscriptions").await;
        let href = js(&c, "return document.querySelector('#subscriptions-body tr[data-name=\"workers\"] td[data-label=\"Failed\"] a').getAttribute('href');").await;
        assert_eq!(href, "#events?status=failed&subscription=workers");
        click(&c, "#subscriptions-body tr[data-name='workers'] td[data-label='Failed'] a").await;
        wait_until(&c, "return document.getElementById('f-subscription').value === 'workers' && document.querySelectorAll('#events-body tr').length === 2;", "the failures of workers").await;
        screenshot(&c, "events-subscription-filter-1280").await;
        // Each row is that subscription's state, and its Retry retries that state alone.
        let label = js(&c, "return document.querySelector('#events-body tr[data-event=\"shop/evt_c1\"] button:not(.copy)').getAttribute('aria-label');").await;
        assert_eq!(label, "Retry shop/evt_c1 in workers");
        click(&c, "#bulk-retry").await;
        wait_until(&c, "return document.getElementById('confirm').open;", "the bulk retry confirmation").await;
        let text = js(&c, "return document.getElementById('confirm-title').textContent + ' ' + document.getElementById('confirm-text').textContent;").await;
        let text = text.as_str().unwrap();
        assert!(text.contains("Retry 2 failed") && text.contains("subscription workers"), "{text}");
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return document.getElementById('list-status').textContent.startsWith('Retried 2');", "the retry said").await;
        assert_eq!(state_of(&base, "evt_c1", "workers").await, "pending");
        assert_eq!(state_of(&base, "evt_bad", "points").await, "failed", "another subscription's failure is left");

        // Recover in the subscriptions view.
        click(&c, "nav a[href='#subscriptions']").await;
        wait_until(&c, "return !!document.querySelector('#subscriptions-body tr[data-name=\"points\"] button[aria-label=\"Recover points\"]');", "Recover points").await;
        click(&c, "#subscriptions-body tr[data-name='points'] button[aria-label='Recover points']").await;
        wait_until(&c, "return document.getElementById('confirm').open && document.getElementById('confirm-title').textContent.startsWith('Recover points');", "the recover confirmation").await;
        click(&c, "#confirm[open] #confirm-ok").await;
        wait_until(&c, "return document.getElementById('subscriptions-status').textContent.includes('points: retried 1');", "recovered").await;
        assert_eq!(state_of(&base, "evt_bad", "points").await, "pending");
        }).await;
    });
}

/// The overview counts events, not subscription states (three subscriptions took these four
/// events: seven completed states), shows the deliveries refused in the last hour and the
/// subscriptions paused or probing, each with a link. Seen failing before the change: it said
/// 7 completed.
#[test]
fn dashboard_overview_counts_events_refusals_and_paused_subscriptions() {
    if !browser_found() {
        return;
    }
    let ops = Ops::start();
    for i in 0..3 {
        ops.deliver(
            &format!("evt_ok{i}"),
            &crate::helpers::order_body(&format!("o-{i}"), "c-1", 2),
        );
    }
    ops.deliver("evt_bad", BAD_ORDER);
    ops.run();
    let refused = ops
        .client
        .post(format!("{}/webhooks/shop", ops.server.base))
        .header("webhook-id", "evt_forged")
        .header("webhook-timestamp", "1")
        .header("webhook-signature", "v1,Zm9yZ2Vk")
        .body("{}")
        .send()
        .unwrap();
    assert!(refused.status().is_client_error());
    let paused = ops
        .client
        .post(format!("{}/subscriptions/workers/pause", ops.server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap();
    assert_eq!(paused.status(), 200);
    let base = ops.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("overview-events", 1280, |c| async move {
        c.goto(&format!("{base}/ui/#overview")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "const n = document.querySelector('.count[data-status=\"failed\"]'); return !!n && n.textContent === '1';", "the failed count").await;
        assert_eq!(js(&c, "return document.querySelector('.count[data-status=\"completed\"]').textContent;").await, "3");
        wait_until(&c, "const r = document.getElementById('overview-refused'); return !!r && r.textContent.includes('1 delivery refused');", "the refusals of the last hour").await;
        assert_eq!(js(&c, "return document.querySelector('#overview-refused a').getAttribute('href');").await, "#rejected");
        wait_until(&c, "const s = document.getElementById('overview-subscriptions'); return !!s && s.textContent.includes('workers') && s.textContent.includes('paused');", "the paused subscription").await;
        assert_eq!(js(&c, "return document.querySelector('#overview-subscriptions a').getAttribute('href');").await, "#subscriptions");
        screenshot(&c, "overview-subscriptions-1280").await;
        }).await;
    });
}

/// The event page's attempts: per attempt its node (worker), its duration, and for an `http`
/// subscription the endpoint's status code and the start of its body (what the history keeps
/// of the answer, in the attempt's error). Seen failing before the change (no duration).
#[test]
fn dashboard_attempts_show_node_duration_and_the_endpoints_answer() {
    if !browser_found() {
        return;
    }
    let receiver = crate::receiver::Receiver::start(Duration::from_millis(0), 503);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let subs = format!(
        "\n[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\nurl = \"{}\"\n\
         timeout_ms = 1500\nmax_attempts = 1\n",
        receiver.url
    );
    let (config, settings) = write_config(dir.path(), port, &subs, "workers = 1");
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = server.base.clone();
    assert_eq!(send_signed(&client, &base, &settings, "evt_503", "{}"), 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let event: Value = client
            .get(format!("{base}/events/shop/evt_503"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if event["status"] == "failed" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not failed: {event}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver
            .run("attempts", 1280, |c| async move {
                c.goto(&format!("{base}/ui/#event/shop/evt_503"))
                    .await
                    .unwrap();
                sign_in(&c, ADMIN_TOKEN).await;
                wait_until(
                    &c,
                    "return document.querySelectorAll('.timeline li').length === 1;",
                    "one attempt",
                )
                .await;
                screenshot(&c, "event-attempts-1280").await;
                let node = js(
                    &c,
                    "return document.querySelector('.timeline .attempt-node').textContent;",
                )
                .await;
                assert!(node.as_str().unwrap().contains('-'), "{node}");
                let took = js(
                    &c,
                    "return document.querySelector('.timeline .attempt-duration').textContent;",
                )
                .await;
                assert!(
                    took.as_str().unwrap().ends_with(" ms")
                        || took.as_str().unwrap().ends_with(" s"),
                    "{took}"
                );
                assert_eq!(
                    js(
                        &c,
                        "return document.querySelector('.timeline .answer-status').textContent;"
                    )
                    .await,
                    "503"
                );
                assert_eq!(
                    js(
                        &c,
                        "return document.querySelector('.timeline .answer-body').textContent;"
                    )
                    .await,
                    "{}"
                );
            })
            .await;
    });
}

/// The Rejected view at 1280 px: a sender's address is never broken over lines (an IPv6 peer,
/// the longest kind, put in the cell as the server would write it), and table times keep their
/// milliseconds, in figures of one width so that they align. Seen failing before the change
/// (the address broke; times had no decimals).
#[test]
fn dashboard_rejected_senders_stay_whole_and_times_keep_milliseconds() {
    if !browser_found() {
        return;
    }
    let ops = Ops::start();
    ops.deliver("evt_ok", "{}");
    for i in 0..2 {
        let refused = ops
            .client
            .post(format!("{}/webhooks/shop", ops.server.base))
            .header("webhook-id", format!("evt_forged{i}"))
            .header("webhook-timestamp", "1")
            .header("webhook-signature", "v1,Zm9yZ2Vk")
            .body("{}")
            .send()
            .unwrap();
        assert!(refused.status().is_client_error());
    }
    let base = ops.server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver.run("rejected-peers", 1280, |c| async move {
        c.goto(&format!("{base}/ui/#rejected")).await.unwrap();
        sign_in(&c, ADMIN_TOKEN).await;
        wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 2;", "2 refusals").await;
        js(&c, "document.querySelectorAll('#rejected-body .peer').forEach(p => { p.textContent = '2001:db8:85a3:1f2e:9c0d:8a2e:370:7334'; });").await;
        let lines = "const lines = (el) => { const r = document.createRange(); r.selectNodeContents(el); return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; };";
        let broken = js(&c, &format!("{lines} return [...document.querySelectorAll('#rejected-body .peer')].filter(p => lines(p) !== 1).length;")).await;
        assert_eq!(broken, 0, "a sender's address broke over lines");
        screenshot(&c, "rejected-peers-1280").await;
        let times = js(&c, "return [...document.querySelectorAll('#rejected-body time')].map(t => [t.textContent, getComputedStyle(t).fontVariantNumeric]);").await;
        for t in times.as_array().unwrap() {
            assert!(regex_like_millis(t[0].as_str().unwrap()), "{t}");
            assert!(t[1].as_str().unwrap().contains("tabular-nums"), "{t}");
        }
        c.goto(&format!("{base}/ui/#events?status=any")).await.unwrap();
        wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 1;", "the event").await;
        let time = js(&c, "return document.querySelector('#events-body time').textContent;").await;
        assert!(regex_like_millis(time.as_str().unwrap()), "{time}");
        }).await;
    });
}

/// `…:SS.mmm…`: seconds with three decimals.
fn regex_like_millis(text: &str) -> bool {
    text.as_bytes().windows(6).any(|w| {
        w[0].is_ascii_digit()
            && w[1].is_ascii_digit()
            && w[2] == b'.'
            && w[3..].iter().all(u8::is_ascii_digit)
    })
}
