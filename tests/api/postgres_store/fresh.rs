//! A fresh database per test on the server `TEST_POSTGRES_URL` names (an admin URL: a role
//! that may create databases), dropped again by a guard, so that tests run in parallel.

use std::sync::Arc;

use postgres::NoTls;
use webhook_inbox::store::Store;
use webhook_inbox::store::postgres::{PostgresOptions, PostgresStore};

use crate::requires;

/// The variable `scripts/` exports with a throwaway cluster's admin URL. Not `WEBHOOK_INBOX_`:
/// those are settings.
pub const URL_VAR: &str = "TEST_POSTGRES_URL";

pub struct FreshDb {
    admin: String,
    pub name: String,
    pub url: String,
}

impl FreshDb {
    /// `None` (the test is skipped, said so) when no server is named; under
    /// `TEST_REQUIRE_ALL` that fails the test instead.
    pub fn create() -> Option<FreshDb> {
        let admin = std::env::var(URL_VAR).ok().filter(|u| !u.is_empty());
        let found = admin.clone().ok_or_else(|| {
            format!("{URL_VAR} is not set (scripts/ starts a throwaway PostgreSQL and sets it)")
        });
        if !requires::available("PostgreSQL", found.map(|_| ())) {
            return None;
        }
        let admin = admin.expect("checked above");
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        run_admin(&admin, &format!("CREATE DATABASE {name}"));
        let url = with_database(&admin, &name);
        Some(FreshDb { admin, name, url })
    }

    /// A store on this database: a pool of its own, as one node has.
    pub fn node(&self) -> Arc<PostgresStore> {
        Arc::new(PostgresStore::open(&self.url, PostgresOptions::default()).unwrap())
    }

    /// A migrated node.
    pub fn migrated(&self) -> Arc<PostgresStore> {
        let store = self.node();
        store.migrate().unwrap();
        store
    }

    /// One value from the database, for assertions the store has no method for.
    pub fn scalar(&self, sql: &str) -> i64 {
        let mut client = postgres::Client::connect(&self.url, NoTls).unwrap();
        client.query_one(sql, &[]).unwrap().get(0)
    }
}

impl Drop for FreshDb {
    fn drop(&mut self) {
        let url = self.url.clone();
        let orphans = std::thread::spawn(move || crate::pgdb::orphans(&url))
            .join()
            .expect("the orphan check panicked");
        // FORCE: the test's pools may still hold connections.
        let _ = try_admin(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        crate::pgdb::assert_no_orphans(orphans);
    }
}

fn try_admin(admin: &str, sql: &str) -> Result<(), postgres::Error> {
    let mut client = postgres::Client::connect(admin, NoTls)?;
    client.batch_execute(sql)
}

fn run_admin(admin: &str, sql: &str) {
    if let Err(e) = try_admin(admin, sql) {
        panic!("{sql} on {URL_VAR}: {e}");
    }
}

/// `url` with its database name replaced (the path after the authority), query kept.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = base[scheme_end..]
        .find('/')
        .map(|i| scheme_end + i)
        .unwrap_or(base.len());
    let mut out = format!("{}/{name}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[test]
fn a_database_name_replaces_the_path_and_keeps_the_query() {
    assert_eq!(
        with_database(
            "postgres://u:p@127.0.0.1:5432/postgres?sslmode=disable",
            "t_1"
        ),
        "postgres://u:p@127.0.0.1:5432/t_1?sslmode=disable"
    );
    assert_eq!(
        with_database("postgresql://127.0.0.1:5", "t_2"),
        "postgresql://127.0.0.1:5/t_2"
    );
}
