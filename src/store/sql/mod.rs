//! What the two stores' ops SQL shares, written once above their dialects (issue 59): a value
//! either driver binds and one row reader ([`conn`]), the few places where the two dialects
//! differ ([`Dialect`]), and the statements built over them ([`events`], [`rejections`],
//! [`stats`]). The hot paths (ingest, fan-out, claim, finish, leases) stay per store, each with
//! its measured tuning; what is here is the ops half, where the two were the same logic written
//! twice.

pub mod conn;
pub mod events;
pub mod rejections;
pub mod stats;

pub use conn::{Conn, Row, Value, pg_params};
pub use events::{events_page, events_where, failed_states, retry_events_filter};

use crate::store::Status;
use crate::subscriptions::Route;

/// Where the two stores' SQL differs in what the shared statements need.
pub trait Dialect {
    /// The `n`th parameter (from 1).
    fn param(n: usize) -> String;
    /// A condition that holds for no row.
    const NONE: &'static str;
    /// The events waiting for their fan-out (lane 0, after the cursor), on `events`.
    const WAITS: &'static str;
    /// Where the events of a status can be, read from the state table's partial indexes (and
    /// the log after the cursor for pending): a condition on `events.seq` that narrows the scan
    /// before `status` is tested. `None` for a status with no narrower place.
    fn status_candidates(status: Status) -> Option<&'static str>;
    /// A route as a condition on `{alias}source` and `{alias}event_type`.
    fn route_sql(route: &Route, alias: &str) -> String;
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
        const WAITS: &'static str = "waits";
        fn status_candidates(_: Status) -> Option<&'static str> {
            Some("candidates")
        }
        fn route_sql(_: &Route, _: &str) -> String {
            "route".into()
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
