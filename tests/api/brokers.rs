//! What the broker kinds' tests share (`nats`, `amqp`): a subscription `bus` taking `shop`'s
//! orders, waiting until it has published them, a broker of a test's own (to stop, kill and
//! start again without breaking the tests beside it), and signed deliveries to the real binary.
//! The example consumers' runs: example_consumers.rs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::process::exit_within;

/// The app with `table` (a `[[subscriptions]]` table named `bus`) and one worker.
pub async fn app_with_table(table: String) -> TestApp {
    spawn_app_with(
        move |c: &mut String| {
            *c = c.replace("workers = 0", "workers = 1");
            c.push_str(&table);
        },
        BuildOptions {
            idle_poll: Some(Duration::from_millis(50)),
            ..BuildOptions::default()
        },
    )
    .await
}

/// Wait (bounded) until `bus` has nothing pending or claimed and `want` completed.
pub async fn until_published(app: &TestApp, want: i64, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let view = app.get("/subscriptions/bus").await.body;
        let c = &view["counts"];
        if c["completed"] == want && c["pending"] == 0 && c["claimed"] == 0 {
            return view;
        }
        assert!(Instant::now() < deadline, "not published: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait (bounded) until `bus`'s event `id` has a failed attempt whose error holds `text`;
/// returns its state.
pub async fn until_failed_with(app: &TestApp, id: &str, text: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let event = app.event("shop", id).await;
        let bus = event["subscriptions"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == "bus").cloned());
        if let Some(bus) = bus.filter(|b| b["last_error"].as_str().unwrap_or("").contains(text)) {
            return bus;
        }
        assert!(
            Instant::now() < deadline,
            "no attempt failed with {text:?}: {event}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` orders from `shop`, each delivered twice (the second a duplicate); their bodies by id.
pub async fn send_orders(app: &TestApp, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut sent = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        let body = order_body(&format!("o-{id}"), "c1", 1);
        assert_eq!(
            app.deliver("shop", &id, &body).await.body["status"],
            "queued"
        );
        assert_eq!(
            app.deliver("shop", &id, &body).await.body["status"],
            "duplicate"
        );
        sent.push((id, body));
    }
    sent
}

/// The `ordered_by` tests' orders: 30 of `shop`, keyed by customer (`c0` to `c2`, in turns),
/// event ids `k-00` to `k-29` in the order they are stored.
pub const ORDERED_BY: &str = "ordered_by = \"/data/customer_id\"\nconcurrency = 16";

pub async fn send_keyed_orders(app: &TestApp) {
    for i in 0..30 {
        let body = order_body(&format!("o-{i}"), &format!("c{}", i % 3), 1);
        let id = format!("k-{i:02}");
        assert_eq!(
            app.deliver("shop", &id, &body).await.body["status"],
            "queued"
        );
    }
}

/// The messages (body, `webhook-inbox-event-id`) of each customer of [`send_keyed_orders`]
/// came in the order their events were stored.
pub fn assert_in_key_order(messages: &[(String, String)]) {
    for customer in ["c0", "c1", "c2"] {
        let ids: Vec<&String> = messages
            .iter()
            .filter(|(body, _)| body.contains(&format!("\"{customer}\"")))
            .map(|(_, id)| id)
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "{customer}'s events out of order");
    }
}

/// A provider's W3C `traceparent`, which the traceparent tests send with one order: it rides on
/// the message (SPEC section 15), passed on unchanged with tracing off.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// One order of `shop` with [`TRACEPARENT`], waited for (bounded) until `bus` published it.
pub async fn send_traced(app: &TestApp) {
    let body = order_body("o-traced", "c1", 1);
    let mut headers = sign_for(&app.settings, "shop", "traced", body.as_bytes());
    headers.push(("traceparent".into(), TRACEPARENT.into()));
    let reply = app.post_webhook("shop", &headers, body.as_bytes()).await;
    assert_eq!(reply.body["status"], "queued", "{}", reply.body);
    until_published(app, 1, Duration::from_secs(20)).await;
}

/// One signed delivery of `shop` to the real binary: its status and answer (0 when the
/// connection failed, which a killed server gives).
pub fn send(
    client: &reqwest::blocking::Client,
    base: &str,
    settings: &webhook_inbox::config::Settings,
    id: &str,
) -> (u16, Value) {
    let body = order_body(&format!("o-{id}"), "c1", 1);
    let mut req = client
        .post(format!("{base}/webhooks/shop"))
        .body(body.clone());
    for (k, v) in sign_for(settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    match req.send() {
        Ok(r) => (r.status().as_u16(), r.json().unwrap_or_default()),
        Err(_) => (0, Value::Null),
    }
}

/// Deliver each of `ids` once to the real binary at `base`, on a thread of its own (the server
/// is killed meanwhile): the ids it answered 200 for, acknowledged.
pub fn send_all_in_background(
    base: &str,
    ids: &[String],
    settings: &webhook_inbox::config::Settings,
) -> std::thread::JoinHandle<Vec<String>> {
    let (base, ids, settings) = (base.to_string(), ids.to_vec(), settings.clone());
    std::thread::spawn(move || {
        let client = reqwest::blocking::Client::new();
        ids.iter()
            .filter(|id| send(&client, &base, &settings, id).0 == 200)
            .cloned()
            .collect()
    })
}

/// Deliver each of `ids` again to the restarted binary at `base`: each is taken, and each one
/// `acked` before the kills is a duplicate (acknowledged, so never lost).
pub fn resend_after_kills(
    base: &str,
    ids: &[String],
    acked: &HashSet<String>,
    settings: &webhook_inbox::config::Settings,
) {
    let client = reqwest::blocking::Client::new();
    for id in ids {
        let (status, answer) = send(&client, base, settings, id);
        assert_eq!(status, 200, "{answer}");
        if acked.contains(id) {
            assert_eq!(
                answer["status"], "duplicate",
                "{id} was acknowledged, then lost"
            );
        }
    }
}

/// Wait (bounded) until the real binary at `base` shows `want` of `bus`'s events completed
/// (and, with `settled`, none pending or claimed).
pub fn wait_completed(
    base: &str,
    want: usize,
    settled: bool,
    within: Duration,
    logs: impl Fn() -> String,
) {
    let client = reqwest::blocking::Client::new();
    let deadline = Instant::now() + within;
    loop {
        let view: Value = client
            .get(format!("{base}/subscriptions/bus"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let c = &view["counts"];
        if c["completed"] == want as i64 && (!settled || (c["pending"] == 0 && c["claimed"] == 0)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not published: {view}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// 10 orders published; the broker stopped (SIGTERM); 10 more stored and acknowledged while it
/// is away, none of them done; the broker started again: all 20 are published (each wait
/// bounded).
pub async fn publish_across_a_broker_stop(app: &TestApp, broker: &PrivateBroker) {
    send_orders(app, "a", 10).await;
    until_published(app, 10, Duration::from_secs(30)).await;
    tokio::task::block_in_place(|| broker.ctl("stop"));
    send_orders(app, "b", 10).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = app.get("/subscriptions/bus").await.body;
    assert_eq!(view["counts"]["completed"], 10, "{view}");
    tokio::task::block_in_place(|| broker.ctl("start"));
    until_published(app, 20, Duration::from_secs(60)).await;
}

/// Which `scripts/with-*` runs a private broker, and the names it hands over.
pub struct BrokerScript {
    pub script: &'static str,
    pub url_var: &'static str,
    pub ctl_var: &'static str,
    /// The variable that passes server options, when the script takes them.
    pub options_var: Option<&'static str>,
}

pub const NATS: BrokerScript = BrokerScript {
    script: "with-nats",
    url_var: "TEST_NATS_URL",
    ctl_var: "TEST_NATS_CTL",
    options_var: Some("WITH_NATS_OPTIONS"),
};

pub const RABBITMQ: BrokerScript = BrokerScript {
    script: "with-rabbitmq",
    url_var: "TEST_AMQP_URL",
    ctl_var: "TEST_AMQP_CTL",
    options_var: None,
};

/// A RabbitMQ node with a TLS listener too (`WITH_RABBITMQ_TLS`: its certificate and key
/// files); its URL is the `amqps://` one.
pub const RABBITMQ_TLS: BrokerScript = BrokerScript {
    script: "with-rabbitmq",
    url_var: "TEST_AMQPS_URL",
    ctl_var: "TEST_AMQP_CTL",
    options_var: Some("WITH_RABBITMQ_TLS"),
};

/// A throwaway broker for one test: `scripts/with-…` around a command that writes its URL and
/// control script into a file and then waits. Dropping it sends SIGTERM to the script, which
/// stops its command and the broker.
pub struct PrivateBroker {
    script: Option<Child>,
    pub url: String,
    ctl: PathBuf,
    log: PathBuf,
    name: &'static str,
}

impl PrivateBroker {
    pub fn start(dir: &Path, which: &BrokerScript) -> PrivateBroker {
        PrivateBroker::start_with(dir, which, "")
    }

    /// A broker started with server `options` (its script's options variable).
    pub fn start_with(dir: &Path, which: &BrokerScript, options: &str) -> PrivateBroker {
        let handoff = dir.join("broker");
        let log = dir.join(format!("{}.log", which.script));
        let mut command = Command::new("bash");
        if let Some(var) = which.options_var {
            command.env(var, options);
        }
        let script = command
            .arg(format!(
                "{}/scripts/{}",
                env!("CARGO_MANIFEST_DIR"),
                which.script
            ))
            .args(["sh", "-c"])
            // Bounded too: the broker goes away after ten minutes whatever happens.
            .arg(format!(
                r#"printf '%s\n%s\n' "${}" "${}" >"$1.tmp" && mv "$1.tmp" "$1" && exec sleep 600"#,
                which.url_var, which.ctl_var
            ))
            .arg("sh")
            .arg(&handoff)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("run scripts/{}: {e}", which.script));
        let mut broker = PrivateBroker {
            script: Some(script),
            url: String::new(),
            ctl: PathBuf::new(),
            log,
            name: which.script,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&handoff) {
                break text;
            }
            if let Some(status) = broker.script.as_mut().unwrap().try_wait().unwrap() {
                panic!("{} exited ({status}): {}", which.script, broker.logs());
            }
            assert!(Instant::now() < deadline, "no broker: {}", broker.logs());
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut lines = text.lines();
        broker.url = lines.next().unwrap().to_string();
        broker.ctl = PathBuf::from(lines.next().unwrap());
        broker
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The broker's temporary folder (its control script's), where it keeps its pid files.
    pub fn folder(&self) -> &Path {
        self.ctl.parent().unwrap()
    }

    /// `stop` (SIGTERM), `kill` or `start` (the same port and store); the script bounds each.
    pub fn ctl(&self, action: &str) {
        let status = Command::new(&self.ctl).arg(action).status().unwrap();
        assert!(
            status.success(),
            "{} ctl {action}: {}",
            self.name,
            self.logs()
        );
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        if let Some(mut script) = self.script.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(script.id().to_string())
                .status();
            let what = format!("{} on SIGTERM", self.name);
            exit_within(&mut script, Duration::from_secs(60), &what);
        }
    }
}
