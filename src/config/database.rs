//! `database_url`: which store, parsed once; and how a URL may be shown (never its password).

use std::path::PathBuf;

use super::{ConfigError, invalid};

/// Where the events live, parsed from `database_url`.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// `sqlite://relative/path.db` (to the working directory) or `sqlite:///absolute/path.db`.
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`, passed to the PostgreSQL client as it is.
    Postgres(String),
}

impl std::fmt::Debug for Database {
    /// Never the password: a `Debug` of the settings may be logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "Sqlite({})", path.display()),
            Database::Postgres(url) => write!(f, "Postgres({})", redact_credentials(url)),
        }
    }
}

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

    /// What a message may show: the file, or the URL without its credentials.
    pub fn display(&self) -> String {
        match self {
            Database::Sqlite(path) => path.display().to_string(),
            Database::Postgres(url) => redact_credentials(url),
        }
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

/// A database URL as it may be shown: any `user:password@` part replaced, so that a config
/// error never prints a password.
pub fn redact_credentials(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://[redacted]@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}
