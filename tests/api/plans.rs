//! The SQL the consumer side runs at every batch and every scrape: query plans that must use
//! the partial indexes, statements that must not be planned again, and the ingest writer's
//! signal that ingest is active.

use webhook_inbox::store::Store;

use crate::harness::{Harness, new_delivery};
use crate::helpers::*;

/// The lines of `EXPLAIN QUERY PLAN` for `sql` on the harness's database.
pub(crate) fn query_plan(h: &Harness, sql: &str, params: impl rusqlite::Params) -> Vec<String> {
    let conn = rusqlite::Connection::open(h.dir.path().join("inbox.db")).unwrap();
    conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(params, |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The fan-out statement over the implicit subscriptions.
fn fan_out(h: &Harness) -> String {
    let conn = rusqlite::Connection::open(h.dir.path().join("inbox.db")).unwrap();
    webhook_inbox::store::sqlite::fan_out_statement(&conn).unwrap()
}

#[test]
fn the_claim_query_uses_the_partial_index_on_due_pending_events() {
    let h = Harness::new(5, 30);
    // The implicit subscriptions: loyalty and audit (in-process), downstream (call-out).
    for sub in [1, 2, 3] {
        let plan = query_plan(
            &h,
            &webhook_inbox::store::sqlite::claim_sql(sub, 5),
            rusqlite::params!["w", 0, 0],
        );
        assert!(plan.iter().any(|p| p.contains("events_due")), "{plan:?}");
        assert!(
            !plan.iter().any(|p| p.contains("TEMP B-TREE")),
            "the claim sorts: {plan:?}"
        );
    }
}

/// First attempts are fanned out in `seq` order after the cursor: a range of the log's rowid,
/// never a scan of the log or a sort, however long the log is.
#[test]
fn the_fan_out_reads_a_range_of_the_log_after_the_cursor() {
    let h = Harness::new(5, 30);
    let plan = query_plan(&h, &fan_out(&h), rusqlite::params!["w", 0, 0, 5, "nonce"]);
    assert!(
        plan.iter()
            .any(|p| p.contains("SEARCH l USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)")),
        "{plan:?}"
    );
    assert!(
        !plan
            .iter()
            .any(|p| p.contains("TEMP B-TREE") || p.trim_end() == "SCAN l"),
        "{plan:?}"
    );
}

/// The same with filters: subscriptions that share a filter read the log once for all of them,
/// and the arms still merge in `(seq, sub)` order without a sort.
#[test]
fn a_filtered_fan_out_reads_a_range_of_the_log_and_sorts_nothing() {
    use webhook_inbox::subscriptions::{Kind, filter::Filter};
    let h = Harness::new(5, 30);
    let filter = |v: serde_json::Value| Some(Filter::parse(&v).unwrap());
    let shared = serde_json::json!({"all": [{"path": "/data/customer_id", "prefix": "cust-"},
                                            {"path": "/data/points", "gte": 1}]});
    let subs = [
        webhook_inbox::subscriptions::Subscription {
            filter: filter(shared.clone()),
            ..test_subscription("a", Kind::Audit)
        },
        webhook_inbox::subscriptions::Subscription {
            filter: filter(shared),
            ..test_subscription("b", Kind::LoyaltyCredit)
        },
        webhook_inbox::subscriptions::Subscription {
            filter: filter(serde_json::json!({"path": "/type", "exists": true})),
            ..test_subscription("c", Kind::Audit)
        },
        test_subscription("d", Kind::Audit),
    ];
    h.store
        .sync_subscriptions(&subs, webhook_inbox::domain::time::now_ms())
        .unwrap();
    let sql = fan_out(&h);
    let plan = query_plan(&h, &sql, rusqlite::params!["w", 0, 0, 5, "nonce"]);
    let ranges = plan
        .iter()
        .filter(|p| p.contains("SEARCH l USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"))
        .count();
    // Two arms (claimed, pending) for the shared filter, two for `c`, two for `d`.
    assert_eq!(ranges, 6, "{plan:?}");
    assert!(
        !plan
            .iter()
            .any(|p| p.contains("TEMP B-TREE") || p.trim_end() == "SCAN l"),
        "{plan:?}"
    );
}

/// `/metrics` reads the status counts at every scrape: they must not scan the event history
/// (a GROUP BY over a table of millions of completed events costs a second per scrape).
#[test]
fn the_status_counts_read_only_the_partial_indexes() {
    let h = Harness::new(5, 30);
    let plan = query_plan(&h, webhook_inbox::store::sqlite::STATUS_COUNTS, []);
    for index in ["events_due", "events_leases", "events_failed"] {
        assert!(plan.iter().any(|p| p.contains(index)), "{index}: {plan:?}");
    }
    assert!(
        !plan.iter().any(|p| p.contains("TEMP B-TREE")
            || p.trim_end() == "SCAN event_state"
            || p.trim_end() == "SCAN event_log"),
        "{plan:?}"
    );
    // And they add up, on every status.
    let counts = |h: &Harness| h.store.status_counts().unwrap();
    assert_eq!(counts(&h).pending + counts(&h).completed, 0);
    h.insert(&[
        ("shop", "a", "order.completed", order_body("o-1", "c-1", 1)),
        ("shop", "b", "customer.created", "{}".into()),
    ]);
    let c = counts(&h);
    assert_eq!((c.pending, c.claimed, c.completed, c.failed), (2, 0, 0, 0));
    assert!(c.oldest_due_at.is_some());
    h.drain();
    let c = counts(&h);
    assert_eq!((c.pending, c.claimed, c.completed, c.failed), (0, 0, 2, 0));
    assert_eq!(c.oldest_due_at, None);
}

/// The claim runs for every batch: binding new values must not make SQLite parse and plan it
/// again (a bound LIMIT does; the limit is in the text for that reason).
#[test]
fn the_claim_statement_is_not_prepared_again_at_each_claim() {
    let h = Harness::new(5, 30);
    let conn = rusqlite::Connection::open(h.dir.path().join("inbox.db")).unwrap();
    let mut claim = conn
        .prepare(&webhook_inbox::store::sqlite::claim_sql(1, 5))
        .unwrap();
    for now in 1..=3_i64 {
        let mut rows = claim.query(rusqlite::params!["w", now + 30, now]).unwrap();
        while rows.next().unwrap().is_some() {}
    }
    assert_eq!(claim.get_status(rusqlite::StatementStatus::RePrepare), 0);
    let mut first = conn.prepare(&fan_out(&h)).unwrap();
    for now in 1..=3_i64 {
        let mut rows = first
            .query(rusqlite::params!["w", now + 30, 0, 5, "nonce"])
            .unwrap();
        while rows.next().unwrap().is_some() {}
    }
    assert_eq!(first.get_status(rusqlite::StatementStatus::RePrepare), 0);
}

/// Consumers hold back while deliveries are being stored: the ingest writer says so for a
/// moment after each commit, and not otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingest_writer_reports_recent_commits_for_a_moment_only() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use webhook_inbox::ingest::{IngestOptions, Ingestor};

    let h = Harness::new(5, 30);
    let store: Arc<dyn Store> = h.store.clone();
    let ingest = Ingestor::start(store, IngestOptions::default(), Arc::default());
    let activity = ingest.activity();
    assert!(!activity.recent(), "nothing stored yet");
    // While deliveries keep coming, the signal is seen (polled between them, bounded: on a
    // loaded machine one answer can arrive after the window has closed, not all of them).
    let mut seen = false;
    for i in 0..200 {
        ingest
            .ingest(new_delivery(
                "shop",
                &format!("e-{i}"),
                "customer.created",
                "{}",
            ))
            .await
            .unwrap();
        if activity.recent() {
            seen = true;
            break;
        }
    }
    assert!(seen, "ingest commits were never reported");
    // A pause in ingest ends it (polled, bounded).
    let deadline = Instant::now() + Duration::from_secs(5);
    while activity.recent() {
        assert!(Instant::now() < deadline, "still active after a pause");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Consumer commits do not count as ingest.
    h.drain();
    assert!(!activity.recent());
}

/// `GET /events` pages newest first through the `events` view: the page must be read in
/// `seq` order from the log, each event's state found by its key, not sorted from the whole
/// history. Filtered by source too: the log's key starts with the event id (migration 25), so
/// the source's events are not gathered through the key and sorted for each page.
#[test]
fn listing_events_newest_first_sorts_nothing() {
    let h = Harness::new(5, 30);
    for sql in [
        "SELECT seq, status FROM events WHERE purged_at IS NULL ORDER BY seq DESC LIMIT 50",
        "SELECT seq, status FROM events WHERE purged_at IS NULL AND source = 'shop'
          ORDER BY seq DESC LIMIT 50",
        "SELECT seq, status, payload FROM events JOIN event_payloads USING (seq)
          WHERE purged_at IS NULL ORDER BY seq DESC LIMIT 50",
    ] {
        let plan = query_plan(&h, sql, []);
        assert!(!plan.iter().any(|p| p.contains("TEMP B-TREE")), "{plan:#?}");
        assert!(plan.iter().any(|p| p.trim_end() == "SCAN l"), "{plan:#?}");
        assert!(
            plan.iter()
                .any(|p| p.contains("sqlite_autoindex_event_state_1 (seq=?)")),
            "{plan:#?}"
        );
    }
}

/// The `batch`th group of 250 `order.completed` deliveries (events `e-{n}`, orders `o-{n}`).
fn orders(batch: usize) -> Vec<webhook_inbox::store::NewDelivery> {
    (0..250)
        .map(|i| {
            let n = batch * 250 + i;
            new_delivery(
                "shop",
                &format!("e-{n}"),
                "order.completed",
                &order_body(&format!("o-{n}"), "c-1", 1),
            )
        })
        .collect()
}

/// `EXPLAIN [options] EXECUTE` of `sql` prepared with `args` after `settings` (`SET LOCAL`s)
/// (the client runs a runtime of its own: off the test's thread). With `ANALYZE` in `options`
/// the statement runs, in a transaction rolled back after it.
pub(crate) fn pg_plan(url: &str, settings: &str, options: &str, sql: &str, args: &str) -> String {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
            c.batch_execute(&format!("BEGIN; {settings}; PREPARE p AS {sql}"))
                .unwrap();
            let args = if args.is_empty() {
                String::new()
            } else {
                format!("({args})")
            };
            let mut explained = String::new();
            for message in c
                .simple_query(&format!("EXPLAIN {options} EXECUTE p{args}"))
                .unwrap()
            {
                if let postgres::SimpleQueryMessage::Row(r) = message {
                    explained.push_str(r.get(0).unwrap_or(""));
                    explained.push('\n');
                }
            }
            c.batch_execute("ROLLBACK").unwrap();
            explained
        })
        .join()
        .unwrap()
    })
}

