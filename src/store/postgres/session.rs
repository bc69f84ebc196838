//! Pooled connections that keep their prepared statements, and the transaction every store
//! method runs in.
//!
//! The `postgres` client prepares a statement given as text at every call (a round trip of its
//! own before the one that runs it). Each pooled connection here keeps the statements it has
//! prepared, by SQL text, for as long as the connection lives.

use std::collections::HashMap;
use std::time::Duration;

use postgres::types::ToSql;
use postgres::{Client, Row, Statement, Transaction};
use r2d2_postgres::PostgresConnectionManager;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::{StoreError, StoreResult};

pub struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
}

impl Conn {
    /// A connection outside the pool, with an empty statement cache.
    pub(super) fn new(client: Client) -> Conn {
        Conn {
            client,
            statements: HashMap::new(),
        }
    }

    /// Begin a transaction (read committed: set in the connection options, whatever the
    /// server's default; the fan-out's reading of its cursor relies on it).
    pub(super) fn begin(&mut self) -> StoreResult<Db<'_>> {
        Ok(Db {
            tx: self.client.transaction()?,
            statements: &mut self.statements,
        })
    }

    /// One statement in a transaction of its own (the server's implicit one: no `BEGIN` or
    /// `COMMIT` round trips), with the connection's statement cache.
    pub(super) fn query_alone(&mut self, sql: &str, params: Params<'_>) -> StoreResult<Vec<Row>> {
        let client = &mut self.client;
        let statement = cached(&mut self.statements, sql, |sql| client.prepare(sql))?;
        Ok(self.client.query(&statement, params)?)
    }

    /// Forget prepared statements (after a schema change, whose plans they may not survive).
    pub(super) fn forget_statements(&mut self) {
        self.statements.clear();
    }
}

/// `r2d2_postgres`'s manager, with a statement cache beside each client.
pub struct Manager(PostgresConnectionManager<MakeRustlsConnect>);

impl Manager {
    pub(super) fn new(connect: &Connect) -> Self {
        Manager(PostgresConnectionManager::new(
            connect.config.clone(),
            connect.tls.clone(),
        ))
    }
}

/// How to open a connection: the settings and the TLS connector of the URL (see `tls`).
#[derive(Clone)]
pub struct Connect {
    pub(super) config: postgres::Config,
    tls: MakeRustlsConnect,
}

impl Connect {
    /// From a `postgres://` URL, with `sslmode` and `sslrootcert` as libpq reads them.
    pub(super) fn from_url(url: &str, wait: Duration) -> anyhow::Result<Connect> {
        let (url, tls) = super::tls::split_url(url)?;
        let mut config = connection_config(&url, wait)?;
        config.ssl_mode(tls.mode.ssl_mode());
        Ok(Connect {
            config,
            tls: super::tls::connector(&tls)?,
        })
    }

    /// A connection outside the pool (call off any async runtime).
    pub(super) fn connect(&self) -> Result<Client, postgres::Error> {
        self.config.connect(self.tls.clone())
    }
}

/// A connection that failed, with every cause (the pool shows only an error's own text, and
/// the client's is "error performing TLS handshake" without why).
#[derive(Debug)]
pub struct ConnectError(String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

impl From<postgres::Error> for ConnectError {
    fn from(e: postgres::Error) -> Self {
        ConnectError(super::errors::describe(&e))
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = ConnectError;

    fn connect(&self) -> Result<Conn, ConnectError> {
        Ok(Conn::new(self.0.connect()?))
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), ConnectError> {
        Ok(self.0.is_valid(&mut conn.client)?)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        self.0.has_broken(&mut conn.client)
    }
}

/// `sql`'s statement from a connection's cache, prepared (and kept) at its first use.
fn cached(
    statements: &mut HashMap<String, Statement>,
    sql: &str,
    prepare: impl FnOnce(&str) -> Result<Statement, postgres::Error>,
) -> StoreResult<Statement> {
    if let Some(statement) = statements.get(sql) {
        return Ok(statement.clone());
    }
    let statement = prepare(sql)?;
    statements.insert(sql.to_string(), statement.clone());
    Ok(statement)
}

/// One transaction with the connection's statement cache.
pub struct Db<'c> {
    tx: Transaction<'c>,
    statements: &'c mut HashMap<String, Statement>,
}

pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl Db<'_> {
    fn statement(&mut self, sql: &str) -> StoreResult<Statement> {
        let tx = &mut self.tx;
        cached(self.statements, sql, |sql| tx.prepare(sql))
    }

    /// The parameter types of `sql` as the server inferred them.
    pub(super) fn param_types(&mut self, sql: &str) -> StoreResult<Vec<postgres::types::Type>> {
        Ok(self.statement(sql)?.params().to_vec())
    }

    pub(super) fn query(&mut self, sql: &str, params: Params<'_>) -> StoreResult<Vec<Row>> {
        let statement = self.statement(sql)?;
        Ok(self.tx.query(&statement, params)?)
    }

    pub(super) fn query_one(&mut self, sql: &str, params: Params<'_>) -> StoreResult<Row> {
        let statement = self.statement(sql)?;
        Ok(self.tx.query_one(&statement, params)?)
    }

    pub(super) fn query_opt(&mut self, sql: &str, params: Params<'_>) -> StoreResult<Option<Row>> {
        let statement = self.statement(sql)?;
        Ok(self.tx.query_opt(&statement, params)?)
    }

    pub(super) fn execute(&mut self, sql: &str, params: Params<'_>) -> StoreResult<u64> {
        let statement = self.statement(sql)?;
        Ok(self.tx.execute(&statement, params)?)
    }

    /// Statements without parameters or results (`SAVEPOINT`, `NOTIFY`), in one round trip.
    pub(super) fn batch(&mut self, sql: &str) -> StoreResult<()> {
        Ok(self.tx.batch_execute(sql)?)
    }

    pub(super) fn commit(self) -> StoreResult<()> {
        self.tx.commit().map_err(|e| match StoreError::from(e) {
            // Whether a commit whose answer was lost took effect is unknown: not
            // acknowledged (a retry is then a duplicate, which is correct).
            StoreError::Internal(e) => StoreError::unavailable_because("commit failed", e),
            unavailable => unavailable,
        })
    }
}

/// The URL's settings, plus bounded waits and durable commits. A URL's own `options` are kept
/// and ours appended.
pub(super) fn connection_config(url: &str, wait: Duration) -> anyhow::Result<postgres::Config> {
    let mut config: postgres::Config = url.parse()?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(wait);
    }
    if config.get_application_name().is_none() {
        config.application_name("webhook-inbox");
    }
    // A statement waits for a row lock at most as long as SQLite waits for its write lock;
    // any statement is bounded; commits wait for the WAL flush whatever the server's default.
    let ours = format!(
        "-c synchronous_commit=on -c default_transaction_isolation=read\\ committed \
         -c lock_timeout={} -c statement_timeout=60000",
        wait.as_millis()
    );
    let options = match config.get_options() {
        Some(theirs) if !theirs.is_empty() => format!("{theirs} {ours}"),
        _ => ours,
    };
    config.options(&options);
    // The server's notices ("relation … already exists, skipping") are not ours to log.
    config.notice_callback(|notice| tracing::debug!(notice = %notice, "PostgreSQL notice"));
    // A server that vanished without closing its sockets is noticed within seconds.
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(10));
    config.tcp_user_timeout(Duration::from_secs(10));
    Ok(config)
}
