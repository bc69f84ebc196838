//! The checks of a whole config, after parsing: each refusal names its key.

use std::net::{SocketAddr, ToSocketAddrs as _};

use super::{
    ConfigError, MAX_LEASE_SECONDS, MAX_RETENTION_DAYS, Settings, alerts, invalid, subscriptions_of,
};
use crate::domain::{MAX_BACKOFF_MS, MIN_TOKEN_LEN, RESERVED_SOURCE};

impl Settings {
    /// Refuse a config a node must not start with, naming the key and the reason.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // A host name (`localhost:8080`) is accepted as the listener will resolve it.
        if self.listen.parse::<SocketAddr>().is_err() {
            self.listen
                .to_socket_addrs()
                .ok()
                .filter(|addrs| addrs.len() > 0)
                .ok_or_else(|| {
                    invalid(
                        "listen",
                        format!(
                            "`{}` is not host:port with a host this machine can resolve \
                             (e.g. 127.0.0.1:8080, localhost:8080, 0.0.0.0:8080)",
                            self.listen
                        ),
                    )
                })?;
        }
        self.database()?;
        // Empty is allowed: `serve` then generates one into the data directory.
        if !self.admin_token.is_empty() && self.admin_token.expose().chars().count() < MIN_TOKEN_LEN
        {
            return Err(invalid(
                "admin_token",
                format!(
                    "must be at least {MIN_TOKEN_LEN} characters (leave it empty to have one \
                     generated into the data directory)"
                ),
            ));
        }
        let lists = [
            ("submission_tokens", &self.submission_tokens),
            ("listen_tokens", &self.listen_tokens),
        ];
        for (key, tokens) in lists {
            for (i, token) in tokens.iter().enumerate() {
                if token.expose().chars().count() < MIN_TOKEN_LEN {
                    return Err(invalid(
                        format!("{key}[{i}]"),
                        format!("must be at least {MIN_TOKEN_LEN} characters"),
                    ));
                }
            }
        }
        self.telemetry.validate()?;
        if self.body_limit_bytes == 0 {
            return Err(invalid("body_limit_bytes", "must be positive"));
        }
        if !(1..=MAX_LEASE_SECONDS * 30).contains(&self.session_idle_seconds) {
            return Err(invalid(
                "session_idle_seconds",
                format!("must be between 1 and {} (30 days)", MAX_LEASE_SECONDS * 30),
            ));
        }
        for (key, days) in [
            ("retention.completed_days", self.retention.completed_days),
            ("retention.failed_days", self.retention.failed_days),
        ] {
            if days > MAX_RETENTION_DAYS {
                return Err(invalid(
                    key,
                    format!("must be at most {MAX_RETENTION_DAYS} (0 keeps forever)"),
                ));
            }
        }
        let c = &self.consumers;
        if c.batch_size == 0 || c.batch_size > 1000 {
            return Err(invalid(
                "consumers.batch_size",
                "must be between 1 and 1000",
            ));
        }
        if c.workers > 256 {
            return Err(invalid("consumers.workers", "must be at most 256"));
        }
        if c.lease_seconds == 0 || c.lease_seconds > MAX_LEASE_SECONDS {
            return Err(invalid(
                "consumers.lease_seconds",
                format!("must be between 1 and {MAX_LEASE_SECONDS} (a day)"),
            ));
        }
        if c.max_attempts == 0 {
            return Err(invalid("consumers.max_attempts", "must be at least 1"));
        }
        if c.backoff_max_ms > MAX_BACKOFF_MS {
            return Err(invalid(
                "consumers.backoff_max_ms",
                format!("must be at most {MAX_BACKOFF_MS} (30 days)"),
            ));
        }
        if c.backoff_base_ms > c.backoff_max_ms {
            return Err(invalid(
                "consumers.backoff_base_ms",
                "must not exceed consumers.backoff_max_ms",
            ));
        }
        // lease_seconds is bounded above, so its product cannot overflow; timeout_ms is not,
        // so it is compared by division.
        let half_lease_ms = c.lease_seconds * 1000 / 2;
        if self.downstream.timeout_ms == 0 || self.downstream.timeout_ms >= half_lease_ms {
            return Err(invalid(
                "downstream.timeout_ms",
                format!(
                    "must be positive and under half of consumers.lease_seconds \
                     ({half_lease_ms} ms), so a downstream call always ends before its lease \
                     can expire"
                ),
            ));
        }
        if !(1..=64).contains(&self.downstream.concurrency) {
            return Err(invalid(
                "downstream.concurrency",
                "must be between 1 and 64",
            ));
        }
        if self.rejections.keep_count > 1_000_000 {
            return Err(invalid("rejections.keep_count", "must be at most 1000000"));
        }
        if self.rejections.keep_days > MAX_RETENTION_DAYS {
            return Err(invalid(
                "rejections.keep_days",
                format!("must be at most {MAX_RETENTION_DAYS}"),
            ));
        }
        if let Some((key, reason)) = self.connections.problem() {
            return Err(invalid(key, reason));
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => return Err(invalid("tls_key", "tls_cert is set: set tls_key too")),
            (None, Some(_)) => return Err(invalid("tls_cert", "tls_key is set: set tls_cert too")),
            _ => {}
        }
        let mut seen = std::collections::HashSet::new();
        for (i, s) in self.sources.iter().enumerate() {
            let key = |field: &str| format!("sources[{i}].{field}");
            crate::domain::SourceName::parse(&s.name)
                .map_err(|e| invalid(key("name"), e.to_string()))?;
            if s.name == RESERVED_SOURCE {
                return Err(invalid(
                    key("name"),
                    "`requests` is reserved for the submission API",
                ));
            }
            if !seen.insert(s.name.as_str()) {
                return Err(invalid(
                    key("name"),
                    format!("source `{}` is defined twice", s.name),
                ));
            }
            if s.secrets.is_empty() {
                return Err(invalid(key("secrets"), "at least one secret is required"));
            }
            for secret in &s.secrets {
                s.scheme
                    .check_secret(secret.expose())
                    .map_err(|m| invalid(key("secrets"), m))?;
            }
        }
        subscriptions_of(self)?;
        alerts::validate(self)?;
        Ok(())
    }
}
