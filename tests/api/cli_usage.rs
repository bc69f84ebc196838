//! The CLI as a new user meets it: usage errors exit 2, messages name flags rather than query
//! parameters, `migrate` and `export` report in words, `show` keeps the payload's key order,
//! `sign` leaves an hmac-sha256 body's own id alone, and completions and a man page exist.

use std::process::Output;

use serde_json::Value;

use crate::cli_config::{bare_cli, stderr};
use crate::helpers::*;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The binary against `app`, with its URL and token as flags.
async fn cli(app: &TestApp, args: &[&str]) -> Output {
    let mut all = args.to_vec();
    all.extend(["--url", &app.address, "--token", ADMIN_TOKEN]);
    bare_cli(app.dir.path(), &all, &[]).await
}

#[tokio::test]
async fn retry_of_a_completed_event_says_force_flag_and_bad_status_is_a_usage_error() {
    let app = spawn_app().await;
    app.deliver("shop", "ok-3", &order_body("o-3", "c-1", 1))
        .await;
    app.drain().await;
    let o = cli(&app, &["events", "retry", "shop", "ok-3"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--force") && !stderr(&o).contains("?force"),
        "{}",
        stderr(&o)
    );
    let o = cli(&app, &["events", "list", "--status", "done"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("completed"), "{}", stderr(&o));
    let o = cli(&app, &["events", "list", "--limit", "501"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[tokio::test]
async fn list_pages_with_cursor_and_export_counts_events() {
    let app = spawn_app().await;
    for i in 1..=3 {
        app.deliver(
            "shop",
            &format!("p-{i}"),
            &order_body(&format!("o-{i}"), "c", 1),
        )
        .await;
    }
    let o = cli(&app, &["events", "list", "--limit", "2"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let hint = stderr(&o);
    let cursor = hint
        .split("--cursor ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{hint}"));
    let o = cli(
        &app,
        &[
            "events", "list", "--limit", "2", "--cursor", cursor, "--json",
        ],
    )
    .await;
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["events"][0]["event_id"], "p-1");
    assert_eq!(v["events"].as_array().unwrap().len(), 1);
    assert!(v["next_cursor"].is_null());

    let o = cli(&app, &["events", "export", "-o", "out.jsonl"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("exported 3 event(s) to out.jsonl"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test]
async fn show_prints_the_payload_with_its_keys_in_the_order_received() {
    let app = spawn_app().await;
    let body = r#"{"type":"zeta.first","zulu":1,"alpha":{"z":1,"a":2},"mike":3}"#;
    app.deliver("shop", "ord", body).await;
    let o = cli(&app, &["events", "show", "shop", "ord"]).await;
    let out = stdout(&o);
    let at = |key: &str| out.find(&format!("\"{key}\"")).unwrap();
    assert!(
        at("type") < at("zulu") && at("zulu") < at("alpha") && at("alpha") < at("mike"),
        "{out}"
    );
    assert!(at("z") < at("a"), "{out}");
}

#[tokio::test]
async fn sign_adds_x_event_id_for_hmac_only_when_asked_or_when_the_body_has_none() {
    let app = spawn_app().await;
    let dir = app.dir.path();
    std::fs::write(dir.join("inbox.toml"), test_config(&app.dir)).unwrap();
    let sign = |body: &'static str, extra: &'static [&'static str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-inbox"));
        command
            .args(["--config", "inbox.toml", "sign", "--source", "hmac"])
            .args(extra)
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success());
        let headers: Vec<(String, String)> = stdout(&o)
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        headers
    };
    let with_id = r#"{"event_id":"hm-1","type":"order.completed"}"#;
    let headers = sign(with_id, &[]);
    assert!(
        !headers.iter().any(|(k, _)| k == "X-Event-Id"),
        "{headers:?}"
    );
    let r = app.post_webhook("hmac", &headers, with_id.as_bytes()).await;
    assert_eq!(r.body["event_id"], "hm-1", "{}", r.body);

    let headers = sign(with_id, &["--event-id", "hm-forced"]);
    assert!(headers.contains(&("X-Event-Id".into(), "hm-forced".into())));
    let without = r#"{"type":"order.completed"}"#;
    let headers = sign(without, &[]);
    assert!(
        headers.iter().any(|(k, _)| k == "X-Event-Id"),
        "{headers:?}"
    );
    let r = app.post_webhook("hmac", &headers, without.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test]
async fn completions_and_man_page_are_generated_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let o = bare_cli(dir.path(), &["completions", "bash"], &[]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("complete -F _webhook__inbox"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("--cursor"));
    let o = bare_cli(dir.path(), &["completions", "tcsh"], &[]).await;
    assert_eq!(o.status.code(), Some(2));
    let o = bare_cli(dir.path(), &["man"], &[]).await;
    assert!(stdout(&o).starts_with(".ie") || stdout(&o).contains(".TH webhook-inbox 1"));
    let o = bare_cli(dir.path(), &["man", "--dir", "man"], &[]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    for page in [
        "webhook-inbox.1",
        "webhook-inbox-events-list.1",
        "webhook-inbox-replay.1",
    ] {
        assert!(dir.path().join("man").join(page).exists(), "{page}");
    }
}

#[tokio::test]
async fn migrate_says_created_then_up_to_date() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("m.toml"),
        "database_url = \"sqlite://m.db\"\n",
    )
    .unwrap();
    let all: Vec<String> = webhook_inbox::store::sqlite::MIGRATIONS
        .iter()
        .map(|(version, _, _)| version.to_string())
        .collect();
    let o = bare_cli(dir.path(), &["migrate", "--config", "m.toml"], &[]).await;
    assert_eq!(
        stdout(&o).trim(),
        format!(
            "created database m.db and applied migrations {}",
            all.join(", ")
        )
    );
    let o = bare_cli(dir.path(), &["migrate", "--config", "m.toml"], &[]).await;
    assert_eq!(
        stdout(&o).trim(),
        "database m.db is up to date: no migration to apply"
    );
}

#[tokio::test]
async fn config_messages_name_the_variable_the_os_error_once_and_accept_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let o = bare_cli(
        dir.path(),
        &["migrate"],
        &[("WEBHOOK_INBOX_CONSUMERS__WORKERS", "abc")],
    )
    .await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("WEBHOOK_INBOX_CONSUMERS__WORKERS")
            && err.contains("non-negative integer")
            && !err.contains("usize")
            && !err.contains("config file"),
        "{err}"
    );
    let o = bare_cli(dir.path(), &["serve", "--config", "missing.toml"], &[]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o).matches("No such file").count(),
        1,
        "{}",
        stderr(&o)
    );

    std::fs::write(
        dir.path().join("h.toml"),
        "listen = \"localhost:28100\"\ndatabase_url = \"sqlite://h.db\"\n",
    )
    .unwrap();
    let o = bare_cli(dir.path(), &["migrate", "--config", "h.toml"], &[]).await;
    assert!(o.status.success(), "{}", stderr(&o));
}

#[tokio::test]
async fn serve_on_a_port_in_use_fails_before_creating_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    std::fs::write(
        dir.path().join("p.toml"),
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase_url = \"sqlite://p.db\"\nadmin_token = \"port-taken-test-token\"\n"
        ),
    )
    .unwrap();
    let o = bare_cli(dir.path(), &["serve", "--config", "p.toml"], &[]).await;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains(&format!("binding 127.0.0.1:{port}")),
        "{}",
        stderr(&o)
    );
    assert!(
        !dir.path().join("p.db").exists(),
        "no database file was created"
    );
    // Nor, on the embedded default, its admin token or demo secret.
    let o = bare_cli(
        dir.path(),
        &["serve"],
        &[("WEBHOOK_INBOX_LISTEN", &format!("127.0.0.1:{port}"))],
    )
    .await;
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("binding"), "{}", stderr(&o));
    assert!(
        !dir.path().join("data").exists(),
        "no data directory was created"
    );
}
