//! The alerts' reads at each evaluation, by their plans on both stores (see `store::alerts`):
//! bounded by the window or by one seek per subscription, however long the history.

use crate::harness::Harness;
use crate::plans::{pg_plan, query_plan};

/// The alerts' reads at every evaluation are bounded: the failed states of a window start from
/// the failing attempts in it (the partial index `event_attempts_failing`, then each state by its
/// key), never a walk of every failed state; a subscription's oldest due event is one seek of
/// `events_due (sub, next_attempt_at)`, never a count of its backlog.
#[test]
fn the_alert_queries_read_bounded_ranges_through_their_indexes() {
    use webhook_inbox::store::alerts::{FAILED_SINCE, SUBJECTS};
    let h = Harness::new(5, 30);
    let failed = query_plan(&h, FAILED_SINCE, [0i64]);
    assert!(
        failed
            .iter()
            .any(|p| p.contains("USING INDEX event_attempts_failing (finished_at>?)")),
        "{failed:?}"
    );
    assert!(
        failed
            .iter()
            .any(|p| p.contains("SEARCH b USING PRIMARY KEY (event_seq=? AND sub=?)")),
        "{failed:?}"
    );
    assert!(
        !failed
            .iter()
            .any(|p| p.contains("SCAN a") || p.contains("SCAN b") || p.contains("SCAN s")),
        "{failed:?}"
    );
    let subjects = query_plan(&h, SUBJECTS, []);
    assert!(
        subjects
            .iter()
            .any(|p| p.contains("SEARCH s USING COVERING INDEX events_due (sub=?)")),
        "{subjects:?}"
    );
    assert!(
        !subjects
            .iter()
            .any(|p| p.contains("TEMP B-TREE") || p.contains("SCAN s")),
        "{subjects:?}"
    );
}

/// The same on PostgreSQL, over 5,000 failed states whose attempts are all older than the
/// window (the history an evaluation must not walk): the failed states of a window start from
/// a range of `event_attempts_failing`; a subscription's oldest due event is read from
/// `events_due` (sequential scans off: the test's `event_state` is otherwise tiny).
#[test]
fn postgres_the_alert_queries_read_bounded_ranges_through_their_indexes() {
    use webhook_inbox::store::alerts::{FAILED_SINCE, SUBJECTS};
    if !crate::pgdb::available() {
        return;
    }
    let h = Harness::on(crate::stores::StoreKind::Postgres, 5, 30);
    let db = &h.db;
    db.execute(
        "INSERT INTO event_state (seq, sub, lane, status, attempts)
         SELECT g, 1, 0, 'failed', 1 FROM generate_series(1000001, 1005000) g",
    );
    db.execute(
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at, finished_at,
                                     result)
         SELECT g, 1, 1, 'w', 1, 2, 'permanent_error' FROM generate_series(1000001, 1005000) g",
    );
    db.execute("ANALYZE");
    let now = webhook_inbox::domain::time::now_ms().to_string();
    let failed = pg_plan(&db.url(), "SELECT 1", "(COSTS OFF)", FAILED_SINCE, &now);
    assert!(
        failed.contains("using event_attempts_failing on event_attempts a")
            && failed.contains("Index Cond: (finished_at >= "),
        "{failed}"
    );
    // Each state then by its key (`events_failed (seq)` or the primary key): never a walk.
    assert!(!failed.contains("Seq Scan"), "{failed}");
    let subjects = pg_plan(
        &db.url(),
        "SET LOCAL enable_seqscan = off",
        "(COSTS OFF)",
        SUBJECTS,
        "",
    );
    assert!(subjects.contains("using events_due"), "{subjects}");
    // The states above have no event: gone before the database's check for orphans.
    db.execute("DELETE FROM event_attempts WHERE event_seq > 1000000");
    db.execute("DELETE FROM event_state WHERE seq > 1000000");
}
