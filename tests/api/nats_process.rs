//! A `nats` subscription through failures of its broker and of the node: the broker stopped
//! and started again mid-run, and the real binary SIGKILLed mid-publish. Every acknowledged
//! delivery ends in the stream, and the stream holds each event once (a re-publish after the
//! kill carries the same `Nats-Msg-Id`, which the stream's duplicate window drops).
//!
//! Stopping the shared broker would break the `nats` tests running beside these, so the
//! restart test starts a broker of its own through `scripts/with-nats`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use webhook_inbox::forward::call::webhook_id;

use crate::brokers::{
    NATS, PrivateBroker, publish_across_a_broker_stop, resend_after_kills, send,
    send_all_in_background, send_orders, until_published, wait_completed,
};
use crate::nats::{
    app_with_bus, broker, bus_table, distinct_ids, jetstream_of, make_stream, stored, unique,
};
use crate::process::{ServerProcess, free_port, write_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_broker_stopped_and_started_mid_run_gets_every_event_once() {
    if broker().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let private = tokio::task::block_in_place(|| PrivateBroker::start(dir.path(), &NATS));
    let (name, prefix) = (unique("S"), unique("p"));
    make_stream(&jetstream_of(&private.url).await, &name, &prefix).await;
    let app = app_with_bus(&private.url, &prefix, &format!("stream = \"{name}\"")).await;
    publish_across_a_broker_stop(&app, &private).await;
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
            tokio::task::block_in_place(|| PrivateBroker::start_with(dir.path(), &NATS, options));
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
        let sender = send_all_in_background(&server.base, &ids, &settings);
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
    resend_after_kills(&server.base, &ids, &acked, &settings);
    wait_completed(&server.base, EVENTS, true, Duration::from_secs(120), || {
        server.logs()
    });
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
    wait_completed(
        &nodes[0].base,
        EVENTS,
        false,
        Duration::from_secs(90),
        String::new,
    );
    let messages = rt.block_on(stored(&js, &name));
    assert_eq!(messages.len(), EVENTS);
    assert_eq!(distinct_ids(&messages).len(), EVENTS);
}
