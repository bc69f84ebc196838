//! `WEBHOOK_INBOX_<KEY>` overrides, nested with `__` (`WEBHOOK_INBOX_CONSUMERS__WORKERS`).

use super::ConfigError;

const PREFIX: &str = "WEBHOOK_INBOX_";

/// Variables with the prefix that are not settings: the CLI's server address, the store's
/// test-only switch for the power-loss test (docs/power-loss.md) and the alerts' test-only
/// interval (`alerts::UNSAFE_ALERT_EVERY_MS`).
const NOT_SETTINGS: &[&str] = &["URL", "UNSAFE_SKIP_WAL_FSYNC", "UNSAFE_ALERT_EVERY_MS"];

/// Keys whose values are strings even when they look like numbers (a token `12345`).
const STRING_KEYS: &[&str] = &[
    "listen",
    "database_url",
    "admin_token",
    "secrets_key",
    "log_format",
    "forwarded_header",
    "downstream.url",
    "downstream.mode",
    "tls_cert",
    "tls_key",
    "telemetry.otlp_endpoint",
];

/// Set each override into the parsed document before it is deserialised, so that an override
/// goes through the same unknown-key and type checks as the file.
/// Returns each applied key (`consumers.workers`) with its variable, so that an error in the
/// value is blamed on the variable rather than on the file.
pub(super) fn apply_overrides(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut applied = Vec::new();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .collect();
    vars.sort();
    for (var, value) in vars {
        let name = &var[PREFIX.len()..];
        if NOT_SETTINGS.contains(&name) {
            continue;
        }
        let path: Vec<String> = name.split("__").map(|p| p.to_ascii_lowercase()).collect();
        let dotted = path.join(".");
        let fail = |message: String| ConfigError::Env {
            var: var.clone(),
            message,
        };
        if path.iter().any(|p| p.is_empty()) {
            return Err(fail("empty key segment".into()));
        }
        if path[0] == "sources" {
            return Err(fail("sources can only be set in the config file".into()));
        }
        let parsed = if STRING_KEYS.contains(&dotted.as_str()) {
            toml::Value::String(value.clone())
        } else {
            parse_scalar(&value)
        };
        let (last, parents) = path
            .split_last()
            .expect("split yields at least one segment");
        let mut node = &mut *table;
        for p in parents {
            let entry = node
                .entry(p.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            node = match entry {
                toml::Value::Table(t) => t,
                _ => return Err(fail(format!("`{p}` is not a table"))),
            };
        }
        node.insert(last.clone(), parsed);
        applied.push((dotted, var));
    }
    Ok(applied)
}

/// A value is read as TOML when it parses as one (`4`, `true`, `["a", "b"]`), else as a string.
fn parse_scalar(value: &str) -> toml::Value {
    format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()))
}
