//! What the example consumers' tests share (`examples/nats_consumer.py`,
//! `examples/amqp_consumer.py`): each run as a user would run it, SIGKILLed mid-stream and
//! started again, stopped with SIGTERM, and its database checked: each order credited once.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::exit_within;

/// An example consumer, `examples/{script}` run by `python` with `args` and `--db db` as a user
/// would run it, its stderr appended to `log` (one log across its restarts).
pub fn example_consumer(python: &str, script: &str, args: &[&str], db: &Path, log: &Path) -> Child {
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(script);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(python)
        .arg(&example)
        .args(args)
        .arg("--db")
        .arg(db)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("run examples/{script}: {e}"))
}

/// How many messages an example consumer has recorded (0 before it made its database).
pub fn processed(db: &Path) -> i64 {
    let Ok(conn) = rusqlite::Connection::open(db) else {
        return 0;
    };
    conn.query_row("SELECT count(*) FROM processed_messages", [], |r| r.get(0))
        .unwrap_or(0)
}

/// Run the consumer `start` makes `kills` times, each SIGKILLed once it has recorded a further
/// share of `events` (each run bounded to 60 s): a kill lands while it works, with messages
/// taken and not acked, or committed and not acked.
pub async fn consume_through_kills(
    start: impl Fn() -> Child,
    db: &Path,
    events: i64,
    kills: usize,
    logs: impl Fn() -> String,
) {
    let kills = kills as i64;
    for kill in 0..kills {
        let mut child = start();
        let goal = (kill + 1) * events / (kills + 2);
        let deadline = Instant::now() + Duration::from_secs(60);
        while processed(db) < goal {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the consumer exited ({status}): {}", logs());
            }
            assert!(Instant::now() < deadline, "no progress: {}", logs());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// SIGTERM to an example consumer: it stops within 15 s, and cleanly.
pub fn stop_consumer(child: &mut Child, logs: impl Fn() -> String) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = tokio::task::block_in_place(|| {
        exit_within(child, Duration::from_secs(15), "the consumer on SIGTERM")
    });
    assert!(status.success(), "{status}: {}", logs());
}

/// What an example consumer's database holds after the examples' tests (20 orders of 10 points
/// from the subscription, 4 of them again under a second event id, and `more` orders of 1 point
/// published beside them): each message recorded once, whatever the copies and redeliveries,
/// and each order credited once.
pub fn assert_credited_once(db: &Path, more: i64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    let recorded = count("SELECT count(*) FROM processed_messages");
    assert_eq!(recorded, 24 + more, "messages lost or recorded twice");
    let business = "SELECT count(*) FROM processed_messages WHERE outcome = 'business_duplicate'";
    assert_eq!(count(business), 4);
    assert_eq!(count("SELECT count(*) FROM loyalty_credits"), 20 + more);
    assert_eq!(
        count("SELECT sum(balance) FROM loyalty_balances"),
        200 + more
    );
    let c0 = "SELECT balance FROM loyalty_balances WHERE customer_id = 'c0'";
    assert_eq!(count(c0), 50 + more / 4);
}
