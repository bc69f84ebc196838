//! Alerts of real binaries on PostgreSQL. Two nodes on one database, both evaluating the same alert every
//! 100 ms: a flood of refused deliveries sent to both gives one notice, written once and sent
//! once. (The store-level race in `alerts_store` releases eight nodes through a barrier; this
//! one shows the product as deployed.)

use std::time::{Duration, Instant};

use crate::alerts::{FAST_ENV, evaluations_in, notices};
use crate::helpers::SW_SECRET;
use crate::nodes::node_config;
use crate::pg_restart::PrivateCluster;
use crate::pgdb::{self, PgDatabase};
use crate::process::{ServerProcess, free_port};
use crate::receiver::Receiver;

/// Wait (bounded) until `node` has finished `rounds` more evaluations, by its
/// `webhook_inbox_alert_evaluations_total` (the store must answer: `/metrics` reads it).
fn after_rounds(node: &ServerProcess, rounds: u64) {
    let client = reqwest::blocking::Client::new();
    let now = || {
        let r = client.get(format!("{}/metrics", node.base)).send().unwrap();
        evaluations_in(&r.text().unwrap())
    };
    let (start, deadline) = (now(), Instant::now() + Duration::from_secs(20));
    while now() < start + rounds {
        assert!(Instant::now() < deadline, "fewer than {rounds} evaluations");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While the store is down, each round logs that it is unavailable: wait for `rounds` more.
fn after_rounds_down(node: &ServerProcess, rounds: usize) {
    let count = || node.logs().matches("the store is unavailable").count();
    let (start, deadline) = (count(), Instant::now() + Duration::from_secs(60));
    while count() < start + rounds {
        assert!(Instant::now() < deadline, "fewer than {rounds} evaluations");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_nodes_on_one_database_send_one_notice_of_a_flood() {
    if !pgdb::available() {
        return;
    }
    let db = PgDatabase::create();
    let dir = tempfile::tempdir().unwrap();
    let channel = Receiver::start(Duration::ZERO, 200);
    let extra = format!(
        "[consumers]\nworkers = 0\n\
         [[alerts]]\nname = \"ops\"\nkind = \"webhook\"\nurl = \"{}\"\nsecret = \"{SW_SECRET}\"\n\
         [[alerts.conditions]]\nkind = \"source_rejected\"\nthreshold = 5\nduration_seconds = 60\n",
        channel.url
    );
    let nodes: Vec<ServerProcess> = (0..2)
        .map(|i| {
            let port = free_port();
            let config = node_config(dir.path(), &format!("node{i}"), port, &db.url, &extra);
            ServerProcess::start_with_env(
                dir.path(),
                &config,
                port,
                &format!("node{i}.log"),
                FAST_ENV,
            )
        })
        .collect();
    let client = reqwest::blocking::Client::new();
    let now = webhook_inbox::domain::time::now_secs().to_string();
    for i in 0..40 {
        let r = client
            .post(format!("{}/webhooks/shop", nodes[i % 2].base))
            .header("webhook-id", format!("bad-{i}"))
            .header("webhook-timestamp", &now)
            .header("webhook-signature", "v1,AAAA")
            .body("{}")
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while channel.calls().is_empty() {
        assert!(Instant::now() < deadline, "no notice");
        std::thread::sleep(Duration::from_millis(20));
    }
    for node in &nodes {
        after_rounds(node, 10);
    }
    let sent = notices(&channel);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["subject"], "shop");
    assert_eq!(db.count("SELECT count(*) FROM alert_notices"), 1);
    assert_eq!(
        db.count("SELECT count(*) FROM alert_notices WHERE sent_at IS NOT NULL"),
        1
    );
    // Both nodes evaluated all along (each logs its evaluation failures; none here).
    for node in &nodes {
        assert!(!node.logs().contains("alerts: cannot"), "{}", node.logs());
    }
}

/// The database stops under a node (a cluster of this test's own, as in `pg_restart`): after
/// `duration_seconds` the node sends a "started" notice of `store_unavailable` naming itself,
/// straight from memory; once the database is back, one "cleared".
#[test]
fn a_database_down_longer_than_the_duration_gives_one_started_then_one_cleared() {
    if !pgdb::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = PrivateCluster::start(dir.path());
    let channel = Receiver::start(Duration::ZERO, 200);
    let extra = format!(
        "[consumers]\nworkers = 0\n\
         [[alerts]]\nname = \"ops\"\nkind = \"webhook\"\nurl = \"{}\"\nsecret = \"{SW_SECRET}\"\n\
         [[alerts.conditions]]\nkind = \"store_unavailable\"\nduration_seconds = 1\n",
        channel.url
    );
    let port = free_port();
    let config = node_config(dir.path(), "node", port, &cluster.url, &extra);
    let node = ServerProcess::start_with_env(dir.path(), &config, port, "node.log", FAST_ENV);
    after_rounds(&node, 5);
    assert!(
        channel.calls().is_empty(),
        "a notice while the store answers"
    );

    cluster.ctl("stop");
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(60);
    while channel.calls().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no started notice: {}",
            node.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        stopped.elapsed() >= Duration::from_secs(1),
        "sent before the duration"
    );
    let started = notices(&channel);
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["type"], "alert.started");
    assert_eq!(started[0]["condition"], "store_unavailable");
    after_rounds_down(&node, 5);
    assert_eq!(channel.calls().len(), 1, "repeated while down");

    cluster.ctl("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    while channel.calls().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no cleared notice: {}",
            node.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    after_rounds(&node, 5);
    let all = notices(&channel);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[1]["type"], "alert.cleared");
    assert_eq!(all[1]["subject"], all[0]["subject"]);
}
