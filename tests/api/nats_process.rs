//! A `nats` subscription through failures of its broker and of the node: the broker stopped
//! and started again mid-run, and the real binary SIGKILLed mid-publish. Every acknowledged
//! delivery ends in the stream, and the stream holds each event once (a re-publish after the
//! kill carries the same `Nats-Msg-Id`, which the stream's duplicate window drops).
//!
//! Stopping the shared broker would break the `nats` tests running beside these, so the
//! restart test starts a broker of its own through `scripts/with-nats`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use webhook_inbox::forward::call::webhook_id;

use crate::helpers::*;
use crate::nats::{
    app_with_bus, broker, bus_table, distinct_ids, jetstream_of, make_stream, send_orders, stored,
    unique, until_published,
};
use crate::process::{ServerProcess, exit_within, free_port, write_config};

/// A throwaway broker for one test: `scripts/with-nats` around a command that writes its URL
/// and control script into a file and then waits. Dropping it sends SIGTERM to the script,
/// which stops its command and the broker.
pub(crate) struct PrivateBroker {
    script: Option<Child>,
    pub(crate) url: String,
    ctl: PathBuf,
    log: PathBuf,
}

impl PrivateBroker {
    fn start(dir: &Path) -> PrivateBroker {
        PrivateBroker::start_with(dir, "")
    }

