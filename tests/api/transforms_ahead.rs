//! A forwarder shapes a claimed batch ahead of its calls (`forward::ahead`): the batch's runs
//! are in the transform pool while the loop goes on. A forwarder stopped then gives the batch
//! back untried, as it does the events queued ahead: none left claimed to its lease, none
//! completed without its call, and the node started again delivers each event once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::receiver::Receiver;

/// Slow enough (a few ms a run, far within the budget) that a batch of 64 is in the pool for
/// a good part of a second: the forwarder is stopped while one is.
const SLOW: &str = r#"(last(range(20000)) | .) as $n | {id, n: $n}"#;

fn config(url: &str) -> String {
    format!(
        r#"
[[subscriptions]]
name = "billing"
kind = "http"
sources = ["shop"]
url = "{url}"
signing_secret = "{SW_SECRET}"
timeout_ms = 3000
concurrency = 64
transform = '''{SLOW}'''
"#
    )
}

fn options() -> BuildOptions {
    BuildOptions {
        idle_poll: Some(Duration::from_millis(50)),
        ..BuildOptions::default()
    }
}

/// `billing`'s events in `status` (and `more`), read from the database file.
fn states(dir: &std::path::Path, status: &str, more: &str) -> usize {
    let conn = rusqlite::Connection::open(dir.join("inbox.db")).unwrap();
    let sql = format!(
        "SELECT count(*) FROM event_state s JOIN subscriptions u ON u.id = s.sub \
         WHERE u.name = 'billing' AND s.status = '{status}' {more}"
    );
    let n: i64 = conn.query_row(&sql, [], |r| r.get(0)).unwrap();
    n as usize
}

/// The calls `receiver` got, by event id.
fn calls_by_event(receiver: &Receiver) -> HashMap<String, Vec<Value>> {
    let mut by_event: HashMap<String, Vec<Value>> = HashMap::new();
    for call in receiver.calls() {
        let id = call.header("webhook-inbox-event-id").unwrap().to_string();
        by_event
            .entry(id)
            .or_default()
            .push(serde_json::from_slice(&call.body).unwrap());
    }
    by_event
}

/// Seen failing with the batches being shaped left out of `Ahead::untried`: their events
/// stayed claimed after the stop, left to their leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarder_stopped_while_a_batch_is_shaped_gives_it_back_untried() {
    const EVENTS: usize = 300;
    let receiver = Receiver::start(Duration::ZERO, 200);
    let mut config_text = String::new();
    let app = spawn_app_with(
        |c: &mut String| {
            *c = c.replace("workers = 0", "workers = 1");
            let paused = c.clone() + &config(&receiver.url);
            config_text = paused.clone();
            *c = paused;
        },
        options(),
    )
    .await;
    // Stored paused, then resumed: the first claims take whole batches.
    let paused = app.admin_post("/subscriptions/billing/pause", None).await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    for i in 0..EVENTS {
        let body = json!({"id": format!("e-{i}")}).to_string();
        let stored = app.deliver("shop", &format!("e-{i}"), &body).await;
        assert_eq!(stored.status, 200);
    }
    let resumed = app.admin_post("/subscriptions/billing/resume", None).await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.calls().len() < 10 {
        assert!(
            Instant::now() < deadline,
            "no calls: {:?}",
            receiver.calls()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let dir = app.stop().await;
    let sent = calls_by_event(&receiver);
    assert_eq!(states(dir.path(), "claimed", ""), 0, "left to their leases");
    let completed = states(dir.path(), "completed", "");
    assert!(
        completed < EVENTS,
        "the stop came after the last batch: nothing was held ahead ({completed} completed)"
    );
    assert_eq!(
        completed,
        sent.len(),
        "each event completed has its call, and only those"
    );
    let untried = states(dir.path(), "pending", "AND s.attempts = 0");
    assert_eq!(
        untried + completed,
        EVENTS,
        "what was not sent went back untried"
    );

    // Started again (forwarding): the rest delivered, each event once, shaped.
    let app = spawn_in(dir, &config_text, options()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while states(app.dir.path(), "completed", "") < EVENTS {
        assert!(
            Instant::now() < deadline,
            "{} of {EVENTS} completed",
            states(app.dir.path(), "completed", "")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = calls_by_event(&receiver);
    assert_eq!(sent.len(), EVENTS);
    for (id, bodies) in sent {
        assert_eq!(
            bodies,
            [json!({"id": id, "n": 19999})],
            "{id}: once, shaped"
        );
    }
    app.stop().await;
}
