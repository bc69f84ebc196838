//! `GET /events`' filters and paging, and the bulk retry's selection, for both stores.

use super::{Dialect, Params, Value};
use crate::store::routes::Live;
use crate::store::{EventFilter, FAILED_AT, Page};

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
        (Some(Some(sub)), status) => {
            // An event not fanned out yet is the subscription's if its route and its filter
            // will take it (a filter that leaves it out gives it no state).
            let takes = match &sub.filter {
                None => D::route_sql(&sub.route, ""),
                Some(f) => format!(
                    "({} AND {})",
                    D::route_sql(&sub.route, ""),
                    D::filter_on(f, "events.seq")
                ),
            };
            clauses.push(crate::store::routes::subscription_clause(
                sub,
                status,
                super::WAITS,
                &takes,
            ))
        }
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