/// On PostgreSQL, the plans a node's prepared statements settle on (the generic ones, which a
/// prepared statement uses after its fifth run) over a log of a few thousand events: the
/// fan-out reads the log from the cursor on (a range of the primary key whose lower bound is
/// the cursor; as a join, the plan walked the log from its first event at every fan-out, so
/// a drain slowed as the log grew), a batch's completions find each state row by its primary
/// key (joined on `seq` alone, the plan read every claimed row), and the backlog `/metrics`
/// counts is a range of the log too.
#[test]
fn postgres_plans_read_ranges_from_the_cursor_and_rows_by_their_keys() {
    if !crate::pgdb::available() {
        return;
    }
    let h = Harness::on(crate::stores::StoreKind::Postgres, 5, 30);
    // 3,000 events handled, then 500 waiting for their fan-out.
    for batch in 0..14 {
        h.store.insert_deliveries(&orders(batch)).unwrap();
        if batch == 11 {
            assert_eq!(h.drain(), 3000);
        }
    }
    let db = &h.db;
    db.execute("ANALYZE");
    let statements = webhook_inbox::store::postgres::statements_for_plans(&db.url()).unwrap();
    let sql = |name: &str| {
        statements
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.clone())
            .unwrap()
    };
    let plan = |sql: &str, args: &str| {
        let generic = "SET LOCAL plan_cache_mode = force_generic_plan";
        pg_plan(&db.url(), generic, "", sql, args)
    };
    let fan_out = plan(&sql("fan-out"), "'w', 30000, 256, 1000000, 0");
    assert!(
        fan_out.contains("Index Cond: ((seq > $") && fan_out.contains("(seq <= $"),
        "the fan-out's read of the log starts at the cursor:\n{fan_out}"
    );
    let complete = plan(
        &sql("complete"),
        "'{1}'::bigint[], '{1}'::bigint[], '{t}'::text[], '{completed}'::text[], 1",
    );
    assert!(
        complete.contains("Index Scan using event_state_pkey")
            && complete.contains("Index Cond: ((seq = u.seq) AND (sub = u.sub))"),
        "completions find their rows by key:\n{complete}"
    );
    for name in ["status counts", "waiting"] {
        let counts = plan(&sql(name), "");
        assert!(
            counts.contains("Index Cond: (seq > $"),
            "{name}: the backlog is a range of the log:\n{counts}"
        );
    }
    // Sessions are left out of the pending count and the lag by subscription: each one's
    // range of the due index, never a read of the states' rows.
    let counts = plan(&sql("status counts"), "");
    let ranges = counts.matches("Index Cond: (sub = u").count()
        + counts.matches("Index Cond: ((sub = u").count();
    assert!(
        counts.contains("events_due") && ranges >= 2,
        "status counts: a range of the due index per subscription:\n{counts}"
    );
}

