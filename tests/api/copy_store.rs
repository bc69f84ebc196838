//! The copy's reads and bookkeeping (`store::sql::copy`, written once for both stores), on
//! both: a table read in key order a page at a time, a key of one column and of two, its
//! count, the fan-out's cursor, and the mark of a copy in progress.

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::copy::{Cell, TABLES, Table};
use webhook_inbox::store::{Lane, Store};

use crate::helpers::new_delivery;
use crate::stores::{StoreKind, TestDb};

crate::stores::store_tests!(a_table_reads_a_page_at_a_time_in_key_order);

fn table(name: &str) -> &'static Table {
    TABLES.iter().find(|t| t.name == name).unwrap()
}

/// Every row of `table` through pages of `page` rows, each after the last one's key.
fn paged(store: &dyn Store, table: &Table, page: usize) -> Vec<Vec<Cell>> {
    let (mut rows, mut after) = (Vec::new(), Vec::new());
    for _ in 0..1_000 {
        let got = store.copy_out(table, &after, page).unwrap();
        let Some(last) = got.last() else {
            return rows;
        };
        after = last[..table.key].to_vec();
        rows.extend(got);
    }
    panic!("more than 1,000 pages");
}

fn a_table_reads_a_page_at_a_time_in_key_order(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let store = db.open_store();
    let batch: Vec<_> = (0..25)
        .map(|i| new_delivery("shop", &format!("e-{i:02}"), "thing.done", "{}"))
        .collect();
    store.insert_deliveries(&batch).unwrap();
    let log = table("event_log");
    let rows = paged(store.as_ref(), log, 10);
    let id_at = log.columns.iter().position(|c| *c == "event_id").unwrap();
    let ids: Vec<_> = rows.iter().map(|r| r[id_at].clone()).collect();
    let expected: Vec<_> = (0..25).map(|i| Cell::Text(format!("e-{i:02}"))).collect();
    assert_eq!(ids, expected, "every event once, in `seq` order");
    assert_eq!(store.copy_count(log).unwrap(), 25);

    // The claims fan them out: a state per event and subscription, keyed (seq, sub). A claim
    // beside recent ingest takes less than its limit on SQLite: claimed until none is left.
    let mut claimed = 0;
    for _ in 0..100 {
        match store
            .claim("w", Lane::InProcess, 100, 60_000, now_ms())
            .unwrap()
            .len()
        {
            0 => break,
            n => claimed += n,
        }
    }
    assert_eq!(claimed, 25, "the audit subscription takes every event");
    let states = table("event_state");
    assert!(states.key >= 2, "a key of two columns");
    let whole = store.copy_out(states, &[], 10_000).unwrap();
    assert_eq!(paged(store.as_ref(), states, 7), whole);
    assert_eq!(store.copy_count(states).unwrap(), whole.len() as u64);
    let newest = match rows.last().unwrap()[0] {
        Cell::Int(seq) => seq,
        ref other => panic!("seq {other:?}"),
    };
    assert_eq!(store.fan_out_cursor().unwrap(), newest);

    assert_eq!(store.unfinished_copy().unwrap(), None);
    store.mark_copy(Some(1_000)).unwrap();
    store.mark_copy(Some(2_000)).unwrap();
    assert_eq!(store.unfinished_copy().unwrap(), Some(2_000));
    store.mark_copy(None).unwrap();
    assert_eq!(store.unfinished_copy().unwrap(), None);
}
