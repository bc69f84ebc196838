//! Tests of the SQLite migrations (`migrations.rs`).

use super::*;

/// Each row of `sql`, its values printed in order, for comparing a table before and after.
pub(super) fn rows_of(conn: &Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn.prepare(sql).unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| {
        (0..n)
            .map(|i| {
                r.get::<_, rusqlite::types::Value>(i)
                    .map(|v| format!("{v:?}"))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .unwrap()
    .map(|row| row.unwrap().join(", "))
    .collect()
}

/// A database file in `dir` with every migration before `version` applied, as `apply` runs
/// them (foreign keys off while tables are rebuilt), and the index of `version` in the list.
pub(super) fn before_migration(dir: &std::path::Path, version: u32) -> (Connection, usize) {
    let mut conn = Connection::open(dir.join("m.db")).unwrap();
    conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
    let before = MIGRATIONS.iter().position(|m| m.0 == version).unwrap();
    apply_all(&mut conn, &MIGRATIONS[..before]).unwrap();
    (conn, before)
}

/// Every row of each query, one after the other: what a migration must leave as it was.
pub(super) fn rows_of_all(conn: &Connection, queries: &[&str]) -> Vec<String> {
    queries.iter().flat_map(|sql| rows_of(conn, sql)).collect()
}

#[test]
fn migrations_apply_cleanly_to_an_empty_database_and_only_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
    conn.execute_batch("PRAGMA foreign_keys = ON").unwrap();
    assert!(!is_current(&conn).unwrap());
    let all: Vec<u32> = MIGRATIONS.iter().map(|m| m.0).collect();
    assert_eq!(apply(&mut conn).unwrap(), all);
    assert!(is_current(&conn).unwrap());
    assert_eq!(
        apply(&mut conn).unwrap(),
        Vec::<u32>::new(),
        "a second run applies nothing"
    );
    let recorded: i64 = conn
        .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(recorded, all.len() as i64);
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    // Versions are numbered in order (0019 is another branch's until they meet).
    for pair in MIGRATIONS.windows(2) {
        assert!(pair[0].0 < pair[1].0, "{} then {}", pair[0].0, pair[1].0);
    }
}

/// Migrations 3 and 4 rebuild `events` (and 3 `event_attempts`), 5 adds the lane and
/// rebuilds `loyalty_balances`, 7 starts the queue's cursors, 8 lists the customers'
/// credits, 9 splits the event into its log and its state (the old tables become views
/// with their columns): a database filled under
/// migrations 1 and 2 keeps every row, its foreign keys and its indexes, and the
/// constraints still hold.
#[test]
fn rebuilding_the_event_tables_keeps_rows_keys_and_constraints() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
    // As the store opens every database it creates.
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; PRAGMA foreign_keys = ON")
        .unwrap();
    apply_all(&mut conn, &MIGRATIONS[..2]).unwrap();
    conn.execute_batch(
        "INSERT INTO events (source, event_id, seq, event_type, status, payload_sha256,
                             received_at, last_delivered_at, next_attempt_at, attempts)
         VALUES ('shop', 'a', 1, 'order.completed', 'pending', zeroblob(32), 10, 11, 12, 1),
                ('shop', 'b', 2, 't', 'failed', zeroblob(32), 20, 21, NULL, 2),
                ('requests', 'r', 3, 'request.submitted', 'pending', zeroblob(32), 30, 30,
                 30, 0);
         INSERT INTO event_payloads (seq, payload)
         VALUES (1, x'7b7d'), (2, x'7b7d'), (3, x'7b7d');
         INSERT INTO loyalty_balances (customer_id, balance)
         VALUES ('c-1', 10), ('c-2', 9.3e18);
         INSERT INTO loyalty_credits (order_id, customer_id, points, source, event_id,
                                      credited_at)
         VALUES ('o-1', 'c-1', 10, 'shop', 'a', 13), ('o-9', 'c-2', 5, 'shop', 'gone', 14);
         INSERT INTO event_attempts (event_seq, attempt, worker, started_at, finished_at,
                                     result, error)
         VALUES (1, 1, 'w', 10, 11, 'retryable_error', 'boom'), (2, 1, 'w', 20, NULL, NULL,
                 NULL);",
    )
    .unwrap();
    let dump = |conn: &Connection| -> Vec<String> {
        let mut out = Vec::new();
        // By name: migration 4 moves `seq` to the first column.
        for (table, columns) in [
            (
                "events",
                "source, event_id, seq, event_type, status, payload_sha256, deliveries,
                 payload_mismatches, received_at, last_delivered_at, attempts, budget_floor,
                 next_attempt_at, claimed_until, claimed_by, claim_token, completed_at,
                 outcome, last_error, abandoned",
            ),
            (
                "event_attempts",
                "event_seq, attempt, worker, started_at, finished_at, result, error",
            ),
        ] {
            let sql = format!("SELECT {columns} FROM {table} ORDER BY 1, 2");
            for row in rows_of(conn, &sql) {
                out.push(format!("{table}: {row}"));
            }
        }
        out
    };
    let before = dump(&conn);
    assert_eq!(
        apply(&mut conn).unwrap(),
        // Every migration after the first two (a later one adds to the list by itself).
        MIGRATIONS[2..].iter().map(|m| m.0).collect::<Vec<u32>>()
    );
    assert_eq!(dump(&conn), before, "every row and column survives");
    // 8 lists the credits by customer; one whose event is missing is not listed, as the
    // listing's join with `events` never showed it.
    let listed: Vec<(String, i64, String)> = conn
        .prepare("SELECT customer_id, seq, order_id FROM loyalty_customer_credits")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(listed, [("c-1".to_string(), 1, "o-1".to_string())]);
    let log: i64 = conn
        .query_row("SELECT count(*) FROM loyalty_unlisted_credits", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(log, 0);
    let seq_is_rowid: i64 = conn
        .query_row(
            "SELECT count(*) FROM event_log WHERE rowid = seq",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(seq_is_rowid, 3, "seq is the rowid");
    let lanes: Vec<i64> = conn
        .prepare("SELECT lane FROM events ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        lanes,
        [0, 0, 1],
        "submitted requests are in the call-out lane"
    );
    let balances: Vec<(String, i64)> = conn
        .prepare("SELECT typeof(balance), balance FROM loyalty_balances ORDER BY 1, 2")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        balances,
        [
            ("integer".to_string(), 10),
            ("integer".to_string(), i64::MAX)
        ],
        "a REAL balance saturates to an integer"
    );
    let real = conn.execute("UPDATE loyalty_balances SET balance = balance + 1.5", []);
    assert!(
        real.is_err(),
        "the database refuses a balance that is not an integer"
    );
    let duplicate = conn.execute(
        "INSERT INTO event_log (source, event_id, event_type, payload_sha256, received_at,
                                last_delivered_at)
         VALUES ('shop', 'a', 't', zeroblob(32), 1, 1)",
        [],
    );
    assert!(duplicate.is_err(), "(source, event_id) is still unique");
    let fk: bool = conn
        .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
        .unwrap();
    assert!(fk, "foreign keys are enforced again");
    let indexes: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'index'
               AND tbl_name = 'event_state'
               AND name IN ('events_due', 'events_leases', 'events_failed', 'events_purged')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexes, 4);
    // Migration 9: every event stored before it has its state row, and the one cursor
    // sits at the end of the log (the request, seq 3, is pending in its state row).
    let states: Vec<(i64, String, i64)> = conn
        .prepare("SELECT seq, status, attempts FROM event_state ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let state = |seq: i64, status: &str, attempts: i64| (seq, status.to_string(), attempts);
    assert_eq!(
        states,
        [
            state(1, "pending", 1),
            state(2, "failed", 2),
            state(3, "pending", 0)
        ]
    );
    let cursors: Vec<(i64, i64)> = conn
        .prepare("SELECT id, after_seq FROM queue_cursor ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(cursors, [(0, 3)]);
    // The bodies moved into the log, and the view still shows them.
    let bodies: i64 = conn
        .query_row(
            "SELECT count(*) FROM event_payloads WHERE payload = x'7b7d'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(bodies, 3);
    // The references from the other tables follow the new tables.
    let orphan = conn.execute(
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at)
         VALUES (99, 1, 0, 'pending', 1)",
        [],
    );
    assert!(orphan.is_err(), "a state row still needs its event");
    let orphan = conn.execute(
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at)
         VALUES (99, 1, 1, 'w', 1)",
        [],
    );
    assert!(orphan.is_err(), "an attempt still needs its state row");
    let bad_status = conn.execute("UPDATE event_state SET status = 'lost' WHERE seq = 2", []);
    assert!(bad_status.is_err(), "the status CHECK still holds");
    let free: i64 = conn
        .query_row("PRAGMA freelist_count", [], |r| r.get(0))
        .unwrap();
    assert_eq!(free, 0, "the rebuilt tables' pages were given back");
    let bad_result = conn.execute("UPDATE event_attempts SET result = 'maybe'", []);
    assert!(bad_result.is_err(), "the result CHECK still holds");
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}

