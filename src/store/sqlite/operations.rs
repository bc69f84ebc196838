//! The `Store` trait on SQLite: each operation as a read on a pooled connection or a write
//! transaction on the one write connection (the helpers are in `mod.rs`), over the statements
//! of the sibling modules.

use super::dialect::Sqlite;
use super::{
    SqliteStore, breaker, consume, copy, finish, ingest, leases, migrations, purge, registry,
    subscriptions,
};
use crate::store::copy::{Row, Table};
use crate::store::sql;
use crate::store::{
    ClaimRef, Claimed, DecideExpiry, Finish, Finished, Hold, Holder, InsertOutcome, Lane,
    LifecycleCounts, LoyaltyAccount, NewDelivery, Page, PurgeBatch, PurgeCutoffs, Readiness,
    StatusCounts, Store, StoreError, StoreResult, SubmitOutcome, SubscriptionClaim,
};
use crate::subscriptions::Subscription;

/// [`crate::store::sql::stats::event_counts_sql`] with SQLite's index hints.
static EVENT_COUNTS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(crate::store::sql::stats::event_counts_sql::<super::dialect::Dialect>);

impl Store for SqliteStore {
    crate::store::sql::ops::ops_methods!();

    fn alerts(&self) -> &dyn crate::store::alerts::AlertStore {
        self
    }

    fn migrate(&self) -> StoreResult<Vec<u32>> {
        let mut conn = self.lock_writer()?;
        let applied = migrations::apply(&mut conn)?;
        self.routes_changed();
        self.checkpoint_if_due(&conn, super::checkpoint::take_frames());
        let ticket = self.sync.committed();
        drop(conn);
        self.sync.wait(ticket)?;
        Ok(applied)
    }

    fn ready(&self) -> StoreResult<Readiness> {
        // Reads alone would call a database ready that can no longer be written: one open
        // for writing tells.
        let writable = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .is_ok();
        Ok(if self.sync.check().is_err() {
            Readiness::NotDurable
        } else if !writable {
            Readiness::NotWritable
        } else if !self.read(migrations::is_current)? {
            Readiness::NotMigrated
        } else {
            Readiness::Ready
        })
    }

    fn insert_deliveries(&self, batch: &[NewDelivery]) -> StoreResult<Vec<InsertOutcome>> {
        self.write(|tx| {
            // Read every batch, though only a submitted request is fanned out here: it keeps
            // the node's view of the registry current (`registry_version_seen`), by which the
            // live secrets (`secrets::live`) see a rotation before their read expires.
            let routes = self.routes_in(tx)?;
            ingest::insert_all(tx, batch, &routes)
        })
    }

    fn event_counts(&self) -> StoreResult<StatusCounts> {
        self.read(|conn| {
            let (a, b, c, d) = conn
                .prepare_cached(&EVENT_COUNTS)?
                .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            Ok(crate::store::sql::stats::event_counts_of(a, b, c, d))
        })
    }

    fn received_per_minute(&self, since: i64) -> StoreResult<Vec<(i64, i64)>> {
        self.read(|c| sql::stats::received_per_minute(&mut Sqlite(c), since))
    }

