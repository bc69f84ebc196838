//! The conformance suite's plumbing (SPEC section 8): every store-level test runs against each
//! store, as river runs its driver tests against every driver. A test is a function taking a
//! [`StoreKind`]; `store_tests!` makes a `sqlite::` and a `postgres::` test of it. The
//! PostgreSQL one says SKIPPED without a server (`scripts/with-postgres` provides one).
//!
//! The few peeks and arrangements the `Store` trait has no method for (a count, a trigger that
//! makes the database refuse a write) go through [`TestDb`], which runs the same SQL on either
//! database.

use std::path::PathBuf;
use std::sync::Arc;

use webhook_inbox::config::Database;
use webhook_inbox::store::Store;

use crate::pgdb::PgDatabase;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Sqlite,
    Postgres,
}

/// The database under a test: a SQLite file, or a PostgreSQL database of the test's own.
pub enum TestDb {
    Sqlite(PathBuf),
    Postgres(PgDatabase),
}

impl TestDb {
    /// A fresh database of `kind`; a SQLite file goes into `dir` as `inbox.db`.
    pub fn create(kind: StoreKind, dir: &std::path::Path) -> TestDb {
        match kind {
            StoreKind::Sqlite => TestDb::Sqlite(dir.join("inbox.db")),
            StoreKind::Postgres => TestDb::Postgres(PgDatabase::create()),
        }
    }

    /// The `database_url` a node is configured with.
    pub fn url(&self) -> String {
        match self {
            TestDb::Sqlite(path) => format!("sqlite://{}", path.display()),
            TestDb::Postgres(db) => db.url.clone(),
        }
    }

    /// Open (and migrate) the store through the factory `serve` uses.
    pub fn open_store(&self) -> Arc<dyn Store> {
        let database = Database::parse(&self.url()).expect("a test database URL parses");
        let store = webhook_inbox::store::open(&database).expect("the store opens");
        store.migrate().expect("migrations apply");
        store
    }

    /// One number from a query that both databases understand (a count, a sum); NULL is 0.
    pub fn count(&self, sql: &str) -> i64 {
        match self {
            TestDb::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
                    .unwrap_or(0)
            }
            TestDb::Postgres(db) => db.count(sql),
        }
    }

    /// Run statements both databases understand.
    pub fn execute(&self, sql: &str) {
        match self {
            TestDb::Sqlite(path) => rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            TestDb::Postgres(db) => db.execute(sql),
        }
    }

    /// Make the database refuse every credit of `order_id` (a trigger raising an error), as a
    /// constraint would: the message is `order <order_id> is refused`. The error is a
    /// constraint error on both (SQLite's RAISE(ABORT) is SQLITE_CONSTRAINT_TRIGGER; here
    /// SQLSTATE 23514, check_violation), so that a store tells it from a failing database.
    pub fn refuse_credits_for(&self, order_id: &str) {
        let n = order_id.replace('-', "_");
        match self {
            TestDb::Sqlite(_) => self.execute(&format!(
                "CREATE TRIGGER refuse_{n} BEFORE INSERT ON loyalty_credits
                  WHEN NEW.order_id = '{order_id}'
                 BEGIN SELECT RAISE(ABORT, 'order {order_id} is refused'); END;"
            )),
            TestDb::Postgres(_) => self.execute(&format!(
                "CREATE FUNCTION refuse_{n}() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION USING ERRCODE = 'check_violation',
                   MESSAGE = 'order {order_id} is refused'; END $$;
                 CREATE TRIGGER refuse_{n} BEFORE INSERT ON loyalty_credits
                  FOR EACH ROW WHEN (NEW.order_id = '{order_id}')
                  EXECUTE FUNCTION refuse_{n}();"
            )),
        }
    }
}

/// `store_tests!(a, b)` for functions `fn a(kind: StoreKind)`: the tests `sqlite::a`,
/// `postgres::a`, … (filter with `cargo nextest run postgres::`).
macro_rules! store_tests {
    ($($test:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $test() {
                    super::$test($crate::stores::StoreKind::Sqlite)
                }
            )+
        }
        mod postgres {
            $(
                #[test]
                fn $test() {
                    if $crate::pgdb::available() {
                        super::$test($crate::stores::StoreKind::Postgres)
                    }
                }
            )+
        }
    };
}
pub(crate) use store_tests;

/// [`store_tests`] for async tests: each `async fn test(kind: StoreKind)` once per store.
macro_rules! async_store_tests {
    ($($test:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::stores::StoreKind::Sqlite).await
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    if $crate::pgdb::available() {
                        super::$test($crate::stores::StoreKind::Postgres).await
                    }
                }
            )+
        }
    };
}
pub(crate) use async_store_tests;
