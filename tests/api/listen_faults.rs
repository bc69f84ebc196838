//! `webhook-inbox listen` (the real binary) when things go wrong: a slow local endpoint, a
//! local endpoint that is down, a server killed mid long poll, Ctrl-C mid call. Each local
//! endpoint is a real HTTP receiver on 127.0.0.1 (`receiver.rs`).

use std::time::{Duration, Instant};

use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::listen::{Listen, all_completed};
use crate::process::{ServerProcess, free_port, send_signed, write_config};
use crate::pull::{PULL_TOKEN, pull_config};
use crate::receiver::Receiver;

/// A column of the `orders` state of event `id`.
fn state_of(app: &TestApp, id: &str, column: &str) -> i64 {
    app.count(&format!(
        "SELECT s.{column} FROM event_state s JOIN subscriptions u ON u.id = s.sub
           JOIN event_log l ON l.seq = s.seq WHERE u.name = 'orders' AND l.event_id = '{id}'"
    ))
}

fn count_status(app: &TestApp, status: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM event_state s JOIN subscriptions u ON u.id = s.sub
          WHERE u.name = 'orders' AND s.status = '{status}'"
    ))
}

/// A batch forwarded one slow call at a time takes longer than one lease: each call still
/// starts under a lease that covers it (the waiting claims are extended), and each event is
/// acked as its call ends, so each is POSTed once and completed at its first attempt.
#[tokio::test]
async fn listen_covers_a_slow_endpoints_batch_with_leases_and_acks_each_call() {
    let app = spawn_app_with(pull_config(""), BuildOptions::default()).await;
    let endpoint = Receiver::start(Duration::from_millis(350), 204);
    let n = 10;
    for i in 0..n {
        let body = order_body(&format!("o{i}"), "c1", 1);
        assert_eq!(
            app.deliver("shop", &format!("slow{i}"), &body).await.status,
            200
        );
    }
    // A lease of about 3 s for a 500 ms timeout; the batch takes about 3.5 s.
    let listen = Listen::start(
        app.dir.path(),
        &app.address,
        &endpoint.url,
        &["--batch", "10", "--timeout-ms", "500"],
    );
    all_completed(&app, n, Duration::from_secs(20), &listen).await;
    let calls = endpoint.calls();
    let mut ids: Vec<&str> = calls
        .iter()
        .map(|c| c.header("webhook-inbox-event-id").unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!((calls.len(), ids.len()), (10, 10), "{:?}", listen.output());
    let attempts = app.count(
        "SELECT max(attempts) FROM event_state s JOIN subscriptions u ON u.id = s.sub
          WHERE u.name = 'orders'",
    );
    assert_eq!(attempts, 1, "{:?}", listen.output());
    // Acked as its call ends: each event is completed before the next call reaches the
    // endpoint, not at the end of the batch.
    for pair in calls.windows(2) {
        let id = pair[0].header("webhook-inbox-event-id").unwrap();
        let completed = state_of(&app, id, "completed_at");
        assert!(
            completed <= pair[1].read_at,
            "{id} completed at {completed}, after the next call began at {}",
            pair[1].read_at
        );
    }
    drop(listen);
    app.stop().await;
}

/// A local endpoint that refuses connections got nothing: the claims are given back (no retry
/// spent, nothing fails however long it is down) and `listen` waits for the port to accept;
/// once the endpoint is up, each event is delivered once.
#[tokio::test]
async fn listen_gives_events_back_while_the_endpoint_refuses_connections() {
    let app = spawn_app_with(
        pull_config("backoff_base_ms = 10\nbackoff_max_ms = 50\nmax_attempts = 3"),
        BuildOptions::default(),
    )
    .await;
    let port = free_port();
    for i in 0..3 {
        let body = order_body(&format!("o{i}"), "c1", 1);
        assert_eq!(
            app.deliver("shop", &format!("down{i}"), &body).await.status,
            200
        );
    }
    let url = format!("http://127.0.0.1:{port}/in");
    let listen = Listen::start(app.dir.path(), &app.address, &url, &["--batch", "10"]);
    // Down for a while: with retries, three attempts would have failed each event by now.
    let deadline = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < deadline {
        assert_eq!(count_status(&app, "failed"), 0, "{:?}", listen.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempts = app.count(
        "SELECT max(attempts) FROM event_state s JOIN subscriptions u ON u.id = s.sub
          WHERE u.name = 'orders'",
    );
    assert!(attempts <= 1, "attempts {attempts}: {:?}", listen.output());
    let (_, err) = listen.output();
    assert!(err.contains("refused the connection"), "{err}");
    assert!(err.contains("Connection refused"), "the cause: {err}");

    let endpoint = Receiver::start_on(port, Duration::ZERO, 204);
    all_completed(&app, 3, Duration::from_secs(20), &listen).await;
    assert_eq!(endpoint.calls().len(), 3, "{:?}", listen.output());
    drop(listen);
    app.stop().await;
}

/// Ctrl-C while the endpoint holds a call: that call may have reached it, so its claim is not
/// given back (its lease decides); the claims not started are.
#[tokio::test]
async fn listen_leaves_the_call_in_flight_to_its_lease_on_ctrl_c() {
    let app = spawn_app_with(pull_config(""), BuildOptions::default()).await;
    let endpoint = Receiver::start(Duration::from_secs(3), 204);
    for i in 0..2 {
        let body = order_body(&format!("o{i}"), "c1", 1);
        assert_eq!(
            app.deliver("shop", &format!("int{i}"), &body).await.status,
            200
        );
    }
    let mut listen = Listen::start(
        app.dir.path(),
        &app.address,
        &endpoint.url,
        &["--batch", "10", "--timeout-ms", "5000"],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while endpoint.in_flight() == 0 {
        assert!(Instant::now() < deadline, "no call: {:?}", listen.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let exit = listen.interrupt(Duration::from_secs(5));
    assert!(exit.success(), "{exit:?} {:?}", listen.output());
    let (claimed, pending) = (count_status(&app, "claimed"), count_status(&app, "pending"));
    assert_eq!((claimed, pending), (1, 1), "{:?}", listen.output());
    app.stop().await;
}

/// The server is SIGKILLed while `listen` waits in a long poll: `listen` reconnects with
/// backoff (saying so) and forwards what the restarted server has.
#[test]
fn listen_reconnects_when_its_long_poll_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let subscription = format!(
        "[[subscriptions]]\nname = \"orders\"\nkind = \"pull\"\ntoken = \"{PULL_TOKEN}\"\n"
    );
    let (config, settings) = write_config(dir.path(), port, &subscription, "workers = 0");
    let mut server = ServerProcess::start(dir.path(), &config, port, "server1.log");
    let endpoint = Receiver::start(Duration::ZERO, 204);
    let mut listen = Listen::start(dir.path(), &server.base, &endpoint.url, &[]);
    let client = reqwest::blocking::Client::new();
    let forwarded = |n: usize, listen: &Listen| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while endpoint.calls().len() < n {
            assert!(
                Instant::now() < deadline,
                "not forwarded: {:?}",
                listen.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // One event through, so that `listen` is connected; its next claim is a long poll, cut.
    let body = order_body("o1", "c1", 1);
    assert_eq!(
        send_signed(&client, &server.base, &settings, "before", &body),
        200
    );
    forwarded(1, &listen);
    std::thread::sleep(Duration::from_millis(500));
    server.kill();
    std::thread::sleep(Duration::from_millis(300));
    assert!(listen.running(), "listen exited: {:?}", listen.output());
    let server = ServerProcess::start(dir.path(), &config, port, "server2.log");
    let body = order_body("o2", "c1", 1);
    assert_eq!(
        send_signed(&client, &server.base, &settings, "after", &body),
        200
    );
    forwarded(2, &listen);
    assert!(listen.running(), "{:?}", listen.output());
    let (_, err) = listen.output();
    assert!(err.contains("was cut"), "{err}");
    assert!(err.contains("trying again in"), "{err}");
}
