//! Where the events live: which store, parsed once from `database_url` (the parse is the
//! config's, `config::database`), and how its URL may be shown (never its password). Here so
//! that the store opens one without reading the config.

use std::path::PathBuf;

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
    /// What a message may show: the file, or the URL without its credentials.
    pub fn display(&self) -> String {
        match self {
            Database::Sqlite(path) => path.display().to_string(),
            Database::Postgres(url) => redact_credentials(url),
        }
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
