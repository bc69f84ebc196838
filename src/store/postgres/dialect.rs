//! PostgreSQL below the shared ops statements ([`crate::store::sql`]): its dialect, and its
//! transaction as a connection they run on.

use super::session::Db;
use super::{NOW_MS, QUEUED_CHANNEL};
use crate::store::sql::{self, Conn, Params, Row, Value};
use crate::store::{Status, StoreResult};

/// The PostgreSQL dialect of the shared ops statements.
pub struct Dialect;

impl sql::Dialect for Dialect {
    fn param(n: usize) -> String {
        format!("${n}")
    }
    const NONE: &'static str = "false";
    const WAITING: &'static str = super::events::WAITING;
    const LEAST: &'static str = "least";
    const GREATEST: &'static str = "greatest";
    const STATUS_COUNTS: &'static str = super::events::STATUS_COUNTS;
    const NOW_MS: &'static str = NOW_MS;
    const NEWEST_SEQ: &'static str =
        "coalesce(pg_sequence_last_value(pg_get_serial_sequence('event_log', 'seq')), 0)";
    /// The planner picks the partial indexes itself; pending has no narrower place (the log
    /// after the cursor is one too).
    fn status_candidates(status: Status) -> Option<&'static str> {
        match status {
            Status::Failed => Some("seq IN (SELECT seq FROM event_state WHERE status = 'failed')"),
            Status::Claimed => {
                Some("seq IN (SELECT seq FROM event_state WHERE status = 'claimed')")
            }
            Status::Pending | Status::Completed | Status::Stored => None,
        }
    }
    fn route_sql(route: &crate::subscriptions::Route, alias: &str) -> String {
        super::subscriptions::route_sql(route, alias)
    }
    fn filter_on(filter: &crate::subscriptions::filter::Filter, seq: &str) -> String {
        let test = crate::store::filters::filter_sql(
            filter,
            &crate::store::filters::Postgres { body: "j.body" },
        );
        format!(
            "EXISTS (SELECT 1 FROM (SELECT webhook_inbox_json_body(p.payload) AS body
                                      FROM event_payloads p WHERE p.seq = {seq}) j
                      WHERE {test})"
        )
    }
    fn in_list(param: &str) -> String {
        format!("= ANY({param})")
    }
    fn lock(table: &str) -> String {
        format!("FOR UPDATE OF {table}")
    }
    fn indexed_by(_index: &str) -> String {
        String::new()
    }
    fn json_texts(column: &str, alias: &str) -> String {
        format!("json_array_elements_text({column}::json) AS {alias}(value)")
    }
    fn json_agg(expr: &str) -> String {
        format!("coalesce(json_agg({expr} ORDER BY {expr})::text, '[]')")
    }
    /// The database's clock: the claims compare due times with it.
    fn due_now(_params: &mut Params<Self>, _now: i64) -> String {
        NOW_MS.to_string()
    }
}

impl Conn for Db<'_> {
    type Dialect = Dialect;

    fn execute(&mut self, sql: &str, params: &[Value]) -> StoreResult<u64> {
        let sql = sql::conn::numbered_for_postgres(sql);
        Db::execute(self, &sql, &sql::pg_params(params))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> StoreResult<Vec<Row>> {
        let sql = sql::conn::numbered_for_postgres(sql);
        let rows = Db::query(self, &sql, &sql::pg_params(params))?;
        rows.iter().map(sql::conn::pg_row).collect()
    }

    fn lock_registry(&mut self) -> StoreResult<()> {
        super::subscriptions::lock_registry(self)
    }

    fn queued(&mut self) -> StoreResult<()> {
        self.batch(&format!("NOTIFY {QUEUED_CHANNEL}"))
    }
}