/// No statement that writes an event or an attempt builds a temporary b-tree per row (what
/// an `IN (…)` list in a CHECK costs).
#[test]
fn writing_events_and_attempts_builds_no_temporary_btree() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
    apply(&mut conn).unwrap();
    for sql in [
        "INSERT INTO event_log (source, event_id, event_type, payload_sha256, received_at,
                                last_delivered_at, payload)
         VALUES ('s', 'e', 't', zeroblob(32), 1, 1, x'7b7d')",
        "INSERT INTO event_state (seq, sub, lane, status, next_attempt_at)
         VALUES (1, 1, 0, 'pending', 1)",
        "UPDATE event_state SET status = 'completed' WHERE seq = 1 AND sub = 1",
        "INSERT INTO event_attempts (event_seq, sub, attempt, worker, started_at)
         VALUES (1, 1, 1, 'w', 1)",
        "UPDATE event_attempts SET result = 'ok' WHERE event_seq = 1 AND sub = 1
            AND attempt = 1",
    ] {
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        let ops: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(1))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            !ops.iter().any(|op| op == "OpenEphemeral"),
            "{sql}: {ops:?}"
        );
    }
}

#[test]
fn a_database_newer_than_the_binary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
    apply(&mut conn).unwrap();
    conn.execute(
        "INSERT INTO schema_migrations (version, name) VALUES (999, 'future')",
        [],
    )
    .unwrap();
    let err = apply(&mut conn).unwrap_err().to_string();
    assert!(err.contains("newer"), "{err}");
}

