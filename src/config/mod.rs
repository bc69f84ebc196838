//! Typed settings: defaults, then the TOML file, then `WEBHOOK_INBOX_*` environment variables.
//!
//! Every key of SPEC section 7 exists here. Unknown keys are refused with their name, because a
//! misspelt `max_atempts` that silently falls back to a default is how production surprises
//! happen. Sources come from the file only: a list of tables has no sane env encoding.

mod alerts;
mod database;
mod edge;
mod embedded;
mod env;
mod subscriptions;
mod telemetry;
mod validate;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use crate::domain::{ConsumerSettings, MAX_BACKOFF_MS, MIN_TOKEN_LEN};
pub use alerts::{
    AlertSettings, ChannelKind, ConditionKind, ConditionSettings, default_conditions,
    warnings as alert_warnings,
};
pub use database::{Database, redact_credentials, sqlite_path};
pub use edge::{Cidr, ConnectionSettings, ForwardedHeader, RejectionSettings, any_contains};
pub use embedded::{
    DEMO_SOURCE, add_demo_source, data_dir, ensure_admin_token, new_pull_token, new_secret_bytes,
    new_signing_secret, subscription_secret, subscription_token,
};
pub use subscriptions::{check_tokens, implicit_subscriptions, subscriptions_of};
pub use telemetry::TelemetrySettings;

use crate::domain::DeliveryMode;
use crate::signature::{Scheme, Secret};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The OS error is in the message and deliberately not a `#[source]`: printed as a chain,
    /// it would appear twice.
    #[error("cannot read config file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MismatchPolicy {
    /// Answer `200 duplicate` with `payload_mismatch: true` (providers that vary metadata).
    Duplicate,
    /// Answer `409 payload_mismatch` (sources fed by your own tools).
    Reject,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Address the HTTP server binds.
    pub listen: String,
    /// `sqlite://relative/path.db` or `sqlite:///absolute/path.db`.
    pub database_url: String,
    /// Bearer token for the ops and submission routes. Empty: generated into `data/admin-token`.
    pub admin_token: Secret,
    /// Extra bearer tokens that may use the submission API only.
    pub submission_tokens: Vec<Secret>,
    /// Bearer tokens that may open and close `listen` sessions only (`POST
    /// /subscriptions?session=true`, `DELETE` of a session): a developer's, not the admin's.
    pub listen_tokens: Vec<Secret>,
    /// Seals the subscriptions' secrets kept in the database (32 bytes, base64; usually given
    /// as `WEBHOOK_INBOX_SECRETS_KEY`, the same on every node). Empty: kept plain, readable by
    /// whoever reads the database. See `secrets::seal`.
    pub secrets_key: Secret,
    /// Largest accepted webhook body; larger ones get 413 before being buffered.
    pub body_limit_bytes: usize,
    /// `text` for a terminal, `json` for log shippers.
    pub log_format: LogFormat,
    pub consumers: ConsumerSettings,
    pub retention: RetentionSettings,
    pub downstream: DownstreamSettings,
    pub rejections: RejectionSettings,
    /// PEM certificate chain and private key: with both, `serve` speaks HTTPS (SIGHUP reads
    /// them again). Relative paths are relative to the working directory.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Proxies (CIDR ranges or addresses) whose forwarding header names the sender; anyone
    /// else's are ignored. Empty: the peer is the sender.
    pub trusted_proxies: Vec<Cidr>,
    /// Which header those proxies set: `x-forwarded-for` (default) or `forwarded` (RFC 7239).
    /// Only that one is read; the other is whatever the client wrote.
    pub forwarded_header: ForwardedHeader,
    /// Limits on connections and on the time a request's head and body may take.
    pub connections: ConnectionSettings,
    pub sources: Vec<SourceSettings>,
    /// The user's consumers (SPEC section 13); empty: the implicit three.
    pub subscriptions: Vec<crate::subscriptions::SubscriptionSettings>,
    /// Where people reach this node's dashboard (`https://inbox.example.com`): alert notices
    /// link to it. Unset: notices carry the dashboard's path alone (`/ui/#subscriptions`).
    pub public_url: Option<String>,
    /// How often each node evaluates the alert conditions and looks for notices to send (ms).
    pub alert_every_ms: u64,
    /// Channels and their conditions (SPEC section 15; `docs/guides/alerts.md`).
    pub alerts: Vec<AlertSettings>,
    /// A `listen` session that has not claimed for this long is removed by the heartbeat
    /// (its states finished as a removal's are).
    pub session_idle_seconds: u64,
    /// OpenTelemetry traces (SPEC section 15): off unless `otlp_endpoint` is set.
    pub telemetry: TelemetrySettings,
}

/// How long terminal events keep their body and history before the background purge makes
/// tombstones of them (SPEC section 12). A tombstone keeps the dedup key forever.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// Days after completion; 0 keeps completed events whole forever.
    pub completed_days: u32,
    /// Days after failure; 0 keeps failed events whole forever.
    pub failed_days: u32,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        RetentionSettings {
            completed_days: 30,
            failed_days: 90,
        }
    }
}

