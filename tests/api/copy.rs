//! `webhook-inbox copy`, run as a process: a whole database moved into another store, then
//! compared table by table with SQL of its own (not through the copy's code).

use std::path::Path;
use std::process::{Command, Output};

use rusqlite::types::Value;

use crate::harness::new_delivery;
use crate::helpers::*;
use crate::requests::{create, doc};

pub fn copy(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .arg("copy")
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// (customer, seq, order) of every credit in the customers' listings, both parts.
fn listed_credits(path: &Path) -> Vec<(String, i64, String)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.prepare(
        "SELECT customer_id, seq, order_id FROM loyalty_customer_credits
         UNION ALL
         SELECT customer_id, seq, order_id FROM loyalty_unlisted_credits
         ORDER BY 1, 2, 3",
    )
    .unwrap()
    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// Every row of every table of a SQLite file, in key order, as SQLite stores it; not the
/// tables derived from the others and rebuilt by the copy (the two parts of the customers'
/// credit listings: compared by `listed_credits`), nor the copy's own mark, nor what is the
/// target's own (the registry's nodes and version).
pub fn dump(path: &Path) -> Vec<(String, Vec<Vec<Value>>)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let tables: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'
               AND name <> 'schema_migrations'
               AND name NOT IN ('loyalty_customer_credits', 'loyalty_unlisted_credits',
                                'copy_in_progress', 'nodes', 'subscription_registry')
             ORDER BY name",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    tables
        .into_iter()
        .map(|table| {
            let width = conn
                .prepare(&format!("SELECT * FROM {table}"))
                .unwrap()
                .column_count();
            let order = (1..=width.min(3))
                .map(|i| i.to_string())
                .collect::<Vec<_>>();
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT * FROM {table} ORDER BY {}",
                    order.join(", ")
                ))
                .unwrap();
            let rows = stmt
                .query_map([], |r| (0..width).map(|i| r.get::<_, Value>(i)).collect())
                .unwrap()
                .collect::<Result<Vec<Vec<Value>>, _>>()
                .unwrap();
            (table, rows)
        })
        .collect()
}

