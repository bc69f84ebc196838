//! A customer's credits for `GET /loyalty/{customer_id}`, in two parts (migration `0008`): new
//! credits are appended to a log by a trigger on `loyalty_credits`, and moved into the
//! customer index, sorted, once the log holds [`LIST_AT`]. Each leaf of that index is then
//! written once per move for all of its customer's new credits, instead of once per credit.
//!
//! Every credit is in exactly one part: the move and the credit's insert are each one
//! transaction, and a listing reads both parts in one snapshot.

use rusqlite::{Connection, Transaction, params};

use crate::store::{LoyaltyCredit, Page, StoreResult};

/// Credits the log holds before they are moved into the customer index. A listing reads the
/// log's rows of its customer by a scan, so this bounds that scan too (about 400 KiB).
pub(super) const LIST_AT: i64 = 8192;

/// After crediting, in the same transaction: move the log into the customer index if it holds
/// [`LIST_AT`] credits or more.
pub(super) fn list_if_due(tx: &Transaction<'_>) -> StoreResult<()> {
    let held: Option<i64> = tx
        // Two subqueries: each is one seek to an end of the rowid b-tree, where a single
        // `max(id) - min(id)` would read every row.
        .prepare_cached(
            "SELECT (SELECT max(id) FROM loyalty_unlisted_credits)
                  - (SELECT min(id) FROM loyalty_unlisted_credits) + 1",
        )?
        .query_row([], |r| r.get(0))?;
    if held.unwrap_or(0) >= LIST_AT {
        list_all(tx)?;
    }
    Ok(())
}

/// Move every credit of the log into the customer index, sorted by the index's key so that
/// each leaf is written once.
pub(super) fn list_all(tx: &Transaction<'_>) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO loyalty_customer_credits (customer_id, seq, order_id)
         SELECT customer_id, seq, order_id FROM loyalty_unlisted_credits
          ORDER BY customer_id, seq, order_id",
    )?
    .execute([])?;
    tx.prepare_cached("DELETE FROM loyalty_unlisted_credits")?
        .execute([])?;
    Ok(())
}

