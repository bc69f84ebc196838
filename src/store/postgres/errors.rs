//! What a PostgreSQL error means to a caller: the database's state (down, restarting, shutting
//! down, out of connections or disk, a lock or statement timeout) is `Unavailable` (503 with
//! `Retry-After`: not acknowledged, try again); anything else is a bug or a refusal.

use postgres::error::SqlState;

use crate::store::StoreError;

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        // The client's own text is "db error" alone; the server's message is the error's
        // source. Both go into what callers show (an event's `last_error`, a log line), and
        // the client error stays underneath for `refused_by_a_constraint`.
        let message = describe(&e);
        if unavailable(&e) {
            StoreError::unavailable_because("database unavailable", e)
        } else {
            StoreError::Internal(anyhow::Error::new(e).context(message))
        }
    }
}

/// The client's error with its causes and the server's SQLSTATE, e.g. `db error: ERROR: bigint
/// out of range (SQLSTATE 22003)`: never the client's bare "db error".
pub(super) fn describe(e: &postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    if let Some(code) = e.code() {
        text.push_str(&format!(" (SQLSTATE {})", code.code()));
    }
    text
}

fn unavailable(e: &postgres::Error) -> bool {
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection itself failed (refused, reset, closed, timed out).
        return true;
    };
    let class = &code.code()[..2];
    // 08: connection exception; 53: insufficient resources (disk full, out of memory, too
    // many connections); 57: operator intervention (admin or crash shutdown, cannot connect
    // now, a statement timeout or cancel); 58: system error (I/O); 40: a serialization failure
    // or deadlock, which a new attempt resolves.
    matches!(class, "08" | "53" | "57" | "58" | "40")
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
}

/// Whether an error belongs to one event's writes (a constraint refused them, or a balance
/// would leave `bigint`) rather than to the transaction as a whole.
pub(super) fn refused_by_a_constraint(e: &StoreError) -> bool {
    let StoreError::Internal(e) = e else {
        return false;
    };
    let Some(code) = e.downcast_ref::<postgres::Error>().and_then(|e| e.code()) else {
        return false;
    };
    code.code().starts_with("23") || *code == SqlState::NUMERIC_VALUE_OUT_OF_RANGE
}
