//! What the two stores' ops SQL shares, written once above their dialects (issue 59): a value
//! either driver binds and one row reader ([`conn`]), the few places where the two dialects
//! differ ([`Dialect`], implemented in each store's `dialect.rs`), and the statements built
//! over them: `GET /events`' filters ([`events`]), the event views ([`view`]), retries
//! ([`retry`]), requests, the registry and its lists, secrets, refused deliveries, the
//! breaker's opening and closing, held keys and skips ([`ordering`]), the copy's reads, the
//! alerts' reads, the overview's counts and receipts per minute ([`stats`]). The hot paths (ingest,
//! fan-out, claim, finish, leases) stay per store, each with its measured tuning; what is here
//! is the ops half, where the two were the same logic written twice.

pub mod alerts;
pub mod breaker;
pub mod conn;
pub mod copy;
pub mod events;
pub mod ops;
pub mod ordering;
pub mod registry;
pub mod rejections;
pub mod requests;
pub mod retry;
pub mod secrets;
pub mod stats;
pub mod subscriptions;
pub mod view;

pub use conn::{Conn, Row, Value, pg_params};
pub use events::{events_page, events_where, failed_states, retry_events_filter};

use crate::store::Status;
use crate::subscriptions::Route;

/// The fan-out's cursor (the last `seq` fanned out), a scalar subquery: one row, of id 0, under
/// one name on both stores (SQLite's migration 0024).
pub const CURSOR: &str = "(SELECT after_seq FROM queue_cursor WHERE id = 0)";

/// The events waiting for their fan-out (webhooks' events after the cursor), on `events`.
pub const WAITS: &str =
    "(lane = 0 AND events.seq > (SELECT after_seq FROM queue_cursor WHERE id = 0))";

/// Where the two stores' SQL differs in what the shared statements need.
pub trait Dialect {
    /// The `n`th parameter (from 1).
    fn param(n: usize) -> String;
    /// A condition that holds for no row.
    const NONE: &'static str;
    /// How many events wait for their fan-out, and when the first of them was received: one
    /// row of two columns, read without routing them.
    const WAITING: &'static str;
    /// The smaller and the larger of two values, as functions (SQLite's `min` and `max` of
    /// several arguments, PostgreSQL's `least` and `greatest`).
    const LEAST: &'static str;
    const GREATEST: &'static str;
    /// The counts `/metrics` reports, one row read by [`stats::status_counts`]: state rows,
    /// pending ones, events waiting for their fan-out, claimed, failed, the first due time,
    /// the sessions' pending ones. Per store: each reads the indexes its planner needs.
    const STATUS_COUNTS: &'static str;
    /// The database's clock in unix milliseconds (PostgreSQL: shared by every node).
    const NOW_MS: &'static str;
    /// The last `seq` the log has given, an expression: a new subscription takes what follows.
    const NEWEST_SEQ: &'static str;
    /// Where the events of a status can be, read from the state table's partial indexes (and
    /// the log after the cursor for pending): a condition on `events.seq` that narrows the scan
    /// before `status` is tested. `None` for a status with no narrower place.
    fn status_candidates(status: Status) -> Option<&'static str>;
    /// A route as a condition on `{alias}source` and `{alias}event_type`.
    fn route_sql(route: &Route, alias: &str) -> String;
    /// Whether `filter` takes the body of the event at `seq` (an expression), as the fan-out
    /// will decide it: for the events not fanned out yet, which have no state to read.
    fn filter_on(filter: &crate::subscriptions::filter::Filter, seq: &str) -> String;
    /// A test that a column is in the list bound at `param` (a [`Value::Ints`]).
    fn in_list(param: &str) -> String;
    /// The rows read are locked to the commit, those of `table` (an alias) only: what reads
    /// then writes them in one transaction is not raced by another node (SQLite: nothing, its
    /// write transaction is alone).
    fn lock(table: &str) -> String;
    /// An index the statement must read `table` through (SQLite's planner, shown a scan of
    /// the state table as cheap, picks it).
    fn indexed_by(index: &str) -> String;
    /// The strings of the JSON array `column` as a table aliased `alias`, its one column
    /// `value`.
    fn json_texts(column: &str, alias: &str) -> String;
    /// The values of `expr` in a group as one JSON array (text).
    fn json_agg(expr: &str) -> String;
    /// When a retried state is due: now by the clock the claims compare with (SQLite: the
    /// caller's `now`, bound; PostgreSQL: the database's).
    fn due_now(params: &mut Params<Self>, now: i64) -> String
    where
        Self: Sized;
}

/// The values of a statement being built, each bound where [`Params::bind`] says.
pub struct Params<D> {
    pub values: Vec<Value>,
    dialect: std::marker::PhantomData<D>,
}

impl<D: Dialect> Default for Params<D> {
    fn default() -> Self {
        Params {
            values: Vec::new(),
            dialect: std::marker::PhantomData,
        }
    }
}

impl<D: Dialect> Params<D> {
    /// Bind `value`: its placeholder.
    pub fn bind(&mut self, value: Value) -> String {
        self.values.push(value);
        D::param(self.values.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EventFilter, Page};

    struct Numbered;
    impl Dialect for Numbered {
        fn param(n: usize) -> String {
            format!("${n}")
        }
        const NONE: &'static str = "false";
        const WAITING: &'static str = "waiting";
        const LEAST: &'static str = "least";
        const GREATEST: &'static str = "greatest";
        const STATUS_COUNTS: &'static str = "counts";
        const NOW_MS: &'static str = "now";
        const NEWEST_SEQ: &'static str = "newest";
        fn status_candidates(_: Status) -> Option<&'static str> {
            Some("candidates")
        }
        fn route_sql(_: &Route, _: &str) -> String {
            "route".into()
        }
        fn filter_on(_: &crate::subscriptions::filter::Filter, seq: &str) -> String {
            format!("filter({seq})")
        }
        fn in_list(p: &str) -> String {
            format!("IN {p}")
        }
        fn lock(_: &str) -> String {
            String::new()
        }
        fn indexed_by(_: &str) -> String {
            String::new()
        }
        fn json_texts(c: &str, a: &str) -> String {
            format!("{c} {a}")
        }
        fn json_agg(e: &str) -> String {
            e.into()
        }
        fn due_now(params: &mut Params<Self>, now: i64) -> String {
            params.bind(Value::Int(now))
        }
    }

    #[test]
    fn a_page_binds_each_value_once_in_the_order_of_its_placeholders() {
        let filter = EventFilter {
            status: Some(Status::Failed),
            source: Some("shop".into()),
            received_after: Some(5),
            ..EventFilter::default()
        };
        let page = Page {
            limit: 50,
            before_seq: Some(9),
        };
        let mut params = Params::<Numbered>::default();
        let sql = events_page(None, &filter, page, ("seq", "events"), &mut params);
        assert_eq!(
            sql,
            "SELECT seq FROM events WHERE purged_at IS NULL AND candidates AND status = $1 \
             AND source = $2 AND received_at > $3 AND seq < $4 ORDER BY seq DESC LIMIT $5"
        );
        assert_eq!(
            params.values,
            [
                Value::Text("failed".into()),
                Value::Text("shop".into()),
                Value::Int(5),
                Value::Int(9),
                Value::Int(50)
            ]
        );
        let unknown = events_where(Some(None), &filter, &mut Params::<Numbered>::default());
        assert!(unknown.contains("false"), "{unknown}");
    }
}
