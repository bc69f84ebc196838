//! What the broker kinds' tests share (`nats`, `amqp`): a subscription `bus` taking `shop`'s
//! orders, waiting until it has published them, a broker of a test's own (to stop, kill and
//! start again without breaking the tests beside it), signed deliveries to the real binary, and
//! the example consumers run and killed as a user would run them.

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

/// An example consumer, `examples/{script}` run by `python` with `args` and `--db db` as a user
/// would run it, its stderr appended to `log` (one log across its restarts).
pub fn example_consumer(python: &str, script: &str, args: &[&str], db: &Path, log: &Path) -> Child {
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(script);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(python)
        .arg(&example)
        .args(args)
        .arg("--db")
        .arg(db)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("run examples/{script}: {e}"))
}

/// How many messages an example consumer has recorded (0 before it made its database).
pub fn processed(db: &Path) -> i64 {
    let Ok(conn) = rusqlite::Connection::open(db) else {
        return 0;
    };
    conn.query_row("SELECT count(*) FROM processed_messages", [], |r| r.get(0))
        .unwrap_or(0)
}

/// Run the consumer `start` makes `kills` times, each SIGKILLed once it has recorded a further
/// share of `events` (each run bounded to 60 s): a kill lands while it works, with messages
/// taken and not acked, or committed and not acked.
pub async fn consume_through_kills(
    start: impl Fn() -> Child,
    db: &Path,
    events: i64,
    kills: usize,
    logs: impl Fn() -> String,
) {
    let kills = kills as i64;
    for kill in 0..kills {
        let mut child = start();
        let goal = (kill + 1) * events / (kills + 2);
        let deadline = Instant::now() + Duration::from_secs(60);
        while processed(db) < goal {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the consumer exited ({status}): {}", logs());
            }
            assert!(Instant::now() < deadline, "no progress: {}", logs());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// SIGTERM to an example consumer: it stops within 15 s, and cleanly.
pub fn stop_consumer(child: &mut Child, logs: impl Fn() -> String) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = tokio::task::block_in_place(|| {
        exit_within(child, Duration::from_secs(15), "the consumer on SIGTERM")
    });
    assert!(status.success(), "{status}: {}", logs());
}

/// What an example consumer's database holds after the examples' tests (20 orders of 10 points
/// from the subscription, 4 of them again under a second event id, and `more` orders of 1 point
/// published beside them): each message recorded once, whatever the copies and redeliveries,
/// and each order credited once.
pub fn assert_credited_once(db: &Path, more: i64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    let recorded = count("SELECT count(*) FROM processed_messages");
    assert_eq!(recorded, 24 + more, "messages lost or recorded twice");
    let business = "SELECT count(*) FROM processed_messages WHERE outcome = 'business_duplicate'";
    assert_eq!(count(business), 4);
    assert_eq!(count("SELECT count(*) FROM loyalty_credits"), 20 + more);
    assert_eq!(
        count("SELECT sum(balance) FROM loyalty_balances"),
        200 + more
    );
    let c0 = "SELECT balance FROM loyalty_balances WHERE customer_id = 'c0'";
    assert_eq!(count(c0), 50 + more / 4);
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