/// One page of a customer's credits, newest first by the `seq` of the event that earned each
/// (the order and cursor of `GET /events`): the newest of each part, merged.
pub(super) fn credits(
    conn: &Connection,
    customer_id: &str,
    page: Page,
) -> StoreResult<Vec<LoyaltyCredit>> {
    let limit = i64::try_from(page.limit).unwrap_or(i64::MAX);
    let rows = conn
        .prepare_cached(
            "SELECT c.order_id, c.points, c.source, c.event_id, c.credited_at, x.seq
               FROM (SELECT seq, order_id FROM (
                        SELECT seq, order_id FROM loyalty_customer_credits
                         WHERE customer_id = ?1 AND (?2 IS NULL OR seq < ?2)
                         ORDER BY seq DESC LIMIT ?3)
                     UNION ALL
                     SELECT seq, order_id FROM loyalty_unlisted_credits
                      WHERE customer_id = ?1 AND (?2 IS NULL OR seq < ?2)) AS x
               JOIN loyalty_credits c ON c.order_id = x.order_id
               JOIN event_log e ON e.seq = x.seq
              ORDER BY x.seq DESC LIMIT ?3",
        )?
        .query_map(params![customer_id, page.before_seq, limit], |r| {
            Ok(LoyaltyCredit {
                order_id: r.get(0)?,
                points: r.get(1)?,
                source: r.get(2)?,
                event_id: r.get(3)?,
                credited_at: r.get(4)?,
                seq: r.get(5)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicBool, Ordering};

    use rusqlite::params;

    use super::super::tests::delivery;
    use super::super::{SqliteOptions, SqliteStore};
    use super::{LIST_AT, credits, list_all, list_if_due};
    use crate::store::{NewDelivery, Page, Store as _};

    const CUSTOMERS: usize = 3;

    fn store(dir: &tempfile::TempDir) -> SqliteStore {
        let store =
            SqliteStore::open(&dir.path().join("inbox.db"), SqliteOptions::default()).unwrap();
        store.migrate().unwrap();
        store
    }

    /// Events `from..to` and a credit for each (customer `i % CUSTOMERS`), the log moved when
    /// due as the consumers do, in transactions of 500.
    fn credit(store: &SqliteStore, from: usize, to: usize) {
        for start in (from..to).step_by(500) {
            let end = (start + 500).min(to);
            let batch: Vec<NewDelivery> = (start..end)
                .map(|i| delivery(&format!("evt-{i}")))
                .collect();
            store.insert_deliveries(&batch).unwrap();
            store
                .consumer_write(|tx| {
                    let mut insert = tx.prepare_cached(
                        "INSERT INTO loyalty_credits
                             (order_id, customer_id, points, source, event_id, credited_at)
                         VALUES (?1, ?2, 1, 'shop', ?3, 1)",
                    )?;
                    for i in start..end {
                        insert.execute(params![
                            format!("o-{i}"),
                            format!("c-{}", i % CUSTOMERS),
                            format!("evt-{i}")
                        ])?;
                    }
                    list_if_due(tx)?;
                    Ok(())
                })
                .unwrap();
        }
    }

    /// Every credit of `customer`, page by page through the cursor: (seq, order_id).
    fn listed(store: &SqliteStore, customer: &str, limit: usize) -> Vec<(i64, String)> {
        let mut all = Vec::new();
        let mut before_seq = None;
        loop {
            let page = store
                .read(|c| credits(c, customer, Page { limit, before_seq }))
                .unwrap();
            let Some(last) = page.last() else {
                return all;
            };
            before_seq = Some(last.seq);
            all.extend(page.iter().map(|c| (c.seq, c.order_id.clone())));
        }
    }

    fn expected(store: &SqliteStore, customer: &str) -> Vec<(i64, String)> {
        store
            .read(|c| {
                Ok(c.prepare(
                    "SELECT e.seq, c.order_id FROM loyalty_credits c
                       JOIN event_log e ON e.source = c.source AND e.event_id = c.event_id
                      WHERE c.customer_id = ?1 ORDER BY e.seq DESC",
                )?
                .query_map([customer], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()?)
            })
            .unwrap()
    }

    fn unlisted(store: &SqliteStore) -> i64 {
        store
            .read(|c| {
                Ok(
                    c.query_row("SELECT count(*) FROM loyalty_unlisted_credits", [], |r| {
                        r.get(0)
                    })?,
                )
            })
            .unwrap()
    }

    /// Listings are the same whichever part holds the credits: all in the log, all moved, and
    /// mixed, at every page size.
    #[test]
    fn a_customers_credits_are_listed_once_newest_first_from_both_parts() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let n = LIST_AT as usize;
        credit(&store, 0, n - 1);
        assert_eq!(unlisted(&store), LIST_AT - 1, "not due yet: all in the log");
        let check = |stage: &str| {
            for customer in ["c-0", "c-2"] {
                let want = expected(&store, customer);
                assert!(!want.is_empty());
                for limit in [13, 250, 5000] {
                    assert_eq!(
                        listed(&store, customer, limit),
                        want,
                        "{stage}, limit {limit}"
                    );
                }
            }
        };
        check("in the log");
        credit(&store, n - 1, n);
        assert_eq!(unlisted(&store), 0, "moved when the log held {LIST_AT}");
        credit(&store, n, n + 300);
        assert_eq!(unlisted(&store), 300);
        check("both parts");
        store.consumer_write(|tx| list_all(tx)).unwrap();
        assert_eq!(unlisted(&store), 0);
        check("all moved");
        assert!(listed(&store, "c-9", 50).is_empty());
    }

    /// A reader listing while credits are added and moved sees each credit of its snapshot
    /// exactly once: real threads, one file. (Seen failing with the move split into two
    /// transactions, the log emptied in the second.)
    #[test]
    fn concurrent_moves_never_list_a_credit_twice_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let done = AtomicBool::new(false);
        let start = Barrier::new(3);
        std::thread::scope(|s| {
            s.spawn(|| {
                start.wait();
                for round in 0..40 {
                    credit(&store, round * 250, (round + 1) * 250);
                    store.consumer_write(|tx| list_all(tx)).unwrap();
                }
                done.store(true, Ordering::SeqCst);
            });
            for _ in 0..2 {
                s.spawn(|| {
                    start.wait();
                    let mut checks = 0;
                    while !done.load(Ordering::SeqCst) || checks == 0 {
                        // One snapshot: the listing and the credits it must show.
                        let (listed, want): (Vec<i64>, i64) = store
                            .read(|c| {
                                c.execute_batch("BEGIN")?;
                                let page = credits(
                                    c,
                                    "c-1",
                                    Page {
                                        limit: 100_000,
                                        before_seq: None,
                                    },
                                )?;
                                let want = c.query_row(
                                    "SELECT count(*) FROM loyalty_credits WHERE customer_id = 'c-1'",
                                    [],
                                    |r| r.get(0),
                                )?;
                                c.execute_batch("COMMIT")?;
                                Ok((page.iter().map(|c| c.seq).collect(), want))
                            })
                            .unwrap();
                        assert_eq!(listed.len() as i64, want, "a credit listed twice or missed");
                        assert!(listed.windows(2).all(|w| w[0] > w[1]), "not newest first");
                        checks += 1;
                        assert!(checks < 100_000);
                    }
                });
            }
        });
        assert_eq!(expected(&store, "c-1").len(), 10_000 / CUSTOMERS);
    }
}