/// Migration 21 keeps who claims each subscription: for a registry written before it, the
/// kind decides as [`crate::subscriptions::Kind::claimer`] does, kind by kind.
#[test]
fn the_claimer_of_each_kind_follows_the_kind() {
    use crate::subscriptions::Kind;
    let dir = tempfile::tempdir().unwrap();
    let (mut conn, before) = before_migration(dir.path(), 21);
    for kind in Kind::ALL {
        conn.execute(
            "INSERT INTO subscriptions (name, kind, lane, created_at) VALUES (?1, ?1, ?2, 0)
             ON CONFLICT (name) DO NOTHING",
            rusqlite::params![kind.as_str(), kind.lane()],
        )
        .unwrap();
    }
    apply_all(&mut conn, &MIGRATIONS[before..]).unwrap();
    for kind in Kind::ALL {
        let claimer: String = conn
            .query_row(
                "SELECT claimer FROM subscriptions WHERE kind = ?1",
                [kind.as_str()],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(claimer, kind.claimer().as_str(), "{kind:?}");
    }
}

/// Migration 24 renames the fan-out's cursor to PostgreSQL's `queue_cursor` (id 0): a database
/// full of events under 22 keeps every row, its cursor, and the `events` view's answer (the
/// events after the cursor pending, the others as their state rows say).
#[test]
fn the_cursor_takes_its_postgres_name_with_every_event_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (mut conn, before) = before_migration(dir.path(), 24);
    // 2,000 events, every tenth a submitted request (lane 1); the first 1,500 fanned out.
    conn.execute_batch(
        "INSERT INTO subscriptions (name, kind, lane, created_at) VALUES ('audit', 'audit', 0, 0)
           ON CONFLICT (name) DO NOTHING;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
         INSERT INTO event_log (seq, source, event_id, event_type, payload_sha256, received_at,
                                last_delivered_at, lane, payload)
         SELECT i, 'shop', 'e-' || i, 't', zeroblob(32), i, i, i % 10 = 0, x'7b7d' FROM n;
         INSERT INTO event_state (seq, sub, lane, status, attempts, next_attempt_at)
         SELECT l.seq, u.id, 0, CASE WHEN l.seq % 3 = 0 THEN 'completed' ELSE 'pending' END,
                1, l.seq
           FROM event_log l, subscriptions u WHERE u.name = 'audit' AND l.seq <= 1500;
         UPDATE queue_cursors SET after_seq = 1500 WHERE lane = 0;",
    )
    .unwrap();
    let dump = |conn: &Connection| {
        rows_of_all(
            conn,
            &[
                "SELECT * FROM event_log ORDER BY seq",
                "SELECT * FROM event_state ORDER BY seq, sub",
                "SELECT * FROM events ORDER BY seq, status",
            ],
        )
    };
    let old = dump(&conn);
    assert_eq!(old.len(), 2_000 + 1_500 + 2_000);
    apply_all(&mut conn, &MIGRATIONS[before..]).unwrap();
    assert_eq!(
        dump(&conn),
        old,
        "every row, and the view's answer, as before"
    );
    let cursor: (i64, i64) = conn
        .query_row("SELECT id, after_seq FROM queue_cursor", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(cursor, (0, 1500));
    let pending_after: i64 = conn
        .query_row(
            "SELECT count(*) FROM events WHERE seq > 1500 AND status = 'pending'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(pending_after, 450, "the webhooks' events after the cursor");
    assert!(
        conn.execute("INSERT INTO queue_cursor (id, after_seq) VALUES (1, 0)", [])
            .is_err(),
        "one cursor, as the CHECK keeps it"
    );
    let old_name: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE sql LIKE '%queue_cursors%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(old_name, 0, "nothing in the schema names the old table");
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}
