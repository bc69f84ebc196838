//! Three nodes of the real binary on one PostgreSQL database forward one `http` subscription
//! to the example receiver: every event reaches it exactly once (no node forwards an event
//! another node holds), the nodes share the work, and the receiver's balances are exact.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use webhook_inbox::forward::call::webhook_id;

use crate::endpoint::{Endpoint, receiver_available};
use crate::helpers::*;
use crate::nodes::{node_config, signing_settings};
use crate::pgdb::{self, PgDatabase};
use crate::process::{ServerProcess, free_port};

const NODES: usize = 3;
const ORDERS: usize = 300;

#[test]
fn nodes_on_postgresql_forward_each_event_once() {
    if !pgdb::available() || !receiver_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::start(dir.path(), SW_SECRET);
    let db = PgDatabase::create();
    let extra = format!(
        "[consumers]\nworkers = 1\n\n[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\n\
         url = \"{}\"\nsigning_secret = \"{SW_SECRET}\"\nconcurrency = 8\n",
        endpoint.hook_url()
    );
    let nodes: Vec<ServerProcess> = (0..NODES)
        .map(|i| {
            let port = free_port();
            let config = node_config(dir.path(), &format!("node{i}"), port, &db.url, &extra);
            ServerProcess::start(dir.path(), &config, port, &format!("node{i}.log"))
        })
        .collect();
    let settings = signing_settings();
    let client = reqwest::blocking::Client::new();
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..ORDERS {
        let customer = format!("c-{}", i % 7);
        let points = (i % 5 + 1) as i64;
        let body = order_body(&format!("o-{i}"), &customer, points);
        let id = format!("evt-{i}");
        let status =
            crate::process::send_signed(&client, &nodes[i % NODES].base, &settings, &id, &body);
        assert_eq!(status, 200, "{id}");
        *expected.entry(customer).or_default() += points;
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let view: serde_json::Value = client
            .get(format!("{}/subscriptions/billing", nodes[0].base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if view["counts"]["completed"] == ORDERS as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "not delivered: {view}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stats = rt.block_on(endpoint.stats());
    let calls = &stats["by_webhook_id_calls"];
    for i in 0..ORDERS {
        let id = format!("evt-{i}");
        assert_eq!(calls[webhook_id("shop", &id)], 1, "{id}: {stats}");
    }
    let balances: BTreeMap<String, i64> =
        serde_json::from_value(stats["balances"].clone()).unwrap();
    assert_eq!(balances, expected);
    // Every node forwarded a share (its forwarder's worker name is on the attempts).
    let forwarders = db.count(
        "SELECT count(DISTINCT worker) FROM event_attempts a JOIN subscriptions u ON u.id = a.sub
          WHERE u.name = 'billing'",
    );
    assert!(forwarders >= 2, "{forwarders} node(s) forwarded");
    assert_eq!(
        db.count(
            "SELECT count(*) FROM event_attempts a JOIN subscriptions u ON u.id = a.sub
              WHERE u.name = 'billing'"
        ),
        ORDERS as i64,
        "one attempt per event"
    );
}
