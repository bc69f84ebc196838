//! How a forwarder's calls go out (src/forward/run.rs, client.rs): over connections kept
//! alive, at most one per call in flight and opened again only when the endpoint closes one,
//! each event delivered once; through the proxy the environment names, if any.

use std::collections::HashSet;
use std::time::Duration;

use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::process::{ServerProcess, free_port, send_signed, write_config};
use crate::receiver::{REQUESTS_PER_CONNECTION, Receiver, until};

/// Seen failing with the client's idle pool off (`pool_max_idle_per_host(0)`: a connection
/// per call, 300 here).
#[tokio::test]
async fn calls_reuse_their_connections() {
    const CONCURRENCY: usize = 4;
    let endpoint = Receiver::start(Duration::ZERO, 200);
    let url = endpoint.url.clone();
    let config = move |c: &mut String| {
        *c = c.replace("workers = 0", "workers = 1");
        c.push_str(&format!(
            r#"
[[subscriptions]]
name = "billing"
kind = "http"
sources = ["shop"]
url = "{url}"
signing_secret = "{SW_SECRET}"
concurrency = {CONCURRENCY}
"#
        ));
    };
    let options = BuildOptions {
        idle_poll: Some(Duration::from_millis(50)),
        ..BuildOptions::default()
    };
    let app = spawn_app_with(config, options).await;
    let events = 300;
    for i in 0..events {
        let body = order_body(&format!("o-{i}"), "c", 1);
        let answer = app.deliver("shop", &format!("k-{i}"), &body).await;
        assert_eq!(answer.body["status"], "queued");
    }
    until(
        "every event delivered",
        Duration::from_secs(60),
        async || {
            let counts = app.get("/subscriptions/billing").await.body["counts"].clone();
            counts["completed"] == events
        },
    )
    .await;
    let calls = endpoint.calls();
    let ids: HashSet<&str> = calls
        .iter()
        .filter_map(|c| c.header("webhook-id"))
        .collect();
    assert_eq!(
        (calls.len(), ids.len()),
        (events, events),
        "each event once"
    );
    // Every connection the receiver closed after its last request is opened again once.
    let most = CONCURRENCY + events / REQUESTS_PER_CONNECTION;
    assert!(
        endpoint.connections() <= most,
        "{} connections for {events} calls at concurrency {CONCURRENCY}",
        endpoint.connections()
    );
}

/// Where the environment names a proxy for the URL (`HTTP_PROXY`, read as curl and reqwest
/// read it), the calls go through it: the forwarder's own client serves only URLs no proxy
/// applies to. The URL's host does not resolve, so only the proxy can deliver. Seen failing
/// with the own client used whatever the environment.
#[test]
fn calls_go_through_the_proxy_the_environment_names() {
    let proxy = Receiver::start(Duration::ZERO, 200);
    let proxy_url = proxy.url.trim_end_matches("/in").to_string();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let subscription = format!(
        "[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\nsources = [\"shop\"]\n\
         url = \"http://upstream.invalid/in?x=1\"\nsigning_secret = \"{SW_SECRET}\"\n"
    );
    let (config, settings) = write_config(dir.path(), port, &subscription, "");
    let env = [
        ("HTTP_PROXY", proxy_url.as_str()),
        ("NO_PROXY", ""),
        ("ALL_PROXY", ""),
    ];
    let server = ServerProcess::start_with_env(dir.path(), &config, port, "node.log", &env);
    let client = reqwest::blocking::Client::new();
    let body = order_body("o-1", "c", 1);
    assert_eq!(
        send_signed(&client, &server.base, &settings, "k-1", &body),
        200
    );
    server.wait_for(
        Duration::from_secs(30),
        "the call through the proxy",
        || !proxy.calls().is_empty(),
    );
    let call = &proxy.calls()[0];
    assert_eq!(call.target, "http://upstream.invalid/in?x=1");
    assert_eq!(call.header("host"), Some("upstream.invalid"));
    assert!(call.header("webhook-signature").is_some(), "{call:?}");
}