/// `dump` of two files is the same, or the first table that differs is named.
pub fn assert_same_rows(a: &Path, b: &Path) {
    let (a, b) = (dump(a), dump(b));
    for ((table, rows), (other, theirs)) in a.iter().zip(&b) {
        assert_eq!(table, other);
        assert!(rows == theirs, "{table}: {rows:?}\n!=\n{theirs:?}");
    }
    assert_eq!(a.len(), b.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_database_holds_every_row_of_every_table() {
    let app = spawn_app().await;
    // More rows than one page of the copy (1,000) in the events, bodies, history and guards.
    let batch: Vec<_> = (0..1_200)
        .map(|i| {
            let body = order_body(&format!("o-{}", i % 1_100), &format!("c-{}", i % 7), 3);
            new_delivery("shop", &format!("e-{i}"), "order.completed", &body)
        })
        .collect();
    let store = app.store.clone();
    tokio::task::spawn_blocking(move || store.insert_deliveries(&batch).unwrap())
        .await
        .unwrap();
    app.deliver("shop", "no-order", r#"{"type":"order.completed"}"#)
        .await;
    let id = create(&app).await;
    let r = app
        .post(
            &format!("/requests/{id}/documents"),
            Some(SUBMIT_TOKEN),
            Some(doc("a.txt")),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    app.drain().await;
    let failed = app.event("shop", "no-order").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    // A refused delivery, kept for ops once the background writer has it.
    crate::rejected_log::unknown_source(&app, "refused").await;
    for _ in 0..200 {
        if app.count("SELECT count(*) FROM rejections") == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    let source = app.dir.path().join("inbox.db");
    let before = dump(&source);
    let o = copy(
        app.dir.path(),
        &["--from", "sqlite://inbox.db", "--to", "sqlite://copy.db"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("event_log") && out.contains("1201 rows"),
        "{out}"
    );

    let after = dump(&app.dir.path().join("copy.db"));
    assert_eq!(before.len(), 14, "every table of the schema");
    // A database served by the implicit subscriptions with no alerts has none of these rows
    // (tests/api/copy_registry.rs fills them).
    let none = ["subscription_secrets", "alert_state", "alert_notices"];
    for ((table, rows), (copied_table, copied)) in before.iter().zip(&after) {
        assert_eq!(table, copied_table);
        assert!(
            none.contains(&table.as_str()) || !rows.is_empty(),
            "{table} has rows to copy"
        );
        assert_eq!(rows.len(), copied.len(), "{table}: row count");
        assert!(rows == copied, "{table}: rows differ");
    }
    // The customers' credit listings (derived, rebuilt after the copy: every credit is
    // listed once, in one part or the other) are the source's.
    let credits: i64 = rusqlite::Connection::open(&source)
        .unwrap()
        .query_row("SELECT count(*) FROM loyalty_credits", [], |r| r.get(0))
        .unwrap();
    assert_eq!(listed_credits(&source).len() as i64, credits);
    assert_eq!(
        listed_credits(&source),
        listed_credits(&app.dir.path().join("copy.db"))
    );
    // The source is read, never changed.
    assert!(dump(&source) == before);

    // A second copy into the filled database is refused, naming what it holds...
    let o = copy(
        app.dir.path(),
        &["--from", "sqlite://inbox.db", "--to", "sqlite://copy.db"],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not empty") && err.contains("event_log"),
        "{err}"
    );
    // ...unless told: then rows already there are skipped, none doubled.
    let o = copy(
        app.dir.path(),
        &[
            "--from",
            "sqlite://inbox.db",
            "--to",
            "sqlite://copy.db",
            "--allow-non-empty",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(dump(&app.dir.path().join("copy.db")) == before);
}

#[test]
fn a_copy_refuses_a_missing_source_and_the_same_database_twice() {
    let dir = tempfile::tempdir().unwrap();
    let o = copy(
        dir.path(),
        &["--from", "sqlite://none.db", "--to", "sqlite://b.db"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"));
    assert!(!dir.path().join("b.db").exists(), "nothing created");
    let o = copy(
        dir.path(),
        &["--from", "sqlite://a.db", "--to", "sqlite://a.db"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("same database"));
    let o = copy(
        dir.path(),
        &["--from", "sqlite://a.db", "--to", "mysql://u:secret@h/db"],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--to") && !err.contains("secret"), "{err}");
}

/// A copy taken with a backlog: the copy counts it and drains all of it (the queue's cursors
/// and counts are rebuilt for the rows copied in, not carried over or left at their start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_taken_with_a_backlog_counts_it_and_drains_all_of_it() {
    let app = spawn_app().await;
    let batch: Vec<_> = (0..300)
        .map(|i| {
            let body = order_body(&format!("o-{i}"), "c-1", 1);
            new_delivery("shop", &format!("e-{i}"), "order.completed", &body)
        })
        .collect();
    let store = app.store.clone();
    tokio::task::spawn_blocking(move || store.insert_deliveries(&batch).unwrap())
        .await
        .unwrap();
    let r = app
        .post("/events/run?limit=100", Some(ADMIN_TOKEN), None)
        .await;
    let done = r.body["claimed"].as_i64().unwrap();
    assert!((1..300).contains(&done), "{}", r.body);

    let target = tempfile::tempdir().unwrap();
    let to = format!("sqlite://{}", target.path().join("inbox.db").display());
    let o = copy(
        app.dir.path(),
        &["--from", "sqlite://inbox.db", "--to", &to],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let config = test_config(&target);
    let copied = spawn_in(target, &config, Default::default()).await;
    let stats = copied.get("/events/stats").await.body;
    assert_eq!(stats["counts"]["pending"], 300 - done, "{stats}");
    assert_eq!(stats["counts"]["completed"], done, "{stats}");
    copied.drain().await;
    let stats = copied.get("/events/stats").await.body;
    assert_eq!(stats["counts"]["pending"], 0, "{stats}");
    assert_eq!(stats["counts"]["completed"], 300, "{stats}");
    let r = copied.get("/loyalty/c-1").await;
    assert_eq!(r.body["balance"], 300, "{}", r.body);
}

/// A database of three completed orders of one customer, `points` each (event and order ids
/// prefixed by `tag`), its server stopped.
async fn orders_db(tag: &str, points: i64) -> tempfile::TempDir {
    let app = spawn_app().await;
    for i in 1..=3 {
        let body = order_body(&format!("{tag}-o-{i}"), "c-1", points);
        let r = app.deliver("shop", &format!("{tag}-e-{i}"), &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    app.drain().await;
    assert_eq!(app.balance("c-1").await, 3 * points);
    app.stop().await
}

/// Two databases of three orders each for one customer: added to the other, every event of
/// the source has a `seq` the target holds, and a balance row for the same customer. Skipping
/// those rows as "already there" lost all three events and their credit (seen: exit 0, balance
/// 30 instead of 330): refused, naming the row, the target unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_refuses_to_add_another_databases_rows_and_changes_nothing() {
    let (a, b) = (orders_db("a", 10).await, orders_db("b", 100).await);
    let target = b.path().join("inbox.db");
    let before = dump(&target);
    let from = format!("sqlite://{}", a.path().join("inbox.db").display());
    let to = format!("sqlite://{}", target.display());
    let o = copy(
        a.path(),
        &["--from", &from, "--to", &to, "--allow-non-empty"],
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not this source's") && err.contains("event_log row (1)"),
        "{err}"
    );
    assert!(dump(&target) == before, "the target is unchanged");
}

/// An interrupted copy (here: one page of events written) is resumed by running it again with
/// `--allow-non-empty`: the rows it holds are the source's, skipped and counted as such, and
/// the rest written. A row changed since in the target is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_copy_resumes_and_counts_rows_written_and_skipped() {
    use webhook_inbox::store::Store as _;
    use webhook_inbox::store::copy::{PAGE, TABLES};
    let log = TABLES.iter().find(|t| t.name == "event_log").unwrap();
    use webhook_inbox::store::sqlite::{SqliteOptions, SqliteStore};
    let app = spawn_app().await;
    let batch: Vec<_> = (0..PAGE + 20)
        .map(|i| new_delivery("shop", &format!("e-{i}"), "order.completed", "{}"))
        .collect();
    let store = app.store.clone();
    tokio::task::spawn_blocking(move || store.insert_deliveries(&batch).unwrap())
        .await
        .unwrap();
    app.drain().await;
    let dir = app.stop().await;
    let (source, target) = (dir.path().join("inbox.db"), dir.path().join("copy.db"));
    {
        let from = SqliteStore::open(&source, SqliteOptions::default()).unwrap();
        let to = SqliteStore::open(&target, SqliteOptions::default()).unwrap();
        to.migrate().unwrap();
        // What a copy killed after its first page leaves: its mark, and that page.
        to.mark_copy(Some(1_000)).unwrap();
        let first_page = from.copy_out(log, &[], PAGE).unwrap();
        assert_eq!(to.copy_in(log, &first_page).unwrap(), PAGE as u64);
    }
    // No node starts on the half-filled database, also with no copy running any more.
    let copied_config = test_config(&dir).replace("inbox.db\"", "copy.db\"");
    let settings = webhook_inbox::config::Settings::from_toml(&copied_config, "t", vec![]).unwrap();
    let refused = webhook_inbox::startup::Application::build(settings, Default::default());
    let err = format!(
        "{:#}",
        refused
            .err()
            .expect("a node refuses a half-filled database")
    );
    assert!(
        err.contains("did not finish") && err.contains("--allow-non-empty"),
        "{err}"
    );
    let args = [
        "--from",
        "sqlite://inbox.db",
        "--to",
        "sqlite://copy.db",
        "--allow-non-empty",
    ];
    let o = copy(dir.path(), &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = format!(
        "  {:20} {:>10} rows written, {:>10} already there",
        "event_log", 20, 1000
    );
    assert!(out.contains(&line), "{out}");
    assert!(dump(&target) == dump(&source));
    // Finished: the mark is gone and a node starts on it.
    let node = spawn_in(dir, &copied_config, Default::default()).await;
    assert_eq!(node.get("/events?limit=1").await.status, 200);
    let dir = node.stop().await;

    // A row the source no longer has as the target holds it: not a resume any more.
    rusqlite::Connection::open(&target)
        .unwrap()
        .execute("UPDATE event_state SET attempts = 7 WHERE seq = 5", [])
        .unwrap();
    let o = copy(dir.path(), &args);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("event_state row (5, 1) differs"), "{err}");
}

/// A node serving the target keeps a copy out (its ingest and claims would race the copy for
/// the same keys), and a copy filling a database keeps a node from starting on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_and_a_node_never_share_a_database() {
    use webhook_inbox::startup::{Application, BuildOptions};
    use webhook_inbox::store::Holder;
    let source = orders_db("a", 10).await;
    let app = spawn_app().await;
    let from = format!("sqlite://{}", source.path().join("inbox.db").display());
    let o = copy(
        app.dir.path(),
        &["--from", &from, "--to", "sqlite://inbox.db"],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("in use by a running webhook-inbox node"),
        "{err}"
    );
    // Named through another path (a symlink to the file), it is the same database.
    let alias = source.path().join("alias.db");
    std::os::unix::fs::symlink(app.dir.path().join("inbox.db"), &alias).unwrap();
    let to = format!("sqlite://{}", alias.display());
    let o = copy(app.dir.path(), &["--from", &from, "--to", &to]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("in use"));

    let dir = app.stop().await;
    let config = test_config(&dir);
    let settings = webhook_inbox::config::Settings::from_toml(&config, "test", vec![]).unwrap();
    let copying = webhook_inbox::startup::open_store(&settings).unwrap();
    let held = copying
        .hold(Holder::Copy)
        .unwrap()
        .expect("no node holds it now");
    let refused = Application::build(settings.clone(), BuildOptions::default());
    let err = format!(
        "{:#}",
        refused.err().expect("a node does not start meanwhile")
    );
    assert!(err.contains("copy` into this database is running"), "{err}");
    drop(held);
    let app = spawn_in(dir, &config, BuildOptions::default()).await;
    assert_eq!(app.balance("c-1").await, 0);
}

/// Nodes and copies starting at once, released through a barrier: either every node that got
/// its share runs with no copy, or the one copy runs alone; never a copy beside a node, never
/// two copies (both stores: flock on SQLite, advisory locks on PostgreSQL).
fn a_copy_and_nodes_starting_at_once_never_overlap(kind: crate::stores::StoreKind) {
    use std::sync::Barrier;
    use webhook_inbox::store::Holder;
    let dir = tempfile::tempdir().unwrap();
    let db = crate::stores::TestDb::create(kind, dir.path());
    let store = db.open_store();
    for round in 0..5 {
        let barrier = Barrier::new(8);
        let held: Vec<(Holder, bool)> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let (store, barrier) = (&store, &barrier);
                    s.spawn(move || {
                        let holder = if i % 4 == round % 4 {
                            Holder::Copy
                        } else {
                            Holder::Node
                        };
                        barrier.wait();
                        let hold = store.hold(holder).unwrap();
                        // Keep what was taken until every thread has tried.
                        barrier.wait();
                        (holder, hold.is_some())
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let copies = held
            .iter()
            .filter(|(h, got)| *h == Holder::Copy && *got)
            .count();
        let nodes = held
            .iter()
            .filter(|(h, got)| *h == Holder::Node && *got)
            .count();
        assert!(
            copies <= 1,
            "round {round}: {copies} copies at once: {held:?}"
        );
        assert!(
            copies == 0 || nodes == 0,
            "round {round}: a copy beside {nodes} nodes: {held:?}"
        );
        assert!(copies + nodes > 0, "round {round}: nobody got it: {held:?}");
    }
}

crate::stores::store_tests!(a_copy_and_nodes_starting_at_once_never_overlap);

/// A wrong PostgreSQL password on either side: the error names that side (`--from` or `--to`)
/// and says the cause once. Seen failing before the change: no side named, and the server's
/// message repeated down the cause chain.
#[test]
fn a_wrong_postgres_password_names_the_side_once() {
    let Ok(url) = std::env::var("TEST_POSTGRES_URL") else {
        eprintln!("SKIPPED: no TEST_POSTGRES_URL (scripts/with-postgres provides one)");
        return;
    };
    let parsed = reqwest::Url::parse(&url).unwrap();
    let mut wrong = parsed.clone();
    wrong.set_password(Some("not-the-password")).unwrap();
    let wrong = wrong.to_string();
    let dir = tempfile::tempdir().unwrap();
    let source = format!("sqlite://{}", dir.path().join("src.db").display());
    // A source that exists.
    rusqlite::Connection::open(dir.path().join("src.db")).unwrap();
    for (args, side) in [
        (
            vec!["--from", source.as_str(), "--to", wrong.as_str()],
            "--to",
        ),
        (
            vec!["--from", wrong.as_str(), "--to", source.as_str()],
            "--from",
        ),
    ] {
        let out = copy(dir.path(), &args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains(side), "{side} in: {err}");
        assert!(
            !err.contains("not-the-password"),
            "the password printed: {err}"
        );
        let auth = err.matches("password authentication failed").count();
        assert_eq!(auth, 1, "said once: {err}");
    }
}
