//! An `amqp` subscription through failures of its broker and of the node: RabbitMQ stopped and
//! started again mid-run, then SIGKILLed while publishes are in flight; and the real binary
//! SIGKILLed mid-publish, several times, under load. Every completed delivery ends in the
//! queue. RabbitMQ keeps no duplicate window, so an event published again (its confirm lost
//! with the node or the broker) is a second copy: each copy carries the event's `message_id`,
//! and the copies are counted and printed.
//!
//! Stopping the shared node would break the `amqp` tests running beside these, so the broker
//! tests start a node of their own through `scripts/with-rabbitmq`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use webhook_inbox::forward::call::webhook_id;

use crate::amqp::{Client, app_with_bus, broker, bus_table, client, copies, header, names};
use crate::brokers::{
    PrivateBroker, RABBITMQ, publish_across_a_broker_stop, resend_after_kills,
    send_all_in_background, send_orders, until_published, wait_completed,
};
use crate::process::{ServerProcess, free_port, write_config};

/// Every event of `ids` is in `messages`, and every copy of one carries its `message_id`;
/// returns how many copies are extra.
fn each_event_in(messages: &[lapin::message::Delivery], ids: &[String]) -> usize {
    for m in messages {
        let id = header(m, "webhook-inbox-event-id");
        assert_eq!(
            crate::amqp::message_id(m),
            webhook_id("shop", &id),
            "a copy of {id} under another message_id"
        );
    }
    let by_id = copies(messages);
    for id in ids {
        assert!(
            by_id.contains_key(&webhook_id("shop", id)),
            "{id} was completed but is not in the queue"
        );
    }
    assert_eq!(by_id.len(), ids.len(), "a message of no event");
    messages.len() - ids.len()
}

async fn declared(url: &str, n: &crate::amqp::Names) -> Client {
    let rabbit = client(url).await;
    rabbit.exchange(&n.exchange).await;
    rabbit.queue(&n.queue, &n.exchange, &n.prefix).await;
    rabbit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_broker_stopped_killed_and_started_loses_no_completed_event() {
    if broker().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let private = tokio::task::block_in_place(|| PrivateBroker::start(dir.path(), &RABBITMQ));
    let n = names();
    drop(declared(&private.url, &n).await);
    let app = app_with_bus(&private.url, &n, "concurrency = 16").await;
    publish_across_a_broker_stop(&app, &private).await;
    // Killed while a backlog is being published: what was confirmed is on its disk.
    send_orders(&app, "c", 200).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = app.get("/subscriptions/bus").await.body;
        if view["counts"]["completed"].as_i64().unwrap_or(0) >= 60 {
            break;
        }
        assert!(Instant::now() < deadline, "no progress: {view}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::task::block_in_place(|| {
        private.ctl("kill");
        private.ctl("start");
    });
    until_published(&app, 220, Duration::from_secs(120)).await;
    let messages = client(&private.url).await.take_all(&n.queue).await;
    let ids: Vec<String> = (0..10)
        .flat_map(|i| [format!("a-{i}"), format!("b-{i}")])
        .chain((0..200).map(|i| format!("c-{i}")))
        .collect();
    let extra = each_event_in(&messages, &ids);
    eprintln!("amqp broker stopped and killed: {extra} duplicate(s) among 220 events");
    app.stop().await;
}

/// At-most-once: a publish whose confirm never comes (the broker frozen with SIGSTOP after the
/// connection was made) may have been taken, so the event is abandoned, not published again;
/// once the broker runs again the next event goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_at_most_once_abandons_a_publish_without_its_confirm() {
    if broker().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let private = tokio::task::block_in_place(|| PrivateBroker::start(dir.path(), &RABBITMQ));
    let n = names();
    drop(declared(&private.url, &n).await);
    let app = app_with_bus(&private.url, &n, "mode = \"at-most-once\"").await;
    send_orders(&app, "a", 1).await;
    until_published(&app, 1, Duration::from_secs(30)).await;
    let pid = std::fs::read_to_string(private.folder().join("node.pid")).unwrap();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, pid.trim()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {name}");
    };
    signal("-STOP");
    // The signal is asynchronous: publish only once the broker is seen stopped (state `T`).
    let frozen = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap();
        let state = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        if state == "T" {
            break;
        }
        assert!(Instant::now() < frozen, "the broker did not stop: {stat}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    send_orders(&app, "b", 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let state = loop {
        let event = app.event("shop", "b-0").await;
        let bus = event["subscriptions"][0].clone();
        if bus["abandoned"] == true {
            break bus;
        }
        if Instant::now() > deadline {
            signal("-CONT");
            panic!("not abandoned: {event}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    signal("-CONT");
    assert_eq!(state["status"], "failed", "{state}");
    let error = state["last_error"].as_str().unwrap();
    assert!(error.contains("no confirm from the broker"), "{error}");
    send_orders(&app, "c", 1).await;
    until_published(&app, 2, Duration::from_secs(30)).await;
    let messages = client(&private.url).await.take_all(&n.queue).await;
    let in_queue = copies(&messages);
    for id in ["a-0", "c-0"] {
        assert_eq!(in_queue.get(&webhook_id("shop", id)), Some(&1), "{id}");
    }
    // The abandoned one was on its way: the broker may have taken it, once.
    assert!(
        in_queue
            .get(&webhook_id("shop", "b-0"))
            .is_none_or(|c| *c == 1)
    );
    app.stop().await;
}

const EVENTS: usize = 300;
const KILLS: usize = 3;

#[test]
fn amqp_sigkill_mid_publish_loses_nothing_and_counts_the_copies() {
    let Some(url) = broker() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let n = names();
    let rabbit = rt.block_on(declared(&url, &n));
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let table = bus_table(&url, &n.exchange, &n.prefix, "concurrency = 16")
        + "\n[downstream]\ntimeout_ms = 2000\n";
    let (config, settings) =
        write_config(dir.path(), port, &table, "workers = 2\nlease_seconds = 12");
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("k-{i}")).collect();
    let mut acked = HashSet::new();
    let mut in_queue = Vec::new();
    for kill in 0..KILLS {
        let mut server = ServerProcess::start(dir.path(), &config, port, &format!("{kill}.log"));
        let sender = send_all_in_background(&server.base, &ids, &settings);
        // Killed while publishes are in flight: once the queue holds a share of the events.
        let goal = (kill + 1) * EVENTS / (KILLS + 2);
        let deadline = Instant::now() + Duration::from_secs(90);
        while copies(&in_queue).len() < goal {
            assert!(Instant::now() < deadline, "no progress: {}", server.logs());
            in_queue.extend(rt.block_on(rabbit.take_all(&n.queue)));
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
    in_queue.extend(rt.block_on(rabbit.take_all(&n.queue)));
    let extra = each_event_in(&in_queue, &ids);
    eprintln!("amqp node SIGKILLed {KILLS} times: {extra} duplicate(s) among {EVENTS} events");
}
