//! A `slack` channel's URL is its secret: a channel that fails never shows it, neither in the
//! server's log, nor in `alert_notices.last_error`, nor in `alerts test`'s answer.

use std::time::{Duration, Instant};

use crate::cli_config::bare_cli;
use crate::process::{ServerProcess, free_port, write_config};

/// The secret part of the channel's URL (a chat's incoming webhook puts its token in the path).
const TOKEN: &str = "T0SECRET/B0SECRET/xoxSecretToken";

#[test]
fn a_failing_slack_channel_never_shows_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let closed = free_port();
    let port = free_port();
    let (config, _) = write_config(dir.path(), port, "", "workers = 0");
    // `[[alerts]]` is an array of tables: after every top-level key.
    let channel = format!(
        "\n[[alerts]]\nname = \"chat\"\nkind = \"slack\"\n\
         url = \"http://127.0.0.1:{closed}/services/{TOKEN}\"\ntimeout_ms = 500\n\
         [[alerts.conditions]]\nkind = \"source_rejected\"\nthreshold = 1\nduration_seconds = 60\n"
    );
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}{channel}")).unwrap();
    let server = ServerProcess::start_with_env(
        dir.path(),
        &config,
        port,
        "server.log",
        crate::alerts::FAST_ENV,
    );
    let client = reqwest::blocking::Client::new();
    let r = client
        .post(format!("{}/webhooks/shop", server.base))
        .header("webhook-id", "bad-1")
        .header(
            "webhook-timestamp",
            webhook_inbox::domain::time::now_secs().to_string(),
        )
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    let db = dir.path().join("t.db");
    let deadline = Instant::now() + Duration::from_secs(20);
    let last_error = loop {
        let error: Option<String> = rusqlite::Connection::open(&db)
            .and_then(|c| {
                c.query_row(
                    "SELECT last_error FROM alert_notices WHERE last_error IS NOT NULL",
                    [],
                    |r| r.get(0),
                )
            })
            .ok();
        if let Some(error) = error {
            break error;
        }
        assert!(Instant::now() < deadline, "no failed attempt recorded");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!last_error.contains("services/"), "{last_error}");
    assert!(!last_error.contains("SECRET"), "{last_error}");
    let logs = server.logs();
    assert!(logs.contains("not sent"), "the failure is logged: {logs}");
    assert!(!logs.contains("SECRET"), "{logs}");
    drop(server);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let o = runtime.block_on(bare_cli(
        dir.path(),
        &["alerts", "test", "--config", "t.toml"],
        &[],
    ));
    assert_eq!(o.status.code(), Some(3));
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("chat: failed:"), "{out}");
    assert!(!out.contains("SECRET"), "{out}");
}
