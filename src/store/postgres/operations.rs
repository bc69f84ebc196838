//! The `Store` trait on PostgreSQL: each operation as one transaction on a pooled connection
//! (the helpers are in `mod.rs`), over the statements of the sibling modules.

use crate::store::sql;
use std::sync::Arc;

use super::session::Db;
use super::{
    PostgresStore, breaker, consume, copy, finish, hold, ingest, leases, listen, loyalty,
    migrations, off_async, purge, subscriptions,
};
use crate::store::copy::{Row, Table};
use crate::store::{
    ClaimFor, ClaimRef, Claimed, DecideExpiry, EventOrigin, Finish, Finished, Hold, Holder,
    InsertOutcome, Lane, LifecycleCounts, LoyaltyAccount, NewDelivery, Page, PurgeBatch,
    PurgeCutoffs, Readiness, StatusCounts, Store, StoreError, StoreResult, SubmitOutcome,
    SubscriptionClaim,
};
use crate::subscriptions::Subscription;

/// [`crate::store::sql::stats::event_counts_sql`] for PostgreSQL.
static EVENT_COUNTS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(crate::store::sql::stats::event_counts_sql::<super::dialect::Dialect>);

impl Store for PostgresStore {
    crate::store::sql::ops::ops_methods!();

    fn alerts(&self) -> &dyn crate::store::alerts::AlertStore {
        self
    }

    fn migrate(&self) -> StoreResult<Vec<u32>> {
        off_async(|| {
            let pool = self
                .pool
                .as_ref()
                .expect("the pool lives as long as the store");
            let mut conn = pool
                .get()
                .map_err(|e| StoreError::unavailable_because("no database connection", e))?;
            migrations::apply(&mut conn)
        })
        .inspect(|_| self.routes.forget())
    }

    fn ready(&self) -> StoreResult<Readiness> {
        self.tx(|db| {
            // A standby (or a primary that lost its disk) answers reads but refuses writes.
            let read_only: bool = db
                .query_one(
                    "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
                    &[],
                )?
                .try_get(0)?;
            Ok(if read_only {
                Readiness::NotWritable
            } else if !migrations::is_current(db)? {
                Readiness::NotMigrated
            } else {
                Readiness::Ready
            })
        })
    }

    fn on_queued(&self, wake: Arc<tokio::sync::Notify>) {
        listen::start(self.connect.clone(), wake, Arc::clone(&self.stopping));
    }

    fn insert_deliveries(&self, batch: &[NewDelivery]) -> StoreResult<Vec<InsertOutcome>> {
        if batch.iter().all(|d| d.origin != EventOrigin::Submission) {
            return self.conn(|conn| ingest::insert_webhooks(conn, batch));
        }
        self.tx(|db| ingest::insert_all(db, batch, &self.routes))
    }

    fn event_counts(&self) -> StoreResult<StatusCounts> {
        self.tx(|db| {
            let r = db.query_one(&EVENT_COUNTS, &[])?;
            Ok(crate::store::sql::stats::event_counts_of(
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                r.try_get(3)?,
            ))
        })
    }

    fn received_per_minute(&self, since: i64) -> StoreResult<Vec<(i64, i64)>> {
        self.tx(|db| sql::stats::received_per_minute(db, since))
    }

