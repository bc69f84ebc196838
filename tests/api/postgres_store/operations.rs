//! Operating the PostgreSQL store: a server that stops and comes back, wake-ups across nodes,
//! a SQLite database copied in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{InsertOutcome, Lane, Readiness, Store, StoreError};

use super::fresh::FreshDb;
use super::{ORDER, cluster, credit, finish, page, wait_until};
use crate::helpers::{new_delivery, order_body};

#[test]
fn postgres_readiness_and_writes_on_a_stopped_server_are_unavailable_and_recover() {
    let Some(server) = cluster::Cluster::start() else {
        return;
    };
    let store =
        webhook_inbox::store::postgres::PostgresStore::open(&server.url(), Default::default())
            .unwrap();
    store.migrate().unwrap();
    assert_eq!(store.ready().unwrap(), Readiness::Ready);
    server.stop();
    let started = Instant::now();
    assert!(matches!(store.ready(), Err(StoreError::Unavailable(_))));
    let delivery = new_delivery("shop", "evt-down", ORDER, "{}");
    assert!(matches!(
        store.insert_deliveries(std::slice::from_ref(&delivery)),
        Err(StoreError::Unavailable(_))
    ));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answers took {:?}: a wait is not bounded",
        started.elapsed()
    );
    server.start_again();
    // The pool replaces its dead connections by itself (bounded poll).
    wait_until(
        Duration::from_secs(15),
        "readiness after the restart",
        || matches!(store.ready(), Ok(Readiness::Ready)),
    );
    assert_eq!(
        store.insert_deliveries(&[delivery]).unwrap(),
        [InsertOutcome::Queued]
    );
}

