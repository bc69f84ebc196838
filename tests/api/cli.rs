//! The CLI run as a process against a spawned server: tables, `--json`, exit codes, export and
//! replay.

use std::process::{Command, Output};

use serde_json::Value;

use crate::helpers::*;

pub async fn cli(app: &TestApp, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"));
    command
        .args(args)
        .current_dir(app.dir.path())
        .env("WEBHOOK_INBOX_URL", &app.address)
        .env("WEBHOOK_INBOX_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("RUST_LOG");
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn events_list_and_show_print_tables_and_json() {
    let app = spawn_app().await;
    app.deliver("shop", "e1", &order_body("o-1", "c-1", 10))
        .await;
    app.deliver("shop", "e2", r#"{"type":"order.completed"}"#)
        .await;
    app.drain().await;

    let o = cli(&app, &["events", "list"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("SOURCE"), "{out}");
    assert!(
        lines[1].contains("e2")
            && lines[1].contains("failed")
            && lines[1].contains("missing order_id"),
        "{out}"
    );
    assert!(
        lines[2].contains("e1") && lines[2].contains("completed") && lines[2].contains("credited"),
        "{out}"
    );

    let o = cli(&app, &["events", "list", "--status", "failed", "--json"]).await;
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["events"].as_array().unwrap().len(), 1);
    assert_eq!(v["events"][0]["event_id"], "e2");

    let o = cli(&app, &["events", "list", "--limit", "1", "--all", "--json"]).await;
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["events"].as_array().unwrap().len(),
        2,
        "--all follows the cursor"
    );

    let o = cli(&app, &["events", "show", "shop", "e1"]).await;
    let out = stdout(&o);
    assert!(out.contains("status              completed"), "{out}");
    assert!(out.contains("\"order_id\": \"o-1\""), "{out}");
    assert!(out.contains("history:") && out.contains(" ok"), "{out}");
    let o = cli(&app, &["events", "show", "shop", "e1", "--json"]).await;
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["history"][0]["result"], "ok");
}

#[tokio::test]
async fn events_retry_and_exit_codes_scripts_can_rely_on() {
    let app = spawn_app().await;
    app.deliver("shop", "bad", r#"{"type":"order.completed"}"#)
        .await;
    app.deliver("shop", "good", &order_body("o-1", "c-1", 1))
        .await;
    app.drain().await;

    let o = cli(&app, &["events", "retry", "shop", "bad"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("shop/bad: pending"), "{}", stdout(&o));

    // A completed event needs --force: exit 1 with a message that says so.
    let o = cli(&app, &["events", "retry", "shop", "good"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("force"), "{}", stderr(&o));
    let o = cli(
        &app,
        &["events", "retry", "shop", "good", "--force", "--json"],
    )
    .await;
    assert!(o.status.success());
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], "pending");

    app.drain().await;
    // A bulk retry counts first; without a terminal to ask on, it needs --yes.
    let bulk = ["events", "retry", "--failed", "--source", "shop"];
    let o = cli(&app, &[&bulk[..], &["--dry-run"]].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("1 failed event(s) matching source=shop would be retried"),
        "{}",
        stdout(&o)
    );
    let o = cli(&app, &bulk).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--yes"), "{}", stderr(&o));
    assert_eq!(
        app.event("shop", "bad").await["status"],
        "failed",
        "nothing retried"
    );
    let o = cli(&app, &[&bulk[..], &["--yes", "--json"]].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["retried"],
        1
    );

    let o = cli(&app, &["events", "show", "shop", "missing"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not_found"), "{}", stderr(&o));

    let o = cli(&app, &["events", "list", "--token", "wrong"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("WEBHOOK_INBOX_ADMIN_TOKEN"),
        "{}",
        stderr(&o)
    );

    let port = crate::process::free_port();
    let o = cli(
        &app,
        &[
            "events",
            "list",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("is the server running"),
        "{}",
        stderr(&o)
    );

    let o = cli(&app, &["events", "bogus"]).await;
    assert_eq!(o.status.code(), Some(2));
}

#[tokio::test]
async fn export_then_replay_into_the_same_server_is_all_duplicates_and_moves_no_balance() {
    let app = spawn_app().await;
    std::fs::write(app.dir.path().join("inbox.toml"), test_config(&app.dir)).unwrap();
    for i in 0..20 {
        app.deliver(
            "shop",
            &format!("e{i}"),
            &order_body(&format!("o-{i}"), "c-r", 3),
        )
        .await;
    }
    let stripe_body = r#"{"id":"evt_s1","type":"charge.succeeded","amount":100}"#;
    app.deliver("stripe", "", stripe_body).await;
    let form = "payload=%7B%22zen%22%3A%22ok%22%7D";
    let mut req = app
        .client
        .post(app.url("/webhooks/github"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form);
    for (k, v) in sign_for(&app.settings, "github", "gh-1", form.as_bytes()) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200);
    app.drain().await;
    assert_eq!(app.balance("c-r").await, 60);

    let o = cli(&app, &["events", "export", "--output", "export.jsonl"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let exported = std::fs::read_to_string(app.dir.path().join("export.jsonl")).unwrap();
    assert_eq!(exported.lines().count(), 22);
    let o = cli(
        &app,
        &["--config", "inbox.toml", "replay", "export.jsonl", "--json"],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        summary,
        serde_json::json!({"lines": 22, "sent": 22, "queued": 0, "duplicate": 22, "rejected": 0,
                           "errors": 0, "failed": [], "stored_under_another_id": []})
    );
    let mismatches = app.count("SELECT sum(payload_mismatches) FROM events");
    assert_eq!(mismatches, 0, "the replayed bodies are byte-identical");
    app.drain().await;
    assert_eq!(app.balance("c-r").await, 60);
    assert_eq!(app.count("SELECT max(deliveries) FROM events"), 2);

    // A line for an unknown source is rejected: exit 1 with the line named.
    std::fs::write(
        app.dir.path().join("bad.jsonl"),
        "{\"source\":\"nowhere\",\"event_id\":\"x\",\"type\":\"t\",\"body\":\"{}\"}\nnot json\n",
    )
    .unwrap();
    let o = cli(&app, &["--config", "inbox.toml", "replay", "bad.jsonl"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("2 rejected"), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("line 1") && stderr(&o).contains("line 2"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn serve_refuses_a_config_with_a_bad_key_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key) in [
        (
            "listen = \"127.0.0.1:0\"\n[consumers]\nworkerz = 2\n",
            "workerz",
        ),
        (
            "listen = \"127.0.0.1:0\"\n[consumers]\nbatch_size = 0\n",
            "consumers.batch_size",
        ),
        (
            "[[sources]]\nname = \"requests\"\nscheme = \"github\"\nsecrets = [\"x\"]\n",
            "sources[0].name",
        ),
    ] {
        std::fs::write(dir.path().join("bad.toml"), text).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
            .args(["serve", "--config", "bad.toml"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{text}");
        assert!(stderr(&o).contains(key), "{text}: {}", stderr(&o));
    }
    assert!(!dir.path().join("data").exists(), "nothing was created");
}

/// `events purge` through the real binary: ages become times (`0s` is now), the answer is the
/// count, a bad age is a usage error (exit 2) that sends nothing.
#[tokio::test]
async fn events_purge_turns_old_terminal_events_into_tombstones() {
    let app = spawn_app().await;
    app.deliver("shop", "done", &order_body("o-1", "c-1", 3))
        .await;
    app.deliver("shop", "done-too", &order_body("o-2", "c-1", 4))
        .await;
    app.drain().await;
    // Stored after the drain: still pending when the purge runs.
    app.deliver("shop", "later", &order_body("o-3", "c-1", 5))
        .await;

    let o = cli(&app, &["events", "purge", "--completed-before", "1x"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(app.event("shop", "done").await["purged"], false);

    let o = cli(
        &app,
        &["events", "purge", "--completed-before", "0s", "--json"],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let answer: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(answer["purged"], 2, "{answer}");
    for id in ["done", "done-too"] {
        let event = app.event("shop", id).await;
        assert_eq!(event["purged"], true, "{event}");
    }
    let pending = app.event("shop", "later").await;
    assert_eq!(
        pending["purged"], false,
        "a pending event is never purged: {pending}"
    );
    // `events show` of a tombstone says so, with when and the body's digest.
    let o = cli(&app, &["events", "show", "shop", "done"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let shown = stdout(&o);
    assert!(shown.contains("purged by retention"), "{shown}");
    assert!(
        shown.contains("purged_at") && shown.contains("payload_sha256"),
        "{shown}"
    );
    assert!(!shown.contains("payload:\nnull"), "{shown}");
    // Lists take `--status purged`, and times as ages.
    let o = cli(
        &app,
        &[
            "events",
            "list",
            "--status",
            "purged",
            "--received-after",
            "1h",
            "--json",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed["events"].as_array().unwrap().len(), 2, "{listed}");
    let o = cli(
        &app,
        &["events", "list", "--received-after", "2h", "--json"],
    )
    .await;
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        listed["events"].as_array().unwrap().len(),
        1,
        "only `later`: {listed}"
    );
    let o = cli(&app, &["events", "list", "--received-after", "yesterday"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        app.balance("c-1").await,
        7,
        "guard rows and balances are kept"
    );
}
