//! The ops methods of [`Store`](crate::store::Store), written once for both stores.
//!
//! Each is a statement of `store::sql` on a connection, and the two stores differ only in how
//! they reach one: SQLite reads on a pooled connection and writes in its one write
//! transaction, PostgreSQL runs each in a transaction on a pooled connection. `Store` is one
//! object-safe trait, so a blanket implementation over a "connection source" trait would
//! have to split it in two for every caller; instead [`ops_methods!`] expands to the methods
//! inside each store's `impl Store`, over four inherent methods the store provides:
//! - `reading(f)`: `f` on a connection for reads;
//! - `writing(f)`: `f` in a write transaction;
//! - `registry_writing(f)`: a write of the registry, after which the routes the store keeps
//!   are read again;
//! - `routes()`: the live subscriptions the store keeps (`live`, `version`, `named`), checked
//!   against the registry's version.

/// The ops methods, for inside `impl Store for …` (see the module's documentation).
macro_rules! ops_methods {
    () => {
        fn event(
            &self,
            source: &str,
            event_id: &str,
        ) -> $crate::store::StoreResult<Option<$crate::store::EventDetail>> {
            let routes = self.routes()?;
            self.reading(|c| $crate::store::sql::view::detail(c, &routes.live, source, event_id))
        }

        fn list_events(
            &self,
            filter: &$crate::store::EventFilter,
            page: $crate::store::Page,
        ) -> $crate::store::StoreResult<Vec<$crate::store::EventRecord>> {
            let routes = self.routes()?;
            self.reading(|c| $crate::store::sql::view::list(c, &routes.live, filter, page))
        }

        fn export_events(
            &self,
            filter: &$crate::store::EventFilter,
            page: $crate::store::Page,
        ) -> $crate::store::StoreResult<Vec<$crate::store::ExportedEvent>> {
            let routes = self.routes()?;
            self.reading(|c| $crate::store::sql::view::export(c, &routes.live, filter, page))
        }

        fn retry(
            &self,
            source: &str,
            event_id: &str,
            subscription: Option<&str>,
            force: bool,
            now: i64,
        ) -> $crate::store::StoreResult<$crate::store::RetryOutcome> {
            let routes = self.routes()?;
            let sub = match subscription {
                Some(name) => match routes.named(name) {
                    Some(live) => Some(live.id),
                    None => return Ok($crate::store::RetryOutcome::NotFound),
                },
                None => None,
            };
            self.writing(|c| {
                let live = &routes.live;
                $crate::store::sql::retry::retry(c, live, source, event_id, sub, force, now)
            })
        }

        fn retry_failed(
            &self,
            filter: &$crate::store::EventFilter,
            now: i64,
        ) -> $crate::store::StoreResult<usize> {
            let routes = self.routes()?;
            self.writing(|c| $crate::store::sql::retry::retry_failed(c, &routes.live, filter, now))
        }

        fn node_seen(
            &self,
            node: &str,
            subscriptions: &[String],
            now: i64,
        ) -> $crate::store::StoreResult<()> {
            self.writing(|c| {
                $crate::store::sql::subscriptions::node_seen(c, node, subscriptions, now)
            })
        }

        fn node_gone(&self, node: &str) -> $crate::store::StoreResult<()> {
            self.writing(|c| $crate::store::sql::subscriptions::node_gone(c, node))
        }

        fn subscriptions(
            &self,
            completed: bool,
        ) -> $crate::store::StoreResult<Vec<$crate::store::SubscriptionInfo>> {
            self.reading(|c| $crate::store::sql::subscriptions::list(c, completed))
        }

        fn registry_at(
            &self,
        ) -> $crate::store::StoreResult<(i64, Vec<$crate::store::routes::Live>)> {
            let routes = self.routes()?;
            Ok((routes.version, routes.live.clone()))
        }

        fn registry(&self) -> $crate::store::StoreResult<Vec<$crate::store::routes::Live>> {
            Ok(self.routes()?.live.clone())
        }

        fn subscription_ids(&self) -> $crate::store::StoreResult<Vec<(i64, String)>> {
            Ok(self
                .routes()?
                .live
                .iter()
                .map(|s| (s.id, s.name.clone()))
                .collect())
        }

        fn session_seen(&self, sub: i64, now: i64) -> $crate::store::StoreResult<()> {
            self.writing(|c| $crate::store::sql::registry::session_seen(c, sub, now))
        }

        fn create_subscription(
            &self,
            sub: &$crate::subscriptions::Subscription,
            secrets: &[($crate::store::secrets::Purpose, String)],
            origin: &str,
            now: i64,
        ) -> $crate::store::StoreResult<$crate::store::registry::Created> {
            self.registry_writing(|c| {
                $crate::store::sql::registry::create(c, sub, secrets, origin, now)
            })
        }

        fn update_subscription(
            &self,
            name: &str,
            change: $crate::store::registry::Change<'_>,
        ) -> $crate::store::StoreResult<$crate::store::registry::Updated> {
            self.registry_writing(|c| $crate::store::sql::registry::update(c, name, change))
        }

        fn set_paused(&self, name: &str, paused: bool) -> $crate::store::StoreResult<bool> {
            self.writing(|c| $crate::store::sql::registry::set_paused(c, name, paused))
        }

        fn create_request(
            &self,
            id: &str,
            now: i64,
        ) -> $crate::store::StoreResult<$crate::store::RequestRecord> {
            self.writing(|c| $crate::store::sql::requests::create(c, id, now))
        }

        fn request(
            &self,
            id: &str,
        ) -> $crate::store::StoreResult<Option<$crate::store::RequestRecord>> {
            self.reading(|c| $crate::store::sql::requests::get(c, id))
        }

        fn add_document(
            &self,
            request_id: &str,
            doc: &$crate::store::NewDocument,
            now: i64,
        ) -> $crate::store::StoreResult<$crate::store::AddDocument> {
            self.writing(|c| $crate::store::sql::requests::add_document(c, request_id, doc, now))
        }

        fn request_documents(
            &self,
            id: &str,
        ) -> $crate::store::StoreResult<Vec<$crate::store::DocumentContent>> {
            self.reading(|c| $crate::store::sql::requests::documents(c, id))
        }

        fn record_rejections(
            &self,
            batch: &[$crate::store::NewRejection],
            keep: u64,
            since: i64,
        ) -> $crate::store::StoreResult<()> {
            self.writing(|c| $crate::store::sql::rejections::record(c, batch, keep, since))
        }

        fn rejections(
            &self,
            filter: &$crate::store::RejectionFilter,
            page: $crate::store::Page,
        ) -> $crate::store::StoreResult<Vec<$crate::store::RejectionRecord>> {
            self.reading(|c| $crate::store::sql::rejections::list(c, filter, page))
        }

        fn status_counts(&self) -> $crate::store::StoreResult<$crate::store::StatusCounts> {
            self.reading(|c| $crate::store::sql::stats::status_counts(c))
        }

        fn subscription_secrets(
            &self,
            name: &str,
            now: i64,
        ) -> $crate::store::StoreResult<Vec<$crate::store::secrets::StoredSecret>> {
            self.reading(|c| $crate::store::sql::secrets::list(c, name, now))
        }

        fn keep_secret(
            &self,
            name: &str,
            purpose: $crate::store::secrets::Purpose,
            value: &str,
            now: i64,
        ) -> $crate::store::StoreResult<$crate::store::secrets::StoredSecret> {
            self.writing(|c| $crate::store::sql::secrets::keep(c, name, purpose, value, now))
        }

        fn put_config_secrets(
            &self,
            name: &str,
            purpose: $crate::store::secrets::Purpose,
            values: &[String],
            now: i64,
        ) -> $crate::store::StoreResult<()> {
            self.writing(|c| $crate::store::sql::secrets::put_config(c, name, purpose, values, now))
        }

        fn rotate_secret(
            &self,
            name: &str,
            purpose: $crate::store::secrets::Purpose,
            value: &str,
            grace_ms: i64,
            now: i64,
        ) -> $crate::store::StoreResult<$crate::store::secrets::Rotation> {
            self.writing(|c| {
                $crate::store::sql::secrets::rotate(c, name, purpose, value, grace_ms, now)
            })
        }

        fn open_breaker(
            &self,
            sub: i64,
            settings: Option<&$crate::subscriptions::HttpSettings>,
            after_probe: bool,
            first_ms: i64,
            max_ms: i64,
            now: i64,
        ) -> $crate::store::StoreResult<()> {
            use $crate::store::sql::breaker;
            self.writing(|c| {
                if settings.map_or(Ok(true), |s| breaker::delivers_by(c, sub, s))? {
                    breaker::open(c, sub, after_probe, first_ms, max_ms, now)?;
                }
                Ok(())
            })
        }

        fn pause_gone(
            &self,
            sub: i64,
            settings: &$crate::subscriptions::HttpSettings,
        ) -> $crate::store::StoreResult<bool> {
            self.writing(|c| $crate::store::sql::breaker::pause_gone(c, sub, settings))
        }

        fn close_breaker(
            &self,
            sub: i64,
            settings: Option<&$crate::subscriptions::HttpSettings>,
        ) -> $crate::store::StoreResult<()> {
            use $crate::store::sql::breaker;
            self.writing(|c| {
                if settings.map_or(Ok(true), |s| breaker::delivers_by(c, sub, s))? {
                    breaker::close(c, sub)?;
                }
                Ok(())
            })
        }

        fn skip(
            &self,
            source: &str,
            event_id: &str,
            sub: &str,
            now: i64,
        ) -> $crate::store::StoreResult<$crate::store::SkipOutcome> {
            let routes = self.routes()?;
            self.writing(|c| {
                let live = &routes.live;
                $crate::store::sql::ordering::skip(c, live, source, event_id, sub, now)
            })
        }

        fn held_keys(
            &self,
            subscription: &str,
            limit: usize,
        ) -> $crate::store::StoreResult<Vec<$crate::store::HeldKey>> {
            let routes = self.routes()?;
            self.reading(|c| {
                $crate::store::sql::ordering::held_keys(c, &routes.live, subscription, limit)
            })
        }

        fn copy_out(
            &self,
            table: &$crate::store::copy::Table,
            after: &[$crate::store::copy::Cell],
            limit: usize,
        ) -> $crate::store::StoreResult<Vec<$crate::store::copy::Row>> {
            self.reading(|c| $crate::store::sql::copy::rows(c, table, after, limit))
        }

        fn copy_count(
            &self,
            table: &$crate::store::copy::Table,
        ) -> $crate::store::StoreResult<u64> {
            self.reading(|c| $crate::store::sql::copy::count(c, table))
        }

        fn fan_out_cursor(&self) -> $crate::store::StoreResult<i64> {
            self.reading(|c| $crate::store::sql::copy::cursor(c))
        }

        fn mark_copy(&self, started_at: Option<i64>) -> $crate::store::StoreResult<()> {
            self.writing(|c| $crate::store::sql::copy::mark(c, started_at))
        }

        fn unfinished_copy(&self) -> $crate::store::StoreResult<Option<i64>> {
            self.reading(|c| $crate::store::sql::copy::unfinished(c))
        }
    };
}

pub(crate) use ops_methods;
