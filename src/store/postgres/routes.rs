//! The live subscriptions' routes on PostgreSQL, as a node keeps them: each one's route and
//! filter compiled to SQL for the fan-out, the claims and backfill (as on SQLite; globs become
//! `LIKE` patterns), and the cache checked against the registry's version.

use std::sync::Arc;
use std::time::Instant;

use super::session::Db;
use crate::store::StoreResult;
use crate::store::routes;
use crate::subscriptions::Route;

pub(super) use crate::store::routes::Live;

#[derive(Debug, Clone, Default)]
pub(super) struct Routes {
    pub live: Vec<Live>,
    /// When each ordered subscription's claim last read its whole backlog.
    pub whole_looks: Arc<parking_lot::Mutex<std::collections::HashMap<i64, Instant>>>,
    /// The registry's version these were read at.
    pub version: i64,
    /// What the fan-outs left out of filtered subscriptions (the cache's, shared by each
    /// version of the routes).
    pub left_out: Arc<crate::store::filters::LeftOut>,
}

/// The live subscriptions' routes a node keeps, and the registry's version they were read at;
/// and what its fan-outs left out of filtered subscriptions.
#[derive(Debug, Default)]
pub(super) struct RouteCache(
    parking_lot::RwLock<Option<Arc<Routes>>>,
    Arc<crate::store::filters::LeftOut>,
);

impl RouteCache {
    /// The kept routes (read in `db`'s transaction the first time), not checked against the
    /// registry: for a caller that checks them itself ([`Self::at`]).
    pub fn kept(&self, db: &mut Db<'_>) -> StoreResult<Arc<Routes>> {
        // Bound first: a guard in the match's scrutinee would live through `reload`'s write.
        let kept = self.0.read().clone();
        match kept {
            Some(routes) => Ok(routes),
            None => self.reload(db),
        }
    }

    /// The routes of the registry's `version` (read by the caller in `db`'s transaction): the
    /// kept ones if they are that version's, else read again in `db`'s transaction.
    pub fn at(&self, db: &mut Db<'_>, version: i64) -> StoreResult<Arc<Routes>> {
        let kept = self.0.read().clone();
        match kept {
            Some(routes) if routes.version == version => Ok(routes),
            _ => self.reload(db),
        }
    }

    /// The routes as the registry holds them in `db`'s transaction (its version read first).
    pub fn current(&self, db: &mut Db<'_>) -> StoreResult<Arc<Routes>> {
        let version = registry_version(db)?;
        self.at(db, version)
    }

    fn reload(&self, db: &mut Db<'_>) -> StoreResult<Arc<Routes>> {
        let routes = Arc::new(Routes {
            left_out: Arc::clone(&self.1),
            ..load(db)?
        });
        *self.0.write() = Some(Arc::clone(&routes));
        Ok(routes)
    }

    /// The version of the kept routes, if any.
    pub fn seen(&self) -> Option<i64> {
        self.0.read().as_ref().map(|r| r.version)
    }

    pub fn left_out(&self) -> &crate::store::filters::LeftOut {
        &self.1
    }

    /// Forget the routes: the next use reads them again.
    pub fn forget(&self) {
        *self.0.write() = None;
    }
}

