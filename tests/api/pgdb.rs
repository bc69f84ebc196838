//! A fresh PostgreSQL database per test, on the server that `TEST_POSTGRES_URL` names
//! (`scripts/with-postgres` starts one and sets it). Without it, PostgreSQL tests say they were
//! skipped and why; under `TEST_REQUIRE_ALL` they fail (see `requires`).
//!
//! Each test gets its own `t_<random>` database, dropped when the guard goes (connections the
//! test left open included), so that tests run in parallel on one server without sharing rows.

use postgres::{Client, NoTls};

use crate::requires;

const WHY_MISSING: &str =
    "TEST_POSTGRES_URL is not set (run scripts/with-postgres cargo nextest run)";

/// The server's URL, or why there is none.
pub fn server_url() -> Result<String, String> {
    match std::env::var("TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => Err(WHY_MISSING.to_string()),
    }
}

/// Whether this test can use PostgreSQL: when not, it has printed SKIPPED with the reason and
/// the caller returns (or, under `TEST_REQUIRE_ALL`, the test has failed).
pub fn available() -> bool {
    requires::available("PostgreSQL", server_url().map(|_| ()))
}

/// The synchronous `postgres` client runs its own runtime, which panics inside a tokio runtime:
/// every call here runs on a thread of its own, so that async tests can use it too.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("a PostgreSQL helper panicked"))
}

fn connect(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap_or_else(|e| {
        panic!(
            "cannot connect to the test PostgreSQL ({}): {e}",
            redact(url)
        )
    })
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:[redacted]{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// `url` with its database name replaced by `name` (query parameters kept).
fn with_database(url: &str, name: &str) -> String {
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let (head, query) = match url.find('?') {
        Some(q) => (&url[..q], &url[q..]),
        None => (url, ""),
    };
    let base = match head[authority_start..].find('/') {
        Some(slash) => &head[..authority_start + slash],
        None => head,
    };
    format!("{base}/{name}{query}")
}

/// A database of its own for one test, dropped with the guard.
pub struct PgDatabase {
    /// What the store under test is given (`database_url`).
    pub url: String,
    server: String,
    name: String,
}

impl PgDatabase {
    /// Create a fresh, empty database. Call after `available()` said yes.
    pub fn create() -> PgDatabase {
        let server = server_url().expect("checked by pgdb::available()");
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        off_runtime(|| {
            connect(&server)
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"))
        });
        PgDatabase {
            url: with_database(&server, &name),
            server,
            name,
        }
    }

    /// The password in `url` (to check that no log shows it).
    pub fn password(&self) -> String {
        let userinfo = self
            .url
            .split("://")
            .nth(1)
            .and_then(|r| r.rsplit_once('@'));
        userinfo
            .and_then(|(u, _)| u.split_once(':'))
            .map(|(_, p)| p.to_string())
            .unwrap_or_default()
    }

    /// One number from a query (a count, a sum: cast to bigint, as PostgreSQL's `sum` of a
    /// bigint is numeric); NULL reads as 0.
    pub fn count(&self, sql: &str) -> i64 {
        let query = format!("SELECT (({sql}))::bigint");
        off_runtime(|| {
            let row = connect(&self.url)
                .query_one(query.as_str(), &[])
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            row.get::<_, Option<i64>>(0).unwrap_or(0)
        })
    }

    /// Run statements on the test's database (to arrange a state the API cannot make).
    pub fn execute(&self, sql: &str) {
        off_runtime(|| {
            connect(&self.url)
                .batch_execute(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
    }
}

/// Rows whose parent is missing: a body or a state row without its log row, a state row
/// without its subscription, an attempt without its state row. PostgreSQL's schema has no
/// foreign keys there (migration 0006: each check locked and wrote the parent row); the
/// statements write each child from its parent, and this check, run on every test's database
/// before it is dropped, keeps that visible.
const ORPHANS: &str = "SELECT
      (SELECT count(*) FROM event_payloads p
        WHERE NOT EXISTS (SELECT 1 FROM event_log l WHERE l.seq = p.seq))
    + (SELECT count(*) FROM event_state s
        WHERE NOT EXISTS (SELECT 1 FROM event_log l WHERE l.seq = s.seq)
           OR NOT EXISTS (SELECT 1 FROM subscriptions u WHERE u.id = s.sub))
    + (SELECT count(*) FROM event_attempts a
        WHERE NOT EXISTS (SELECT 1 FROM event_state s WHERE s.seq = a.event_seq AND s.sub = a.sub))";

/// How many rows [`ORPHANS`] finds in the database at `url` (0 before migration 0003 made the
/// tables it reads). Call off any async runtime.
pub fn orphans(url: &str) -> Result<i64, postgres::Error> {
    let mut client = Client::connect(url, NoTls)?;
    let split: bool = client
        .query_one(
            "SELECT to_regclass('public.event_state') IS NOT NULL
                AND to_regclass('public.event_log') IS NOT NULL",
            &[],
        )?
        .try_get(0)?;
    if !split {
        return Ok(0);
    }
    client.query_one(ORPHANS, &[])?.try_get(0)
}

/// Fail the test if [`orphans`] found any (a test that already failed is left to its own
/// message).
pub fn assert_no_orphans(found: Result<i64, postgres::Error>) {
    if std::thread::panicking() {
        return;
    }
    match found {
        Ok(0) => {}
        Ok(n) => panic!("{n} rows of the test's database have no parent (see pgdb::ORPHANS)"),
        Err(e) => panic!("could not look for rows without a parent: {e}"),
    }
}

impl PgDatabase {
    /// [`orphans`], through the server's URL (a TLS test's own may need a certificate this
    /// client does not have).
    fn orphans(&self) -> Result<i64, postgres::Error> {
        let url = with_database(&self.server, &self.name);
        off_runtime(|| orphans(&url))
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let orphans = self.orphans();
        // FORCE ends the connections a store or a killed node left behind.
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let server = self.server.clone();
        let dropped = std::thread::spawn(move || {
            Client::connect(&server, NoTls).and_then(|mut c| c.batch_execute(&sql))
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the test database {}", self.name);
        }
        assert_no_orphans(orphans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_name_is_replaced_and_the_password_never_shown() {
        assert_eq!(
            with_database("postgres://u:p@127.0.0.1:5432/inbox", "t_1"),
            "postgres://u:p@127.0.0.1:5432/t_1"
        );
        assert_eq!(
            with_database("postgresql://u:p@h:1/db?sslmode=disable", "t_2"),
            "postgresql://u:p@h:1/t_2?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://u@h:1", "t_3"),
            "postgres://u@h:1/t_3"
        );
        let shown = redact("postgres://u:secret@h:1/db");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
