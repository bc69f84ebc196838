//! SQLite below the shared ops statements ([`crate::store::sql`]): its dialect, and a
//! connection they run on.

use rusqlite::types::ValueRef;

use super::subscriptions::route_sql;
use crate::store::sql::{self, Conn, Params, Row, Value};
use crate::store::{Status, StoreResult};

/// The SQLite dialect of the shared ops statements.
pub struct Dialect;

impl sql::Dialect for Dialect {
    fn param(n: usize) -> String {
        format!("?{n}")
    }
    const NONE: &'static str = "0";
    /// Counted from the log's numbering (no gaps: migration 0009) less the submitted requests
    /// after the cursor (their own partial index), without reading the log.
    const WAITING: &'static str = "SELECT (SELECT ifnull(max(seq), 0) FROM event_log) - q.after_seq
            - (SELECT count(*) FROM event_log INDEXED BY event_log_requests
                WHERE lane = 1 AND seq > q.after_seq),
            (SELECT received_at FROM event_log WHERE seq > q.after_seq AND lane = 0
              ORDER BY seq LIMIT 1)
       FROM queue_cursor q WHERE q.id = 0";
    const LEAST: &'static str = "min";
    const GREATEST: &'static str = "max";
    const STATUS_COUNTS: &'static str = super::events::STATUS_COUNTS;
    const NOW_MS: &'static str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    const NEWEST_SEQ: &'static str = "(SELECT ifnull(max(seq), 0) FROM event_log)";
    /// Named indexes, so that the planner cannot pick a scan of the state table.
    fn status_candidates(status: Status) -> Option<&'static str> {
        match status {
            Status::Failed => Some(
                "seq IN (SELECT seq FROM event_state INDEXED BY events_failed WHERE status = 'failed')",
            ),
            Status::Claimed => Some(
                "seq IN (SELECT seq FROM event_state INDEXED BY events_leases WHERE status = 'claimed')",
            ),
            Status::Pending => Some(
                "(seq IN (SELECT seq FROM event_state INDEXED BY events_due WHERE status = 'pending')
                  OR seq > (SELECT after_seq FROM queue_cursor WHERE id = 0))",
            ),
            Status::Completed | Status::Stored => None,
        }
    }
    fn route_sql(route: &crate::subscriptions::Route, alias: &str) -> String {
        route_sql(route, alias)
    }
    fn filter_on(filter: &crate::subscriptions::filter::Filter, seq: &str) -> String {
        let body = format!("(SELECT CAST(payload AS TEXT) FROM event_log WHERE seq = {seq})");
        crate::store::filters::filter_sql(filter, &crate::store::filters::Sqlite { body: &body })
    }
    fn in_list(param: &str) -> String {
        format!("IN (SELECT value FROM json_each({param}))")
    }
    fn lock(_table: &str) -> String {
        String::new()
    }
    fn indexed_by(index: &str) -> String {
        format!("INDEXED BY {index}")
    }
    fn json_texts(column: &str, alias: &str) -> String {
        format!("json_each({column}) AS {alias}")
    }
    fn json_agg(expr: &str) -> String {
        format!("json_group_array({expr})")
    }
    fn due_now(params: &mut Params<Self>, now: i64) -> String {
        params.bind(Value::Int(now))
    }
}

/// A SQLite connection (or a transaction, through its `Deref`).
pub struct Sqlite<'c>(pub &'c rusqlite::Connection);

impl Conn for Sqlite<'_> {
    type Dialect = Dialect;

    fn execute(&mut self, sql: &str, params: &[Value]) -> StoreResult<u64> {
        let changed = self
            .0
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(params))?;
        Ok(changed as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> StoreResult<Vec<Row>> {
        let mut statement = self.0.prepare_cached(sql)?;
        let columns = statement.column_count();
        let rows = statement.query_map(rusqlite::params_from_iter(params), |r| {
            (0..columns)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        ValueRef::Null => Value::Null,
                        ValueRef::Integer(v) => Value::Int(v),
                        // No shared statement reads a REAL.
                        ValueRef::Real(v) => Value::Text(v.to_string()),
                        ValueRef::Text(v) => Value::Text(String::from_utf8_lossy(v).into_owned()),
                        ValueRef::Blob(v) => Value::Bytes(v.to_vec()),
                    })
                })
                .collect::<rusqlite::Result<Vec<_>>>()
                .map(Row::new)
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn lock_registry(&mut self) -> StoreResult<()> {
        Ok(())
    }

    fn queued(&mut self) -> StoreResult<()> {
        Ok(())
    }
}
