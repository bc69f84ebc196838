//! `replay` output that scripts can use: physical line numbers in file order, a count of what
//! was not shown, honest `--json` counts with every failed line, `--rejects FILE` with the
//! original lines, and a refused connection said in words.

use serde_json::{Value, json};

use crate::cli_config::{bare_cli, stderr};
use crate::helpers::*;

/// A replay line for source `shop` (configured), with an order body.
fn good(event_id: &str) -> String {
    json!({"source": "shop", "event_id": event_id, "type": "order.completed",
           "body": order_body(event_id, "c-r", 1)})
    .to_string()
}

/// A line for a source the config does not know: refused before sending.
fn unknown(event_id: &str) -> String {
    json!({"source": "nowhere", "event_id": event_id, "type": "t", "body": "{}"}).to_string()
}

async fn replay(app: &TestApp, file: &str, extra: &[&str]) -> std::process::Output {
    std::fs::write(app.dir.path().join("inbox.toml"), test_config(&app.dir)).unwrap();
    let mut args = vec![
        "--config",
        "inbox.toml",
        "replay",
        file,
        "--url",
        &app.address,
    ];
    args.extend(extra);
    bare_cli(app.dir.path(), &args, &[]).await
}

#[tokio::test]
async fn replay_names_physical_lines_in_order_and_counts_what_it_did_not_show() {
    let app = spawn_app().await;
    // Line 1 good, line 2 blank, line 3 not JSON, then 14 lines for an unknown source with a
    // blank line among them: 15 problems, 10 shown.
    let mut lines = vec![good("r-1"), String::new(), "not json".into()];
    for i in 0..14 {
        if i == 7 {
            lines.push("   ".into());
        }
        lines.push(unknown(&format!("u-{i}")));
    }
    std::fs::write(app.dir.path().join("mixed.jsonl"), lines.join("\n") + "\n").unwrap();
    let o = replay(&app, "mixed.jsonl", &["--concurrency", "8"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("replayed 16 line(s)") && out.contains("1 queued, 0 duplicate, 15 rejected"),
        "{out}"
    );
    let err = stderr(&o);
    let shown: Vec<usize> = err
        .lines()
        .filter_map(|l| l.trim().strip_prefix("line "))
        .map(|l| l.split(':').next().unwrap().parse().unwrap())
        .collect();
    // Physical numbers: line 3 is the bad JSON; the blank line at 11 shifts the rest by one.
    assert_eq!(shown, [3, 4, 5, 6, 7, 8, 9, 10, 11 + 1, 13], "{err}");
    assert!(err.contains("line 3: not a replay line"), "{err}");
    assert!(err.contains("and 5 more"), "{err}");
    // The rate is a whole number per second.
    let rate = out
        .split(" s (")
        .nth(1)
        .unwrap()
        .split("/s")
        .next()
        .unwrap();
    assert!(rate.parse::<u64>().is_ok(), "{out}");
}

#[tokio::test]
async fn replay_json_counts_honestly_and_rejects_file_replays_as_it_was() {
    let app = spawn_app().await;
    app.deliver("shop", "seen", &order_body("seen", "c-r", 1))
        .await;
    let lines = [
        good("new-1"),
        unknown("u-1"),
        good("seen"),
        String::new(),
        "{\"source\":\"shop\"}".into(),
    ];
    std::fs::write(app.dir.path().join("in.jsonl"), lines.join("\n")).unwrap();
    let o = replay(&app, "in.jsonl", &["--json", "--rejects", "rejects.jsonl"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let mut v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let failed = v["failed"].take();
    assert_eq!(
        v,
        json!({"lines": 4, "sent": 2, "queued": 1, "duplicate": 1, "rejected": 2, "errors": 0,
               "failed": null, "stored_under_another_id": []})
    );
    let numbers: Vec<i64> = failed
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["line"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, [2, 5]);
    assert_eq!(failed[0]["result"], "rejected");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("nowhere"),
        "{failed}"
    );

    let rejects = std::fs::read_to_string(app.dir.path().join("rejects.jsonl")).unwrap();
    assert_eq!(rejects, format!("{}\n{}\n", lines[1], lines[4]));
    // Ready to replay again: the same two lines fail the same way, now as lines 1 and 2.
    let o = replay(&app, "rejects.jsonl", &["--json"]).await;
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["lines"].as_i64(), v["rejected"].as_i64()),
        (Some(2), Some(2))
    );
    assert_eq!(v["failed"][1]["line"], 2);
}

#[tokio::test]
async fn replay_to_a_stopped_server_says_connection_refused_and_sent_nothing() {
    let app = spawn_app().await;
    let lines: Vec<String> = (0..3).map(|i| good(&format!("x-{i}"))).collect();
    std::fs::write(app.dir.path().join("x.jsonl"), lines.join("\n")).unwrap();
    let dead = format!("http://127.0.0.1:{}", crate::process::free_port());
    std::fs::write(app.dir.path().join("inbox.toml"), test_config(&app.dir)).unwrap();
    let o = bare_cli(
        app.dir.path(),
        &[
            "--config",
            "inbox.toml",
            "replay",
            "x.jsonl",
            "--url",
            &dead,
            "--json",
        ],
        &[],
    )
    .await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["sent"].as_i64(), v["errors"].as_i64()),
        (Some(0), Some(3))
    );
    assert_eq!(
        v["failed"][0]["error"].as_str().unwrap(),
        format!(
            "connection refused: is the server running at {dead}? (set --url, \
             WEBHOOK_INBOX_URL or the config's `listen`)"
        )
    );
    assert_eq!(app.count("SELECT count(*) FROM events"), 0);
}

/// A Stripe line whose `event_id` is not its body's `id`: Stripe's scheme reads the id from the
/// body, so the server stores the body's id; replay says so for that line instead of counting
/// it as queued in silence.
#[tokio::test]
async fn replay_says_when_the_server_stored_a_line_under_the_bodys_id() {
    let app = spawn_app().await;
    let line = |event_id: &str, body_id: &str| {
        json!({"source": "stripe", "event_id": event_id, "type": "invoice.paid",
               "body": json!({"id": body_id, "type": "invoice.paid"}).to_string()})
        .to_string()
    };
    let lines = [line("evt_same", "evt_same"), line("evt_line", "evt_body")];
    std::fs::write(app.dir.path().join("stripe.jsonl"), lines.join("\n") + "\n").unwrap();
    let o = replay(&app, "stripe.jsonl", &[]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("line 2: stored as event id `evt_body`, not the line's `event_id`"),
        "{err}"
    );
    assert!(!err.contains("line 1:"), "{err}");
    assert_eq!(app.get("/events/stripe/evt_body").await.status, 200);
    let o = replay(&app, "stripe.jsonl", &["--json"]).await;
    let answer: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        answer["stored_under_another_id"],
        json!([{"line": 2, "event_id": "evt_body"}]),
        "{answer}"
    );
}
