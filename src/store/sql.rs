//! What the two stores' ops SQL shares, written once above their dialects (issue 59): a value
//! either driver binds, the few places where the two dialects differ ([`Dialect`]), and the
//! statements built over them. The hot paths (ingest, fan-out, claim, finish, leases) stay per
//! store, each with its measured tuning; what is here is the ops half, where the two were the
//! same logic written twice.

use crate::store::routes::Live;
use crate::store::{EventFilter, FAILED_AT, Page, Status};
use crate::subscriptions::Route;

/// A value bound to a statement, the same for both stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Int(i64),
    Text(String),
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Value::Int(i) => i.to_sql(),
            Value::Text(s) => s.to_sql(),
        }
    }
}

/// The values as the `postgres` driver takes them.
pub fn pg_params(values: &[Value]) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    values
        .iter()
        .map(|v| match v {
            Value::Int(i) => i as &(dyn postgres::types::ToSql + Sync),
            Value::Text(s) => s as &(dyn postgres::types::ToSql + Sync),
        })
        .collect()
}

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

/// The `WHERE` clause of `GET /events` on the `events` view, for `filter`. `subscription` is
/// the filter's subscription as the store's live ones name it (`Some(None)`: a name no live
/// subscription has, which matches nothing); with one, `status` is its state of the event.
pub fn events_where<D: Dialect>(
    subscription: Option<Option<&Live>>,
    filter: &EventFilter,
    params: &mut Params<D>,
) -> String {
    let mut clauses: Vec<String> = vec![
        if filter.purged {
            "purged_at IS NOT NULL"
        } else {
            "purged_at IS NULL"
        }
        .into(),
    ];
    match (subscription, filter.status) {
        (Some(None), _) => clauses.push(D::NONE.into()),
        (Some(Some(sub)), status) => clauses.push(crate::store::routes::subscription_clause(
            sub,
            status,
            D::WAITS,
            &D::route_sql(&sub.route, ""),
        )),
        (None, Some(s)) => {
            clauses.extend(D::status_candidates(s).map(str::to_string));
            clauses.push(format!(
                "status = {}",
                params.bind(Value::Text(s.as_str().into()))
            ));
        }
        (None, None) => {}
    }
    if let Some(s) = &filter.source {
        clauses.push(format!("source = {}", params.bind(Value::Text(s.clone()))));
    }
    if let Some(t) = &filter.event_type {
        clauses.push(format!(
            "event_type = {}",
            params.bind(Value::Text(t.clone()))
        ));
    }
    if let Some(t) = filter.received_after {
        clauses.push(format!("received_at > {}", params.bind(Value::Int(t))));
    }
    if let Some(t) = filter.received_before {
        clauses.push(format!("received_at < {}", params.bind(Value::Int(t))));
    }
    clauses.join(" AND ")
}

/// One page of `GET /events` (newest first by `seq`, below the page's cursor): `columns` of
/// `from`, which has the `events` view's columns.
pub fn events_page<D: Dialect>(
    subscription: Option<Option<&Live>>,
    filter: &EventFilter,
    page: Page,
    (columns, from): (&str, &str),
    params: &mut Params<D>,
) -> String {
    let mut clause = events_where(subscription, filter, params);
    if let Some(before) = page.before_seq {
        clause = format!("{clause} AND seq < {}", params.bind(Value::Int(before)));
    }
    let limit = params.bind(Value::Int(i64::try_from(page.limit).unwrap_or(i64::MAX)));
    format!("SELECT {columns} FROM {from} WHERE {clause} ORDER BY seq DESC LIMIT {limit}")
}

/// What a bulk retry (a recover) adds on the failed state `s`: only the filter's subscription
/// (`None`: a name no live subscription has, so nothing), and only what failed since the
/// filter's `failed_since`.
pub fn failed_states<D: Dialect>(
    subscription: Option<Option<&Live>>,
    filter: &EventFilter,
    params: &mut Params<D>,
) -> Option<String> {
    let only = match subscription {
        Some(Some(sub)) => format!("AND s.sub = {}", sub.id),
        Some(None) => return None,
        None => String::new(),
    };
    let since = match filter.failed_since {
        Some(t) => format!("AND ({FAILED_AT}) >= {}", params.bind(Value::Int(t))),
        None => String::new(),
    };
    Some(format!("{only} {since}"))
}

/// The event filter a bulk retry reads the events by: the filter less what
/// [`failed_states`] decides on the state (its subscription, status and time) and less
/// tombstones.
pub fn retry_events_filter(filter: &EventFilter) -> EventFilter {
    EventFilter {
        status: None,
        purged: false,
        subscription: None,
        failed_since: None,
        ..filter.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
