//! Where the CLI finds the server and its token: `--url`/`--token`, then
//! `WEBHOOK_INBOX_URL`/`WEBHOOK_INBOX_ADMIN_TOKEN`, then the config file (`listen`,
//! `admin_token`, with `WEBHOOK_INBOX_*` overrides), then the embedded default. The real
//! binary against a real server, with every inherited `WEBHOOK_INBOX_*` variable removed.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::helpers::*;

/// The binary in `dir` with only the given `WEBHOOK_INBOX_*` variables set.
pub async fn bare_cli(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"));
    command.args(args).current_dir(dir).env_remove("RUST_LOG");
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("WEBHOOK_INBOX_")) {
        command.env_remove(key);
    }
    command.envs(env.iter().copied());
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The test config with `listen` set to `listen` (the server really listens on `app.address`).
fn config_listening_on(app: &TestApp, listen: &str) -> String {
    test_config(&app.dir).replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"{listen}\""),
    )
}

fn host_port(app: &TestApp) -> &str {
    app.address.trim_start_matches("http://")
}

fn listed(o: &Output) -> Vec<String> {
    assert!(o.status.success(), "{}", stderr(o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn events_list_takes_url_and_token_from_the_config_file() {
    let app = spawn_app().await;
    app.deliver("shop", "cfg-1", &order_body("o-1", "c-1", 1))
        .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("multi.toml"),
        config_listening_on(&app, host_port(&app)),
    )
    .unwrap();

    // `listen` and `admin_token` of the file, nothing else given.
    let o = bare_cli(
        dir.path(),
        &["events", "list", "--config", "multi.toml", "--json"],
        &[],
    )
    .await;
    assert_eq!(listed(&o), ["cfg-1"]);

    // --url given: the token still comes from the file, not from data/admin-token.
    let o = bare_cli(
        dir.path(),
        &[
            "--config",
            "multi.toml",
            "events",
            "list",
            "--url",
            &app.address,
            "--json",
        ],
        &[],
    )
    .await;
    assert_eq!(listed(&o), ["cfg-1"]);

    // ./webhook-inbox.toml is the implicit config, as for `serve`.
    std::fs::copy(
        dir.path().join("multi.toml"),
        dir.path().join("webhook-inbox.toml"),
    )
    .unwrap();
    let o = bare_cli(dir.path(), &["events", "list", "--json"], &[]).await;
    assert_eq!(listed(&o), ["cfg-1"]);
}

#[tokio::test]
async fn flags_beat_variables_beat_the_config_file_and_webhook_inbox_listen_carries_over() {
    let app = spawn_app().await;
    app.deliver("shop", "order-1", &order_body("o-1", "c-1", 1))
        .await;
    let dead = format!("127.0.0.1:{}", crate::process::free_port());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.toml"), config_listening_on(&app, &dead)).unwrap();
    let list = ["--config", "c.toml", "events", "list", "--json"];

    // The file names a dead port: the variable wins over it, the flag over the variable.
    let o = bare_cli(dir.path(), &list, &[("WEBHOOK_INBOX_URL", &app.address)]).await;
    assert_eq!(listed(&o), ["order-1"]);
    let mut with_flag = list.to_vec();
    with_flag.extend(["--url", &app.address]);
    let o = bare_cli(
        dir.path(),
        &with_flag,
        &[("WEBHOOK_INBOX_URL", &format!("http://{dead}"))],
    )
    .await;
    assert_eq!(listed(&o), ["order-1"]);

    // WEBHOOK_INBOX_LISTEN overrides the file's `listen` for the CLI as it does for `serve`.
    let o = bare_cli(
        dir.path(),
        &list,
        &[("WEBHOOK_INBOX_LISTEN", host_port(&app))],
    )
    .await;
    assert_eq!(listed(&o), ["order-1"]);

    // A token flag beats the file's `admin_token`, and the variable does too.
    let mut wrong = with_flag.clone();
    wrong.extend(["--token", "wrong"]);
    let o = bare_cli(dir.path(), &wrong, &[]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = bare_cli(
        dir.path(),
        &with_flag,
        &[("WEBHOOK_INBOX_ADMIN_TOKEN", "wrong")],
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("refused the token"), "{}", stderr(&o));
}

#[tokio::test]
async fn without_a_config_the_cli_uses_the_embedded_default_token_file() {
    let app = spawn_app().await;
    app.deliver("shop", "emb-1", &order_body("o-1", "c-1", 1))
        .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(
        dir.path().join("data/admin-token"),
        format!("{ADMIN_TOKEN}\n"),
    )
    .unwrap();
    let o = bare_cli(
        dir.path(),
        &["events", "list", "--json"],
        &[("WEBHOOK_INBOX_LISTEN", host_port(&app))],
    )
    .await;
    assert_eq!(listed(&o), ["emb-1"]);
    assert!(
        !dir.path().join("data/webhook-inbox.db").exists(),
        "the CLI creates nothing"
    );
}

#[tokio::test]
async fn help_tells_the_order_and_usage_shows_url_as_optional() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["events", "list", "--help"][..],
        &["replay", "--help"],
        &["events", "--help"],
    ] {
        let o = bare_cli(dir.path(), args, &[]).await;
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let help = String::from_utf8_lossy(&o.stdout).into_owned();
        let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
        assert!(!usage.contains("--url"), "{args:?}: {usage}");
        assert!(
            help.contains("WEBHOOK_INBOX_URL") && help.contains("listen"),
            "{args:?}: {help}"
        );
    }
}