    fn claim(
        &self,
        worker: &str,
        lane: Lane,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<Vec<Claimed>> {
        self.consumer_write(|tx| {
            let routes = self.routes_in(tx)?;
            let limit = self.claim_limit(limit);
            consume::claim(tx, &routes, worker, lane, limit, lease_ms, now)
        })
    }

    fn finish(&self, items: &[Finish], now: i64) -> StoreResult<Vec<Finished>> {
        self.finishing(|tx, isolate| finish::finish_all(tx, items, now, isolate))
    }

    fn finish_and_claim(
        &self,
        items: &[Finish],
        worker: &str,
        lane: Lane,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<(Vec<Finished>, Vec<Claimed>)> {
        self.finishing(|tx, isolate| {
            let routes = self.routes_in(tx)?;
            let finished = finish::finish_all(tx, items, now, isolate)?;
            let limit = self.claim_limit(limit);
            let claimed = consume::claim(tx, &routes, worker, lane, limit, lease_ms, now)?;
            Ok((finished, claimed))
        })
    }

    fn release(&self, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
        self.consumer_write(|tx| leases::release(tx, claims, now))
    }

    fn give_back(&self, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
        self.consumer_write(|tx| leases::give_back(tx, claims, now))
    }

    fn give_back_probe(&self, claim: &ClaimRef, now: i64) -> StoreResult<bool> {
        self.consumer_write(|tx| {
            let given = leases::give_back(tx, std::slice::from_ref(claim), now)? == 1;
            if given {
                sql::breaker::probe_now(&mut Sqlite(tx), claim.subscription, now)?;
            }
            Ok(given)
        })
    }

    fn sweep(&self, now: i64, decide: DecideExpiry<'_>) -> StoreResult<usize> {
        self.consumer_write(|tx| leases::sweep(tx, now, decide))
    }

    fn sync_subscriptions(&self, subs: &[Subscription], now: i64) -> StoreResult<Vec<i64>> {
        let ids = self.write(|tx| subscriptions::sync(tx, subs, now))?;
        self.routes_changed();
        Ok(ids)
    }

    fn prune_subscriptions(&self, now: i64, sessions_idle_before: i64) -> StoreResult<usize> {
        let removed = self.write(|tx| {
            let removed = subscriptions::prune(tx, now)?
                + registry::prune_sessions(tx, sessions_idle_before, now)?;
            super::registry::finish_left_unfinished(tx, now)?;
            sql::secrets::drop_expired(&mut Sqlite(tx), now)?;
            Ok(removed)
        })?;
        if removed > 0 {
            self.routes_changed();
        }
        Ok(removed)
    }

    fn registry_version_seen(&self) -> Option<i64> {
        self.routes_seen()
    }

    fn filtered_out(&self) -> Vec<(String, u64)> {
        self.left_out.totals()
    }

    fn remove_subscription(
        &self,
        name: &str,
        sessions_only: bool,
        now: i64,
    ) -> StoreResult<Option<usize>> {
        self.registry_write(|tx| registry::remove(tx, name, sessions_only, now))
    }

    fn claim_subscription(
        &self,
        worker: &str,
        sub: i64,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<SubscriptionClaim> {
        self.consumer_write(|tx| {
            let routes = self.routes_in(tx)?;
            let limit = self.claim_limit(limit);
            breaker::claim(tx, &routes, worker, sub, limit, lease_ms, now)
        })
    }

    fn finish_and_claim_subscription(
        &self,
        items: &[Finish],
        worker: &str,
        sub: i64,
        claim: Option<usize>,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<(Vec<Finished>, Option<SubscriptionClaim>)> {
        self.finishing(|tx, isolate| {
            let finished = match items {
                [] => Vec::new(),
                items => finish::finish_all(tx, items, now, isolate)?,
            };
            let claimed = match claim {
                Some(limit) => {
                    let routes = self.routes_in(tx)?;
                    let limit = self.claim_limit(limit);
                    Some(breaker::claim(
                        tx, &routes, worker, sub, limit, lease_ms, now,
                    )?)
                }
                None => None,
            };
            Ok((finished, claimed))
        })
    }

    fn extend_claims(
        &self,
        claims: &[ClaimRef],
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<Vec<Option<i64>>> {
        self.consumer_write(|tx| leases::extend(tx, claims, now + lease_ms, now))
    }

    fn backfill(&self, name: &str, since: i64, now: i64) -> StoreResult<Option<usize>> {
        let routes = self.routes()?;
        let Some(sub) = routes.named(name) else {
            return Ok(None);
        };
        self.write(|tx| subscriptions::backfill(tx, sub, since, now))
            .map(Some)
    }

    fn loyalty(&self, customer_id: &str, page: Page) -> StoreResult<LoyaltyAccount> {
        self.read(|c| consume::loyalty(c, customer_id, page))
    }

    fn purge_batch(
        &self,
        cutoffs: &PurgeCutoffs,
        after: i64,
        limit: usize,
        now: i64,
    ) -> StoreResult<PurgeBatch> {
        purge::batch(self, cutoffs, after, limit, now)
    }

    fn tombstones_through(&self, after: i64, through: i64) -> StoreResult<bool> {
        self.read(|c| purge::tombstones_through(c, after, through))
    }

    fn lifecycle_counts(&self) -> StoreResult<LifecycleCounts> {
        self.read(purge::counts)
    }

    fn submit_request(&self, id: &str, now: i64) -> StoreResult<SubmitOutcome> {
        self.write(|tx| {
            let tx: &rusqlite::Transaction<'_> = tx;
            let routes = self.routes_in(tx)?;
            sql::requests::submit(&mut Sqlite(tx), id, now, |_, delivery| {
                let batch = std::slice::from_ref(delivery);
                Ok(ingest::insert_all(tx, batch, &routes)?.remove(0))
            })
        })
    }

    fn copy_in(&self, table: &Table, rows: &[Row]) -> StoreResult<u64> {
        self.write(|tx| copy::insert(tx, table, rows))
    }

    fn copy_forget(&self, table: &Table, key: i64) -> StoreResult<()> {
        self.write(|tx| copy::forget(tx, table, key))
    }

    fn copy_finished(&self, cursor: i64) -> StoreResult<()> {
        self.write(|tx| copy::rebuild_derived(tx, cursor))
    }

    /// A lock file beside the database (`…db-lock`), `flock`ed: shared by nodes, exclusive
    /// for a copy. Not the database file itself: closing another descriptor of that file would
    /// drop SQLite's own POSIX locks in this process.
    fn hold(&self, holder: Holder) -> StoreResult<Option<Hold>> {
        // The database's real path: a node and a copy that name it through different links
        // still meet on one lock file.
        let path = std::fs::canonicalize(self.path()).unwrap_or_else(|_| self.path().into());
        let mut name = path.into_os_string();
        name.push("-lock");
        let failed = |e: std::io::Error| {
            let path = std::path::Path::new(&name).display().to_string();
            StoreError::Internal(anyhow::Error::new(e).context(format!("locking {path}")))
        };
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&name)
            .map_err(failed)?;
        let locked = match holder {
            Holder::Node => file.try_lock_shared(),
            Holder::Copy => file.try_lock(),
        };
        match locked {
            Ok(()) => Ok(Some(Hold::new(file))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(failed(e)),
        }
    }
}

/// What [`crate::store::sql::ops::ops_methods`] runs the shared statements with.
impl SqliteStore {
    fn reading<T>(&self, f: impl FnOnce(&mut Sqlite<'_>) -> StoreResult<T>) -> StoreResult<T> {
        self.read(|c| f(&mut Sqlite(c)))
    }

    fn writing<T>(&self, f: impl FnOnce(&mut Sqlite<'_>) -> StoreResult<T>) -> StoreResult<T> {
        self.write(|tx| f(&mut Sqlite(tx)))
    }

    fn registry_writing<T>(
        &self,
        f: impl FnOnce(&mut Sqlite<'_>) -> StoreResult<T>,
    ) -> StoreResult<T> {
        self.registry_write(|tx| f(&mut Sqlite(tx)))
    }
}
