//! The consumer side's turns at the one write connection: a consumer transaction waits for
//! its turn behind ingest and ops writes, and claims less while they are busy.

use std::sync::atomic::Ordering;

use rusqlite::Transaction;

use super::{Durability, SqliteStore, finish};
use crate::store::{StoreError, StoreResult};

impl SqliteStore {
    /// A consumer transaction that finishes a batch (see [`finish::finish_all`]): run first
    /// without savepoints, and again with a savepoint per event only if the database refused
    /// an effect, the first attempt rolled back.
    pub(super) fn finishing<T>(
        &self,
        f: impl Fn(&mut Transaction<'_>, bool) -> StoreResult<T>,
    ) -> StoreResult<T> {
        match self.consumer_write(|tx| f(tx, false)) {
            Err(e) if finish::refused_by_a_constraint(&e) => self.consumer_write(|tx| f(tx, true)),
            other => other,
        }
    }

    /// `write` for the consumer side, one consumer transaction in the writer's queue at a time.
    pub(super) fn consumer_write<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let _turn = self
            .consumer_turn
            .try_lock_for(self.wait)
            .ok_or_else(|| StoreError::unavailable("timed out waiting for a consumer turn"))?;
        let conn = self.lock_writer()?;
        let (value, ticket) = self.commit(conn, Durability::Shared, f)?;
        self.last_consumer_write
            .store(self.tick(), Ordering::SeqCst);
        // The next consumer may take its turn while this one waits for the disk.
        drop(_turn);
        self.sync.wait(ticket)?;
        Ok(value)
    }

    /// How many events a consumer may claim now: an eighth of its batch while other writes
    /// wait for the writer or have just committed (decided once the consumer holds it). A
    /// batch's completion holds the write lock in proportion to its size, and a delivery waits
    /// for that lock: with 500,000 events, `batch_size` 256 drained 1.21 times as fast as 128,
    /// while ingest beside a drain had a p99 of 20 to 211 ms with a quarter of 256 against 13
    /// to 15 ms with a quarter of 128, that is 32 (docs/performance.md, fifth round).
    pub(super) fn claim_limit(&self, limit: usize) -> usize {
        if self.recent_other_write() || self.others_waiting.load(Ordering::SeqCst) > 0 {
            limit.div_ceil(8)
        } else {
            limit
        }
    }
}
