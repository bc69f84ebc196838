//! `database_url` parsed into the store it names ([`Database`], a `domain` value the store
//! opens without reading the config).

use std::path::PathBuf;

use super::{ConfigError, invalid};
pub use crate::domain::{Database, redact_credentials};

impl Database {
    pub fn parse(url: &str) -> Result<Database, ConfigError> {
        if let Some(rest) = url.strip_prefix("sqlite://").filter(|r| !r.is_empty()) {
            return Ok(Database::Sqlite(PathBuf::from(rest)));
        }
        let postgres = ["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| url.len() > scheme.len() && url.starts_with(scheme));
        if postgres {
            return Ok(Database::Postgres(url.to_string()));
        }
        Err(invalid(
            "database_url",
            format!(
                "`{}` is not supported: use sqlite://path (relative), sqlite:///path (absolute) \
                 or postgres://user:password@host:port/database",
                redact_credentials(url)
            ),
        ))
    }
}

/// Resolve a `sqlite://` URL to a path, for the commands that work on a SQLite file only
/// (`backup`): `what` says which, for the refusal of any other URL.
pub fn sqlite_path(url: &str, what: &str) -> Result<PathBuf, ConfigError> {
    match Database::parse(url)? {
        Database::Sqlite(path) => Ok(path),
        Database::Postgres(url) => Err(invalid(
            "database_url",
            format!(
                "`{}` is a PostgreSQL database: {what}",
                redact_credentials(&url)
            ),
        )),
    }
}