/// On PostgreSQL, a fan-out reads at most four times its limit of the log, whatever plan the
/// statement gets. Bounded only by how far it may go, a custom plan (the first five runs on
/// each connection) that the planner estimated small read the whole backlog in a bitmap scan
/// and sorted it for the limit: 10 to 33 ms of a 50,000-event backlog, under the lock every
/// other claim waits for. Index and sequential scans are turned off here to force that plan.
#[test]
fn postgres_a_fan_out_reads_a_bounded_range_of_the_backlog_whatever_its_plan() {
    if !crate::pgdb::available() {
        return;
    }
    let h = Harness::on(crate::stores::StoreKind::Postgres, 5, 30);
    for batch in 0..12 {
        h.store.insert_deliveries(&orders(batch)).unwrap();
    }
    let db = &h.db;
    let statements = webhook_inbox::store::postgres::statements_for_plans(&db.url()).unwrap();
    let fan_out = &statements.iter().find(|(n, _)| *n == "fan-out").unwrap().1;
    let explained = pg_plan(
        &db.url(),
        "SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_indexscan = off; \
         SET LOCAL enable_seqscan = off",
        "(ANALYZE, COSTS OFF, TIMING OFF)",
        fan_out,
        "'w', 30000, 256, 1000000, 0",
    );
    // The log's scans (`near`, and `far` that runs only if `near` found nothing: a bitmap, the
    // index's entries, then the rows), and the most any of their steps read.
    let scanned = explained
        .split("CTE near")
        .nth(1)
        .and_then(|rest| rest.split("CTE scanned").next())
        .unwrap_or_else(|| panic!("no scan of the log in:\n{explained}"));
    let read: u64 = scanned
        .lines()
        .filter_map(|l| l.split("rows=").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .max()
        .unwrap_or_else(|| panic!("no rows read from the log in:\n{explained}"));
    assert!(
        read <= 4 * 256,
        "a fan-out of 256 read {read} events of a 3,000-event backlog:\n{explained}"
    );
    assert!(
        explained.contains("rows=256"),
        "the fan-out still took a full batch:\n{explained}"
    );
}