/// Longest retention that can be set: a century.
const MAX_RETENTION_DAYS: u32 = 36_500;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DownstreamSettings {
    /// Where submitted requests are POSTed. Empty: submissions fail with a clear reason.
    pub url: String,
    /// Bound on one downstream call; must be under half the lease so a call cannot outlive it.
    pub timeout_ms: u64,
    pub mode: DeliveryMode,
    /// Downstream calls in flight at once, each on its own worker beside the in-process ones
    /// (`consumers.workers`), so that a slow downstream holds back no credit. None run when
    /// `consumers.workers = 0`.
    pub concurrency: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSettings {
    pub name: String,
    pub scheme: Scheme,
    /// Several during rotation: any one matching is enough.
    pub secrets: Vec<Secret>,
    #[serde(default = "default_tolerance")]
    pub tolerance_seconds: u64,
    #[serde(default = "default_mismatch")]
    pub on_payload_mismatch: MismatchPolicy,
    /// Where deliveries may come from (CIDR ranges or addresses); empty: anywhere. Others are
    /// answered 403 `forbidden_sender` and stored nowhere.
    #[serde(default)]
    pub allow_from: Vec<Cidr>,
}

fn default_tolerance() -> u64 {
    300
}

fn default_mismatch() -> MismatchPolicy {
    MismatchPolicy::Duplicate
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: "127.0.0.1:8080".into(),
            database_url: "sqlite://data/webhook-inbox.db".into(),
            admin_token: Secret::default(),
            secrets_key: Secret::default(),
            submission_tokens: Vec::new(),
            listen_tokens: Vec::new(),
            body_limit_bytes: 1024 * 1024,
            log_format: LogFormat::Text,
            consumers: ConsumerSettings::default(),
            retention: RetentionSettings::default(),
            downstream: DownstreamSettings::default(),
            rejections: RejectionSettings::default(),
            tls_cert: None,
            tls_key: None,
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::default(),
            connections: ConnectionSettings::default(),
            sources: Vec::new(),
            subscriptions: Vec::new(),
            public_url: None,
            alert_every_ms: 15_000,
            alerts: Vec::new(),
            session_idle_seconds: 600,
            telemetry: TelemetrySettings::default(),
        }
    }
}

impl Default for DownstreamSettings {
    fn default() -> Self {
        DownstreamSettings {
            url: String::new(),
            timeout_ms: 10_000,
            mode: DeliveryMode::AtMostOnce,
            concurrency: 2,
        }
    }
}

/// A bound that keeps the arithmetic on these settings far from overflow.
const MAX_LEASE_SECONDS: u64 = 86_400;

impl Settings {
    /// Parse a TOML document and apply environment overrides (`WEBHOOK_INBOX_*`), then validate.
    /// `env` is passed in rather than read here so that tests never mutate the process env.
    pub fn from_toml(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: origin.to_string(),
                    message: e.to_string(),
                })?;
        let overridden = env::apply_overrides(&mut table, env)?;
        // The path (`downstream.mode`, `sources[0].scheme`) goes into the message, and a value
        // that came from the environment is blamed on its variable, not on the file.
        let settings: Settings = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                let path = e.path().to_string();
                let inner = plain_words(e.into_inner().message());
                if let Some((_, var)) = overridden.iter().find(|(key, _)| *key == path) {
                    return ConfigError::Env {
                        var: var.clone(),
                        message: inner,
                    };
                }
                ConfigError::Parse {
                    path: origin.to_string(),
                    message: if path == "." {
                        inner
                    } else {
                        format!("`{path}`: {inner}")
                    },
                }
            })?;
        settings.validate()?;
        Ok(settings)
    }

    /// Read `path`; `Ok(None)` when `path` is the implicit `./webhook-inbox.toml` and it is absent.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Option<Settings>, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from("webhook-inbox.toml"), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(None),
            Err(error) => return Err(ConfigError::Read { path, error }),
        };
        Settings::from_toml(&text, &path.display().to_string(), env).map(Some)
    }

    /// The `[[sources]]` entry called `name`.
    pub fn source(&self, name: &str) -> Option<&SourceSettings> {
        self.sources.iter().find(|s| s.name == name)
    }

    /// The database `database_url` names.
    pub fn database(&self) -> Result<Database, ConfigError> {
        Database::parse(&self.database_url)
    }
}

/// serde's type names (`expected usize`) in the words a config author uses.
fn plain_words(message: &str) -> String {
    let mut text = message.to_string();
    for (rust, words) in [
        ("usize", "a non-negative integer"),
        ("u64", "a non-negative integer"),
        ("u32", "a non-negative integer"),
        ("u16", "a non-negative integer"),
        ("i64", "an integer"),
    ] {
        text = text.replace(&format!("expected {rust}"), &format!("expected {words}"));
    }
    text
}

#[cfg(test)]
mod tests;