#[test]
fn postgres_a_commit_that_queues_work_wakes_idle_consumers_on_another_node() {
    let Some(db) = FreshDb::create() else { return };
    let (listening, sending) = (db.migrated(), db.node());
    let wake = Arc::new(tokio::sync::Notify::new());
    listening.on_queued(Arc::clone(&wake));
    // Wait until the listener's LISTEN is in place (its first wake-up is then past).
    wait_until(Duration::from_secs(10), "the LISTEN connection", || {
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        ) == 1
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    for i in 0..3 {
        let woken = runtime.block_on(async {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            sending
                .insert_deliveries(&[new_delivery("shop", &format!("n-{i}"), ORDER, "{}")])
                .unwrap();
            tokio::time::timeout(Duration::from_secs(5), notified).await
        });
        assert!(woken.is_ok(), "delivery {i} woke nobody on the other node");
    }
}

#[test]
fn postgres_a_sqlite_database_copied_in_keeps_every_row_and_its_dedup() {
    use webhook_inbox::store::copy::{TABLES, copy_all};
    use webhook_inbox::store::sqlite::{SqliteOptions, SqliteStore};
    let Some(db) = FreshDb::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(&dir.path().join("s.db"), SqliteOptions::default()).unwrap();
    sqlite.migrate().unwrap();
    let batch: Vec<_> = (0..30)
        .map(|i| {
            new_delivery(
                "shop",
                &format!("e-{i}"),
                ORDER,
                &order_body(&format!("o-{}", i % 20), "c-1", 3),
            )
        })
        .collect();
    sqlite.insert_deliveries(&batch).unwrap();
    for c in sqlite
        .claim("w", Lane::InProcess, 30, 60_000, now_ms())
        .unwrap()
    {
        let order = format!("o-{}", c.claim.event_id[2..].parse::<usize>().unwrap() % 20);
        finish(&sqlite, &c, credit(&order, "c-1", 3));
    }
    let now = now_ms();
    sqlite.create_request("req-1", now).unwrap();
    let doc = webhook_inbox::store::NewDocument {
        id: "doc-1".into(),
        name: "a.pdf".into(),
        content_type: "application/pdf".into(),
        content: vec![0, 159, 146, 150],
    };
    sqlite.add_document("req-1", &doc, now).unwrap();
    sqlite.submit_request("req-1", now).unwrap();
    let pg = db.migrated();
    copy_all(&sqlite, pg.as_ref(), false, &mut |_, _, _| {}).unwrap();
    for table in TABLES {
        assert_eq!(
            pg.copy_out(table, &[], 10_000).unwrap(),
            sqlite.copy_out(table, &[], 10_000).unwrap(),
            "table {}",
            table.name
        );
    }
    let balance = sqlite.loyalty("c-1", page()).unwrap().balance;
    assert!(balance > 0);
    assert_eq!(pg.loyalty("c-1", page()).unwrap().balance, balance);
    // The copied keys go on deduplicating; a new event gets a seq after every copied one.
    assert_eq!(
        pg.insert_deliveries(&batch[..1]).unwrap(),
        [InsertOutcome::Duplicate]
    );
    pg.insert_deliveries(&[new_delivery("shop", "new", ORDER, "{}")])
        .unwrap();
    let newest = pg.event("shop", "new").unwrap().unwrap().event.seq;
    assert!(newest > db.scalar("SELECT max(seq) FROM events WHERE event_id <> 'new'"));
}

/// A copy into PostgreSQL never adds to what a node serves or filled: seen before, a copy into
/// a database where a live node had ingested one event lost a copied event whose credit was
/// copied (balance 3,000 against credits of 3,030). Refused while the node holds the database,
/// and after it stopped, because its event is not the source's; nothing changes either time.
#[test]
fn postgres_a_copy_never_adds_to_a_database_a_node_serves_or_filled() {
    use webhook_inbox::store::Holder;
    use webhook_inbox::store::copy::copy_all;
    use webhook_inbox::store::sqlite::{SqliteOptions, SqliteStore};
    let Some(db) = FreshDb::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(&dir.path().join("s.db"), SqliteOptions::default()).unwrap();
    sqlite.migrate().unwrap();
    let batch: Vec<_> = (0..3)
        .map(|i| new_delivery("shop", &format!("e-{i}"), ORDER, "{}"))
        .collect();
    sqlite.insert_deliveries(&batch).unwrap();
    let pg = db.migrated();

    let node = pg.hold(Holder::Node).unwrap().expect("a node may serve it");
    assert!(pg.hold(Holder::Node).unwrap().is_some(), "nodes share it");
    let live = new_delivery("shop", "live-1", ORDER, &order_body("live-o", "c-1", 1_000));
    pg.insert_deliveries(&[live]).unwrap();
    let err = format!(
        "{:#}",
        copy_all(&sqlite, pg.as_ref(), true, &mut |_, _, _| {}).unwrap_err()
    );
    assert!(
        err.contains("in use by a running webhook-inbox node"),
        "{err}"
    );
    drop(node);

    let err = format!(
        "{:#}",
        copy_all(&sqlite, pg.as_ref(), true, &mut |_, _, _| {}).unwrap_err()
    );
    assert!(err.contains("event_log row (1) differs"), "{err}");
    assert_eq!(db.scalar("SELECT count(*) FROM events"), 1);

    // A copy holds the database alone: no node starts on it meanwhile.
    let copying = pg.hold(Holder::Copy).unwrap().expect("nobody holds it now");
    assert!(pg.hold(Holder::Node).unwrap().is_none());
    assert!(pg.hold(Holder::Copy).unwrap().is_none());
    drop(copying);
    assert!(pg.hold(Holder::Node).unwrap().is_some());
}

/// The copy's table list is PostgreSQL's whole schema too (as the SQLite store's unit test
/// checks its own): a migration that adds a table or a column fails here until
/// `store::copy::TABLES` names it, or it is listed below as not copied.
#[test]
fn postgres_the_copy_names_every_table_and_column_of_the_schema() {
    use std::collections::BTreeSet;
    use webhook_inbox::store::copy::TABLES;
    let Some(db) = FreshDb::create() else { return };
    db.migrated();
    // Each the target's own, set or rebuilt by the copy, or a view of copied tables.
    let not_copied = [
        "copy_in_progress",
        "queue_cursor",
        "subscription_registry",
        "nodes",
        "schema_migrations",
        "events",
    ];
    let mut client = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let columns: Vec<(String, String)> = client
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns
              WHERE table_schema = current_schema()",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .filter(|(t, _): &(String, String)| !not_copied.contains(&t.as_str()))
        .collect();
    let tables: BTreeSet<&str> = columns.iter().map(|(t, _)| t.as_str()).collect();
    let named: BTreeSet<&str> = TABLES.iter().map(|t| t.name).collect();
    assert_eq!(tables, named);
    for table in TABLES {
        let held: BTreeSet<&str> = columns
            .iter()
            .filter(|(t, _)| t == table.name)
            .map(|(_, c)| c.as_str())
            .collect();
        let copied: BTreeSet<&str> = table.columns.iter().copied().collect();
        assert_eq!(held, copied, "{}", table.name);
    }
}