    /// A broker started with server `options` (`WITH_NATS_OPTIONS`).
    pub(crate) fn start_with(dir: &Path, options: &str) -> PrivateBroker {
        let handoff = dir.join("broker");
        let log = dir.join("with-nats.log");
        let script = Command::new("bash")
            .env("WITH_NATS_OPTIONS", options)
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/with-nats"))
            .args(["sh", "-c"])
            // Bounded too: the broker goes away after ten minutes whatever happens.
            .arg(
                r#"printf '%s\n%s\n' "$TEST_NATS_URL" "$TEST_NATS_CTL" >"$1.tmp" \
                   && mv "$1.tmp" "$1" && exec sleep 600"#,
            )
            .arg("sh")
            .arg(&handoff)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("run scripts/with-nats");
        let mut broker = PrivateBroker {
            script: Some(script),
            url: String::new(),
            ctl: PathBuf::new(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&handoff) {
                break text;
            }
            if let Some(status) = broker.script.as_mut().unwrap().try_wait().unwrap() {
                panic!("with-nats exited ({status}): {}", broker.logs());
            }
            assert!(Instant::now() < deadline, "no broker: {}", broker.logs());
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut lines = text.lines();
        broker.url = lines.next().unwrap().to_string();
        broker.ctl = PathBuf::from(lines.next().unwrap());
        broker
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `stop` (SIGTERM), `kill` or `start` (the same port and store); the script bounds each.
    fn ctl(&self, action: &str) {
        let status = Command::new(&self.ctl).arg(action).status().unwrap();
        assert!(status.success(), "nats ctl {action}: {}", self.logs());
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        if let Some(mut script) = self.script.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(script.id().to_string())
                .status();
            exit_within(&mut script, Duration::from_secs(30), "with-nats on SIGTERM");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_broker_stopped_and_started_mid_run_gets_every_event_once() {
    if broker().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let private = tokio::task::block_in_place(|| PrivateBroker::start(dir.path()));
    let (name, prefix) = (unique("S"), unique("p"));
    make_stream(&jetstream_of(&private.url).await, &name, &prefix).await;
    let app = app_with_bus(&private.url, &prefix, &format!("stream = \"{name}\"")).await;
    send_orders(&app, "a", 10).await;
    until_published(&app, 10, Duration::from_secs(30)).await;
    tokio::task::block_in_place(|| private.ctl("stop"));
    // Stored and acknowledged while the broker is away; none is done until it is back.
    send_orders(&app, "b", 10).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = app.get("/subscriptions/bus").await.body;
    assert_eq!(view["counts"]["completed"], 10, "{view}");
    tokio::task::block_in_place(|| private.ctl("start"));
    until_published(&app, 20, Duration::from_secs(60)).await;
    let messages = stored(&jetstream_of(&private.url).await, &name).await;
    assert_eq!(distinct_ids(&messages).len(), 20);
    app.stop().await;
}

/// The URL's credentials reach the broker: a user and password, or a token as the user; wrong
/// ones are a failed attempt naming the connect, retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_credentials_come_from_the_url() {
    if broker().is_none() {
        return;
    }
    for (options, good, bad) in [
        (
            "--user inbox --pass s3cret",
            "inbox:s3cret@",
            "inbox:wrong@",
        ),
        (
            "--auth t0ken-of-the-broker",
            "t0ken-of-the-broker@",
            "other@",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let private =
            tokio::task::block_in_place(|| PrivateBroker::start_with(dir.path(), options));
        let with = |creds: &str| {
            private
                .url
                .replacen("nats://", &format!("nats://{creds}"), 1)
        };
        let (name, prefix) = (unique("S"), unique("p"));
        // The test's own client takes them as options: async-nats ignores a URL's.
        let creds = good.trim_end_matches('@');
        let options = match creds.split_once(':') {
            Some((user, pass)) => {
                async_nats::ConnectOptions::with_user_and_password(user.into(), pass.into())
            }
            None => async_nats::ConnectOptions::with_token(creds.into()),
        };
        let js = async_nats::jetstream::new(options.connect(private.url.as_str()).await.unwrap());
        make_stream(&js, &name, &prefix).await;
        let app = app_with_bus(&with(bad), &prefix, "").await;
        send_orders(&app, "c", 1).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let event = app.event("shop", "c-0").await.to_string();
            if event.contains("could not connect to the broker") {
                assert!(
                    !event.contains("wrong") && !event.contains("other@"),
                    "{event}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "no failed connect: {event}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let changed = crate::registry_routes::patch(
            &app,
            "bus",
            &serde_json::json!({ "url": with(good) }).to_string(),
        )
        .await;
        assert_eq!(changed.status, 200, "{}", changed.body);
        until_published(&app, 1, Duration::from_secs(30)).await;
        assert_eq!(stored(&js, &name).await.len(), 1);
        app.stop().await;
    }
}

const EVENTS: usize = 300;
const KILLS: usize = 2;

/// One signed delivery of `shop`: its status and answer (0 when the connection failed, which a
/// killed server gives).
fn send(
    client: &reqwest::blocking::Client,
    base: &str,
    settings: &webhook_inbox::config::Settings,
    id: &str,
) -> (u16, serde_json::Value) {
    let body = order_body(&format!("o-{id}"), "c1", 1);
    let mut req = client
        .post(format!("{base}/webhooks/shop"))
        .body(body.clone());
    for (k, v) in sign_for(settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    match req.send() {
        Ok(r) => (r.status().as_u16(), r.json().unwrap_or_default()),
        Err(_) => (0, serde_json::Value::Null),
    }
}

#[test]
fn nats_sigkill_mid_publish_loses_nothing_and_the_stream_holds_each_event_once() {
    let Some(url) = broker() else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (name, prefix) = (unique("S"), unique("p"));
    let js = rt.block_on(jetstream_of(&url));
    rt.block_on(make_stream(&js, &name, &prefix));
    let count = || rt.block_on(stored(&js, &name)).len();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let stream = format!("stream = \"{name}\"\nconcurrency = 16");
    let table = bus_table(&url, &prefix, &stream) + "\n[downstream]\ntimeout_ms = 2000\n";
    let (config, settings) =
        write_config(dir.path(), port, &table, "workers = 2\nlease_seconds = 12");
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("k-{i}")).collect();
    let mut acked = HashSet::new();
    for kill in 0..KILLS {
        let mut server = ServerProcess::start(dir.path(), &config, port, &format!("{kill}.log"));
        let sender = {
            let (base, ids, settings) = (server.base.clone(), ids.clone(), settings.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                ids.iter()
                    .filter(|id| send(&client, &base, &settings, id).0 == 200)
                    .cloned()
                    .collect::<Vec<_>>()
            })
        };
        // Killed while publishes are in flight: once the stream holds a share of the events.
        let goal = (kill + 1) * EVENTS / (KILLS + 2);
        let deadline = Instant::now() + Duration::from_secs(60);
        while count() < goal {
            assert!(Instant::now() < deadline, "no progress: {}", server.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
        server.kill();
        acked.extend(sender.join().unwrap());
    }
    let server = ServerProcess::start(dir.path(), &config, port, "last.log");
    let client = reqwest::blocking::Client::new();
    for id in &ids {
        let (status, answer) = send(&client, &server.base, &settings, id);
        assert_eq!(status, 200, "{answer}");
        if acked.contains(id) {
            assert_eq!(
                answer["status"], "duplicate",
                "{id} was acknowledged, then lost"
            );
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let view: serde_json::Value = client
            .get(format!("{}/subscriptions/bus", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let c = &view["counts"];
        if c["completed"] == EVENTS as i64 && c["pending"] == 0 && c["claimed"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not published: {view}\n{}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let messages = rt.block_on(stored(&js, &name));
    assert_eq!(messages.len(), EVENTS, "the stream holds each event once");
    let in_stream = distinct_ids(&messages);
    for id in &ids {
        assert!(
            in_stream.contains(&webhook_id("shop", id)),
            "{id} is not in the stream"
        );
    }
}

const NODES: usize = 2;

/// Two nodes on PostgreSQL publish one `nats` subscription together, beside an in-process
/// one: the workers leave `bus`'s events to the forwarders, and the stream holds each once.
#[test]
fn nats_nodes_on_postgresql_publish_each_event_once() {
    let Some(url) = broker() else { return };
    if !crate::pgdb::available() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (name, prefix) = (unique("S"), unique("p"));
    let js = rt.block_on(jetstream_of(&url));
    rt.block_on(make_stream(&js, &name, &prefix));
    let db = crate::pgdb::PgDatabase::create();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[consumers]\nworkers = 1\n{}\n[[subscriptions]]\nname = \"points\"\n\
         kind = \"loyalty-credit\"\ntypes = [\"order.completed\"]\n",
        bus_table(&url, &prefix, "concurrency = 8")
    );
    let nodes: Vec<ServerProcess> = (0..NODES)
        .map(|i| {
            let port = free_port();
            let config =
                crate::nodes::node_config(dir.path(), &format!("n{i}"), port, &db.url, &extra);
            ServerProcess::start(dir.path(), &config, port, &format!("n{i}.log"))
        })
        .collect();
    let settings = crate::nodes::signing_settings();
    let client = reqwest::blocking::Client::new();
    for i in 0..EVENTS {
        let (status, answer) = send(
            &client,
            &nodes[i % NODES].base,
            &settings,
            &format!("k-{i}"),
        );
        assert_eq!(status, 200, "{answer}");
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let view: serde_json::Value = client
            .get(format!("{}/subscriptions/bus", nodes[0].base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if view["counts"]["completed"] == EVENTS as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "not published: {view}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let messages = rt.block_on(stored(&js, &name));
    assert_eq!(messages.len(), EVENTS);
    assert_eq!(distinct_ids(&messages).len(), EVENTS);
}