    fn claim(
        &self,
        worker: &str,
        lane: Lane,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<Vec<Claimed>> {
        self.consuming(lane == Lane::InProcess, |db, to, _| {
            consume::commit_unflushed(db, lane)?;
            let whose = ClaimFor::Lane(lane);
            consume::claim(
                db,
                &self.routes,
                None,
                to,
                worker,
                whose,
                limit,
                lease_ms,
                now,
            )
        })
    }

    fn finish(&self, items: &[Finish], now: i64) -> StoreResult<Vec<Finished>> {
        self.consuming(false, |db, _, isolate| {
            finish::finish_all(db, items, now, isolate)
        })
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
        self.consuming(lane == Lane::InProcess, |db, to, isolate| {
            consume::commit_unflushed(db, lane)?;
            let finished = finish::finish_all(db, items, now, isolate)?;
            let whose = ClaimFor::Lane(lane);
            let claimed = consume::claim(
                db,
                &self.routes,
                None,
                to,
                worker,
                whose,
                limit,
                lease_ms,
                now,
            )?;
            Ok((finished, claimed))
        })
    }

    fn release(&self, claims: &[ClaimRef], now: i64) -> StoreResult<usize> {
        self.tx(|db| leases::release(db, claims, now))
    }

    fn give_back(&self, claims: &[ClaimRef], _now: i64) -> StoreResult<usize> {
        self.tx(|db| leases::give_back(db, claims))
    }

    fn give_back_probe(&self, claim: &ClaimRef, now: i64) -> StoreResult<bool> {
        self.tx(|db| {
            let given = leases::give_back(db, std::slice::from_ref(claim))? == 1;
            if given {
                crate::store::sql::breaker::probe_now(db, claim.subscription, now)?;
            }
            Ok(given)
        })
    }

    fn sweep(&self, now: i64, decide: DecideExpiry<'_>) -> StoreResult<usize> {
        self.tx(|db| leases::sweep(db, now, decide))
    }

    fn sync_subscriptions(&self, subs: &[Subscription], now: i64) -> StoreResult<Vec<i64>> {
        let synced = self.tx(|db| subscriptions::sync(db, subs, now))?;
        self.routes.forget();
        self.finish_removed(&synced.removed, now)?;
        Ok(synced.ids)
    }

    fn prune_subscriptions(&self, now: i64, sessions_idle_before: i64) -> StoreResult<usize> {
        self.prune(now, sessions_idle_before)
    }

    fn registry_version_seen(&self) -> Option<i64> {
        self.routes.seen()
    }

    fn filtered_out(&self) -> Vec<(String, u64)> {
        self.routes.left_out().totals()
    }

    fn remove_subscription(
        &self,
        name: &str,
        sessions_only: bool,
        now: i64,
    ) -> StoreResult<Option<usize>> {
        let removed = self.tx(|db| sql::registry::remove(db, name, sessions_only, now));
        self.routes.forget();
        // Finished after the removal commits, as a sync's removals are (see `finish_removed`).
        match removed? {
            Some(id) => Ok(Some(
                self.tx(|db| subscriptions::finish_removed(db, id, now))?,
            )),
            None => Ok(None),
        }
    }

    fn claim_subscription(
        &self,
        worker: &str,
        sub: i64,
        limit: usize,
        lease_ms: i64,
        now: i64,
    ) -> StoreResult<SubscriptionClaim> {
        self.consuming(true, |db, to, _| {
            breaker::claim(db, &self.routes, to, worker, sub, limit, lease_ms, now)
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
        // One transaction: a busy forwarder's round is one commit, as on SQLite. The answers
        // come first, so that the fan-out's lock (taken by the claim) is not held over them.
        self.consuming(claim.is_some(), |db, to, isolate| {
            let finished = match items {
                [] => Vec::new(),
                items => finish::finish_all(db, items, now, isolate)?,
            };
            let claimed = match claim {
                Some(limit) => Some(breaker::claim(
                    db,
                    &self.routes,
                    to,
                    worker,
                    sub,
                    limit,
                    lease_ms,
                    now,
                )?),
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
        self.tx(|db| leases::extend(db, claims, lease_ms, now))
    }

    fn backfill(&self, name: &str, since: i64, now: i64) -> StoreResult<Option<usize>> {
        let routes = self.routes()?;
        let Some(sub) = routes.named(name) else {
            return Ok(None);
        };
        self.tx(|db| subscriptions::backfill(db, sub, since, now))
            .map(Some)
    }

    fn loyalty(&self, customer_id: &str, page: Page) -> StoreResult<LoyaltyAccount> {
        self.tx(|db| loyalty::account(db, customer_id, page))
    }

    fn purge_batch(
        &self,
        cutoffs: &PurgeCutoffs,
        after: i64,
        limit: usize,
        now: i64,
    ) -> StoreResult<PurgeBatch> {
        let (seqs, next_after) = self.tx(|db| purge::candidates(db, cutoffs, after, limit))?;
        let purged = if seqs.is_empty() {
            0
        } else {
            self.tx(|db| purge::purge(db, cutoffs, &seqs, now))?
        };
        Ok(PurgeBatch { purged, next_after })
    }

    fn tombstones_through(&self, after: i64, through: i64) -> StoreResult<bool> {
        self.tx(|db| purge::tombstones_through(db, after, through))
    }

    fn lifecycle_counts(&self) -> StoreResult<LifecycleCounts> {
        self.tx(purge::counts)
    }

    fn submit_request(&self, id: &str, now: i64) -> StoreResult<SubmitOutcome> {
        self.tx(|db| {
            sql::requests::submit(db, id, now, |db, delivery| {
                let batch = std::slice::from_ref(delivery);
                Ok(ingest::insert_all(db, batch, &self.routes)?.remove(0))
            })
        })
    }

    fn copy_in(&self, table: &Table, rows: &[Row]) -> StoreResult<u64> {
        self.tx(|db| copy::insert(db, table, rows))
    }

    fn copy_forget(&self, table: &Table, key: i64) -> StoreResult<()> {
        self.tx(|db| copy::forget(db, table, key))
    }

    fn copy_finished(&self, cursor: i64) -> StoreResult<()> {
        self.tx(|db| copy::finished(db, cursor))
    }

    /// An advisory lock on a connection of its own, outside the pool (see `hold`).
    fn hold(&self, holder: Holder) -> StoreResult<Option<Hold>> {
        off_async(|| hold::take(&self.connect, holder))
    }
}

/// What [`crate::store::sql::ops::ops_methods`] runs the shared statements with.
impl PostgresStore {
    fn reading<T: Send>(
        &self,
        f: impl FnOnce(&mut Db<'_>) -> StoreResult<T> + Send,
    ) -> StoreResult<T> {
        self.tx(f)
    }

    fn writing<T: Send>(
        &self,
        f: impl FnOnce(&mut Db<'_>) -> StoreResult<T> + Send,
    ) -> StoreResult<T> {
        self.tx(f)
    }

    fn registry_writing<T: Send>(
        &self,
        f: impl FnOnce(&mut Db<'_>) -> StoreResult<T> + Send,
    ) -> StoreResult<T> {
        let written = self.tx(f);
        self.routes.forget();
        written
    }
}
