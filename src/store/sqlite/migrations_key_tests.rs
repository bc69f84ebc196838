//! Migration 25: the log rebuilt with its unique key as `(event_id, source)`.

use super::tests::{before_migration, rows_of, rows_of_all};
use super::*;

/// A database full of events under 24 (two sources, requests, redeliveries, a purged body, a
/// trace, states on either side of the cursor) keeps every row, every read of the views, the
/// dedup by `(source, event_id)` and the trigger that lists a credit by its event.
#[test]
fn the_rebuilt_log_keeps_every_row_view_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let (mut conn, before) = before_migration(dir.path(), 25);
    // 3,000 events from two sources (each id in both), every tenth a submitted request; every
    // seventh delivered twice with another body; the first one purged; the first 2,000 fanned
    // out.
    conn.execute_batch(
        "INSERT INTO subscriptions (name, kind, lane, created_at) VALUES ('audit', 'audit', 0, 0)
           ON CONFLICT (name) DO NOTHING;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
         INSERT INTO event_log (seq, source, event_id, event_type, payload_sha256, received_at,
                                lane, deliveries, payload_mismatches, last_delivered_at,
                                payload, content_type, traceparent)
         SELECT i, CASE WHEN i % 2 = 0 THEN 'shop' ELSE 'billing' END, 'e-' || (i / 2),
                'order.completed', zeroblob(32), i, i % 10 = 0, 1 + (i % 7 = 0), i % 7 = 0,
                i + 5 * (i % 7 = 0), x'7b7d',
                CASE WHEN i % 3 = 0 THEN 'application/json' END,
                CASE WHEN i % 5 = 0 THEN '00-' || printf('%032x', i) || '-' || printf('%016x', i)
                     || '-01' END
           FROM n;
         UPDATE event_log SET payload = NULL, content_type = NULL, traceparent = NULL
          WHERE seq = 1;
         INSERT INTO event_state (seq, sub, lane, status, attempts, next_attempt_at, purged_at)
         SELECT l.seq, u.id, 0, CASE WHEN l.seq % 3 = 0 THEN 'completed' ELSE 'pending' END,
                1, l.seq, CASE WHEN l.seq = 3 THEN 9 END
           FROM event_log l, subscriptions u WHERE u.name = 'audit' AND l.seq <= 2000;
         UPDATE queue_cursor SET after_seq = 2000 WHERE id = 0;",
    )
    .unwrap();
    let dump = |conn: &Connection| {
        rows_of_all(
            conn,
            &[
                "SELECT * FROM event_log ORDER BY seq",
                "SELECT * FROM event_state ORDER BY seq, sub",
                "SELECT * FROM events ORDER BY seq",
                "SELECT * FROM event_payloads ORDER BY seq",
                "SELECT seq FROM event_log WHERE lane = 1 ORDER BY seq",
            ],
        )
    };
    let old = dump(&conn);
    assert_eq!(old.len(), 3_000 + 2_000 + 3_000 + 2_999 + 300);
    apply_all(&mut conn, &MIGRATIONS[before..]).unwrap();
    let new = dump(&conn);
    assert_eq!(new.len(), old.len(), "every row, and the views' answers");
    if let Some(i) = (0..old.len()).find(|&i| new[i] != old[i]) {
        panic!("line {i} of the dump was {} and is {}", old[i], new[i]);
    }

    let key: Vec<String> = rows_of(
        &conn,
        "SELECT i.name FROM pragma_index_list('event_log') l, pragma_index_info(l.name) i
          WHERE l.\"unique\" ORDER BY i.seqno",
    );
    assert_eq!(key, ["Text(\"event_id\")", "Text(\"source\")"]);
    // The key is the dedup, as ingest's conflict target names it.
    let insert = "INSERT INTO event_log (source, event_id, event_type, payload_sha256,
                                         received_at, last_delivered_at, payload)
                  VALUES (?1, ?2, 't', zeroblob(32), 1, 1, x'00')";
    assert!(
        conn.execute(insert, ["shop", "e-5"]).is_err(),
        "a stored key"
    );
    let upsert = format!("{insert} ON CONFLICT (source, event_id) DO NOTHING");
    assert_eq!(conn.execute(&upsert, ["shop", "e-5"]).unwrap(), 0);
    assert_eq!(conn.execute(&upsert, ["shop", "e-new"]).unwrap(), 1);
    assert_eq!(
        conn.last_insert_rowid(),
        3_001,
        "seq goes on from the log's last"
    );
    assert!(
        conn.execute(
            "INSERT INTO event_log (source, event_id, event_type, payload_sha256, received_at,
                                    last_delivered_at, lane)
             VALUES ('shop', 'e-lane', 't', x'00', 1, 1, 2)",
            [],
        )
        .is_err(),
        "the CHECKs hold"
    );
    // The trigger lists a credit by its event's seq.
    conn.execute(
        "INSERT INTO loyalty_credits (order_id, customer_id, points, source, event_id,
                                      credited_at)
         VALUES ('o-1', 'c-1', 5, 'shop', 'e-7', 1)",
        [],
    )
    .unwrap();
    let listed: i64 = conn
        .query_row(
            "SELECT seq FROM loyalty_unlisted_credits WHERE order_id = 'o-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(listed, 14, "shop's e-7 is seq 14");
    let problems: i64 = conn
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(problems, 0);
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}