/// A claim reads an ordered subscription's whole backlog at most this often.
const WHOLE_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl Routes {
    /// Whether a claim of `sub` may read its whole backlog now (and if so, it is noted).
    pub fn whole_look_due(&self, sub: i64) -> bool {
        let now = Instant::now();
        let mut looks = self.whole_looks.lock();
        match looks.get(&sub) {
            Some(last) if now.duration_since(*last) < WHOLE_LOOK_EVERY => false,
            _ => {
                looks.insert(sub, now);
                true
            }
        }
    }

    pub fn named(&self, name: &str) -> Option<&Live> {
        self.live.iter().find(|s| s.name == name)
    }

    /// Whether subscription `u` takes an event, as one SQL expression over `{alias}source`,
    /// `{alias}event_type` and, for a filtered one, `j.body` (the body as jsonb, NULL when it
    /// is not JSON: see [`Routes::bodies`]), picked by `u.id` (for a join with `subscriptions
    /// u`).
    pub fn by_id(&self, alias: &str) -> String {
        if self.live.is_empty() {
            return "false".into();
        }
        let arms: String = self
            .live
            .iter()
            .map(|s| format!(" WHEN {} THEN {}", s.id, takes_sql(s, alias, "j.body")))
            .collect();
        format!("(CASE u.id{arms} ELSE false END)")
    }

    /// Whether any live subscription has a filter: only then does a fan-out read the bodies.
    pub fn filtered(&self) -> bool {
        self.live.iter().any(|s| s.filter.is_some())
    }

    /// The bodies a fan-out's filters read, as rows `(seq, body)` of the events `{alias}seq`
    /// of `from` (those that meet `only`) that a filtered subscription's route takes (the
    /// others' bodies are never parsed): for a `LEFT JOIN … j ON j.seq = …`.
    pub fn bodies(&self, from: &str, alias: &str, only: &str) -> String {
        let wanted: Vec<String> = self
            .live
            .iter()
            .filter(|s| s.filter.is_some())
            .map(|s| {
                format!(
                    "({alias}seq > {} AND {})",
                    s.start_after_seq,
                    route_sql(&s.route, alias)
                )
            })
            .collect();
        let wanted = if wanted.is_empty() {
            "false".to_string()
        } else {
            wanted.join(" OR ")
        };
        format!(
            "SELECT {alias}seq AS seq, webhook_inbox_json_body(p.payload) AS body
               FROM {from} JOIN event_payloads p ON p.seq = {alias}seq
              WHERE {only} AND ({wanted})"
        )
    }

    /// The order key of the body `payload` (an expression) for subscription `u`: NULL but for
    /// ordered ones (see `webhook_inbox_order_key`, migration 0005).
    pub fn keys_by_id(&self, payload: &str) -> String {
        let arms: String = self
            .live
            .iter()
            .filter_map(|s| Some((s.id, s.ordered.as_ref()?)))
            .map(|(id, o)| format!(" WHEN {id} THEN {}", key_sql(o, payload)))
            .collect();
        if arms.is_empty() {
            "NULL::text".into()
        } else {
            format!("(CASE u.id{arms} ELSE NULL END)")
        }
    }
}

/// The order key of the body `payload` (an expression) for ordered subscription `o`.
pub(super) fn key_sql(o: &routes::Ordered, payload: &str) -> String {
    let path: Vec<String> = o
        .path
        .iter()
        .map(|k| crate::store::filters::e_quote(k))
        .collect();
    format!(
        "webhook_inbox_order_key({payload}, ARRAY[{}]::text[])",
        path.join(", ")
    )
}

/// A glob (`*`, `?`) as a `LIKE` pattern with `\` as its escape.
fn like(glob: &str) -> String {
    let mut out = String::with_capacity(glob.len() + 4);
    for c in glob.chars() {
        match c {
            '*' => out.push('%'),
            '?' => out.push('_'),
            '%' | '_' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether `s` takes an event: its route on `{alias}source` and `{alias}event_type`, then its
/// filter on `body` (jsonb); a subscription without a filter costs what its route costs.
pub(super) fn takes_sql(s: &Live, alias: &str, body: &str) -> String {
    let route = route_sql(&s.route, alias);
    match &s.filter {
        None => route,
        Some(filter) => format!(
            "(CASE WHEN {route} THEN {} ELSE false END)",
            crate::store::filters::filter_sql(filter, &crate::store::filters::Postgres { body })
        ),
    }
}

/// A route as an SQL condition on `{alias}source` and `{alias}event_type`, globs as `LIKE`.
pub(super) fn route_sql(route: &Route, alias: &str) -> String {
    routes::route_sql(route, alias, |column, glob| {
        format!("{column} LIKE {} ESCAPE '\\'", routes::quote(&like(glob)))
    })
}

pub(super) fn load(db: &mut Db<'_>) -> StoreResult<Routes> {
    let version = registry_version(db)?;
    let live = crate::store::sql::registry::live(db)?;
    Ok(Routes {
        live,
        whole_looks: Arc::default(),
        version,
        left_out: Arc::default(),
    })
}

/// The registry's version now (see migration 0007), in the caller's transaction.
pub(super) fn registry_version(db: &mut Db<'_>) -> StoreResult<i64> {
    Ok(db
        .query_one(
            "SELECT version FROM subscription_registry WHERE id = 0",
            &[],
        )?
        .try_get(0)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn globs_become_like_patterns_that_mean_the_same() {
        assert_eq!(super::like("invoice.*"), "invoice.%");
        assert_eq!(super::like("a?c"), "a_c");
        assert_eq!(super::like("100%_off\\"), "100\\%\\_off\\\\");
    }
}
