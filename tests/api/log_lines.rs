//! The log cannot be forged from outside: a value an outsider chose (an event's type here; an
//! endpoint's answer and anything else logged go through the same formatter) is written with
//! its control characters escaped, so it never starts a line of its own, in either format.

use std::time::Duration;

use crate::helpers::ADMIN_TOKEN;
use crate::process::{ServerProcess, free_port, send_signed, write_config};

const FORGED: &str = "2026-12-05T23:00:00.000000Z ERROR webhook_inbox::auth: forged admin login";

/// Run the binary with `log_format`, deliver an event whose type carries a newline, a carriage
/// return and an escape sequence before a forged line, have it handled (the audit log writes
/// its type), and answer the log.
fn log_after_a_forged_type(format: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (config, settings) = write_config(
        dir.path(),
        port,
        &format!("log_format = \"{format}\""),
        "workers = 0",
    );
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let body =
        serde_json::json!({ "type": format!("a.b\n{FORGED}\r\n\u{1b}[2K{FORGED}") }).to_string();
    assert_eq!(
        send_signed(&client, &server.base, &settings, "forge-1", &body),
        200
    );
    let run = client
        .post(format!("{}/events/run?limit=10", server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap();
    assert_eq!(run.status(), 200);
    // The audit line is written as the event is handled, before the answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let logs = server.logs();
        if logs.contains("forged admin login") {
            return logs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no audit line:\n{logs}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_event_type_cannot_forge_a_text_log_line() {
    let logs = log_after_a_forged_type("text");
    for line in logs.lines().filter(|l| l.contains("forged")) {
        assert!(
            line.contains("event received") && !line.contains('\u{1b}'),
            "a forged line in the log: {line:?}\n{logs}"
        );
    }
    assert!(logs.contains(r"a.b\n2026-12-05"), "{logs}");
}

#[test]
fn an_event_type_cannot_forge_a_json_log_line() {
    let logs = log_after_a_forged_type("json");
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let parsed: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{logs}"));
        if line.contains("forged") {
            assert_eq!(parsed["fields"]["message"], "event received", "{line}");
        }
    }
}
