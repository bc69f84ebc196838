//! [`Store::hold`](crate::store::Store::hold) on PostgreSQL: an advisory lock on a connection
//! of its own, outside the pool, held as long as the [`Hold`]: shared by the nodes, exclusive
//! for a copy. (Should the server drop that connection, say by restarting, the node serves on
//! without it.)

use super::off_async;
use crate::store::{Hold, Holder, StoreResult};

/// The advisory lock key ("webhook!" in ASCII).
const HOLD_KEY: i64 = 0x7765_6268_6f6f_6b21;

/// Take the hold (call off any async runtime); `None` while the other kind holds it.
pub(super) fn take(connect: &super::session::Connect, holder: Holder) -> StoreResult<Option<Hold>> {
    let mut client = connect.connect()?;
    let sql = match holder {
        Holder::Node => "SELECT pg_try_advisory_lock_shared($1)",
        Holder::Copy => "SELECT pg_try_advisory_lock($1)",
    };
    let held: bool = client.query_one(sql, &[&HOLD_KEY])?.try_get(0)?;
    Ok(held.then(|| Hold::new(HeldConnection(Some(client)))))
}

/// The connection that holds an advisory lock; closing it lets go.
struct HeldConnection(Option<postgres::Client>);

impl Drop for HeldConnection {
    fn drop(&mut self) {
        // Closing a client blocks on its connection: off any async runtime.
        if let Some(client) = self.0.take() {
            off_async(move || drop(client));
        }
    }
}
