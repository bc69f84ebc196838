//! The CLI for ops with several subscriptions (issue 63), as a process against the real server:
//! `--subscription` on `events list` and `show` prints that subscription's state; failed events
//! name the subscriptions that failed them; a retrying state's error shows; `--url` and
//! `--token` before the subcommand; the generated admin token found beside the config.

use std::process::{Command, Output};

use serde_json::{Value, json};
use webhook_inbox::startup::BuildOptions;

use crate::cli::{stderr, stdout};
use crate::helpers::*;
use crate::pull::PULL_TOKEN;

const BAD: &str = r#"{"type":"order.completed","data":{"customer_id":"c","points":1}}"#;

/// The CLI with no URL or token in its environment, in `cwd`.
async fn bare_cli(cwd: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"));
    command
        .args(args)
        .current_dir(cwd)
        .env_remove("WEBHOOK_INBOX_URL")
        .env_remove("WEBHOOK_INBOX_ADMIN_TOKEN")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied());
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Seen failing before the change: `--subscription ledger` printed the event's summary
/// (failed), `show` refused `--subscription`, no SUBSCRIPTIONS column, the retrying state's
/// error was not shown, and `--url` before `events` was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shows_a_subscriptions_state_and_what_failed_where() {
    let config = format!(
        r#"
[[subscriptions]]
name = "points"
kind = "loyalty-credit"
types = ["order.completed"]

[[subscriptions]]
name = "workers"
kind = "pull"
types = ["customer.*"]
token = "{PULL_TOKEN}"

[[subscriptions]]
name = "ledger"
kind = "audit"
"#
    );
    let app = spawn_app_with(move |c| c.push_str(&config), BuildOptions::default()).await;
    app.deliver("shop", "bad", BAD).await;
    app.deliver("shop", "c1", r#"{"type":"customer.created"}"#)
        .await;
    app.drain().await;
    // The pull worker asks for a retry, with an error: pending, and the error kept.
    let claims = app
        .post(
            "/subscriptions/workers/claim",
            Some(PULL_TOKEN),
            Some(json!({"max": 10, "wait_ms": 0})),
        )
        .await;
    let token = claims.body["claims"][0]["token"].clone();
    let r = app
        .post(
            "/subscriptions/workers/ack",
            Some(PULL_TOKEN),
            Some(json!({"results": [{"token": token, "outcome": "retry", "error": "billing answered 503", "retry_after_ms": 600000}]})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    let dir = app.dir.path();
    let wrong = [("WEBHOOK_INBOX_URL", "http://127.0.0.1:1")];
    let before = ["--url", &app.address, "--token", ADMIN_TOKEN];
    let run = |args: &[&str]| {
        let mut all: Vec<&str> = before.to_vec();
        all.extend_from_slice(args);
        let all: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        async move {
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            let o = bare_cli(dir, &refs, &wrong).await;
            assert!(o.status.success(), "{refs:?}: {}", stderr(&o));
            stdout(&o)
        }
    };
    // `--subscription ledger`: its state (completed, logged), not the summary (failed).
    let out = run(&["events", "list", "--subscription", "ledger"]).await;
    let bad = out
        .lines()
        .find(|l| l.contains(" bad "))
        .unwrap_or_default();
    assert!(
        bad.contains("completed") && !bad.contains("failed"),
        "{out}"
    );
    let out = run(&["events", "show", "shop", "bad", "--subscription", "ledger"]).await;
    assert!(
        out.contains("subscription") && out.contains("ledger"),
        "{out}"
    );
    let status = out
        .lines()
        .find(|l| l.starts_with("status"))
        .unwrap_or_default();
    assert!(status.contains("completed"), "{out}");
    let out = run(&["events", "show", "shop", "c1", "--subscription", "workers"]).await;
    assert!(out.contains("billing answered 503"), "{out}");
    // Failed events: which subscriptions failed them.
    let out = run(&["events", "list", "--status", "failed"]).await;
    assert!(
        out.lines().next().unwrap().contains("SUBSCRIPTIONS"),
        "{out}"
    );
    let bad = out
        .lines()
        .find(|l| l.contains(" bad "))
        .unwrap_or_default();
    assert!(bad.contains("points"), "{out}");
    // A retrying (pending) state's error is shown.
    let out = run(&["events", "list"]).await;
    let c1 = out.lines().find(|l| l.contains(" c1 ")).unwrap_or_default();
    assert!(
        c1.contains("pending") && c1.contains("billing answered 503"),
        "{out}"
    );
    // `--url` before the subcommand wins over the environment; not for `serve`.
    let o = bare_cli(dir, &["--url", "http://127.0.0.1:1", "serve"], &[]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    app.stop().await;
}

/// A server on its generated admin token, its config and database in another directory than
/// the CLI's: `--config` finds the token beside them; with none there, the error says where it
/// looked. Seen failing before the change (the token was looked for in ./data only).
#[test]
fn the_cli_finds_the_generated_token_beside_the_config() {
    let server_dir = tempfile::tempdir().unwrap();
    let port = crate::process::free_port();
    let config = server_dir.path().join("inbox.toml");
    std::fs::write(
        &config,
        format!("listen = \"127.0.0.1:{port}\"\ndatabase_url = \"sqlite://db/inbox.db\"\n"),
    )
    .unwrap();
    let _server =
        crate::process::ServerProcess::start(server_dir.path(), &config, port, "server.log");
    assert!(server_dir.path().join("db/admin-token").exists());
    let elsewhere = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config_arg = config.display().to_string();
    let o = rt.block_on(bare_cli(
        elsewhere.path(),
        &["--config", &config_arg, "events", "list", "--json"],
        &[],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let page: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(page["events"], json!([]));
    // A config whose database has no token beside it: the error says where it looked.
    let other = elsewhere.path().join("other.toml");
    std::fs::write(
        &other,
        format!("listen = \"127.0.0.1:{port}\"\ndatabase_url = \"sqlite://nothing/inbox.db\"\n"),
    )
    .unwrap();
    let other_arg = other.display().to_string();
    let o = rt.block_on(bare_cli(
        elsewhere.path(),
        &["--config", &other_arg, "events", "list"],
        &[],
    ));
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("no admin token found") && err.contains("nothing/admin-token"),
        "{err}"
    );
}
