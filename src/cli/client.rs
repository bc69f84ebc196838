//! The HTTP client behind the CLI commands that inspect or change events: they talk to the
//! API, never to the database, so they work against a remote server as well as a local one.
//!
//! Where the server is and which token to use are resolved once, in this order: `--url` /
//! `--token`, then `WEBHOOK_INBOX_URL` / `WEBHOOK_INBOX_ADMIN_TOKEN`, then the config file
//! (`--config FILE` or `./webhook-inbox.toml`: its `listen` and `admin_token`, with the same
//! `WEBHOOK_INBOX_*` overrides `serve` applies), then the embedded default
//! (`http://127.0.0.1:8080` and the token `serve` generated into `data/admin-token`). A CLI run
//! with the same config as `serve` therefore finds that server, from any directory: a generated
//! token is looked for in the data directory as `serve` sees it from the working directory, and
//! beside the config file (its data directory taken relative to the config's directory), and
//! when none is found the error says where it looked. `--url` and `--token` go before the
//! subcommand or after it, as `--config` does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::config::{self, Settings};

/// Failures with exit codes that scripts can rely on (docs/cli.md).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Some lines of a replay were refused, or a check before any request failed: exit 1.
    #[error("{0}")]
    Refused(String),
    /// The API answered and said no (4xx), with its error code: exit 1.
    #[error("{code}: {message}")]
    Api { code: String, message: String },
    /// The server could not be reached or failed (5xx): exit 3.
    #[error("{0}")]
    Unreachable(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Refused(_) | CliError::Api { .. } => 1,
            CliError::Unreachable(_) => 3,
        }
    }
}

/// Where the resolution order is told in `--help`.
pub const RESOLUTION_HELP: &str = "\
Server and token: --url/--token, else WEBHOOK_INBOX_URL/WEBHOOK_INBOX_ADMIN_TOKEN, else the \
config file (--config FILE or ./webhook-inbox.toml: its `listen` and `admin_token`), else the \
embedded default (http://127.0.0.1:8080 and the token in data/admin-token).";

#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// Base URL of the server [default: from the config's `listen`, else http://127.0.0.1:8080].
    #[arg(long, env = "WEBHOOK_INBOX_URL", value_name = "URL")]
    pub url: Option<String>,
    /// Admin token [default: the config's `admin_token`, else the generated admin-token file].
    #[arg(
        long,
        env = "WEBHOOK_INBOX_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

/// `--url` and `--token` given before the subcommand (`webhook-inbox --url U events list`).
/// Not global: `listen` and `loadgen` have a `--url` and `--token` of their own, and `serve`
/// none. Given, they win over the subcommand's (whose values may come from the environment).
#[derive(Debug, Clone, Default, Args)]
pub struct Before {
    /// The server's URL, for the commands that talk to the API (as their own --url).
    #[arg(long = "url", value_name = "URL")]
    pub url: Option<String>,
    /// The admin token, for the commands that talk to the API (as their own --token).
    #[arg(long = "token", value_name = "TOKEN")]
    pub token: Option<String>,
}

/// What a command that talks to the API was told: the config file and `--url`/`--token`.
pub struct Api<'a> {
    pub config: Option<&'a Path>,
    pub before: &'a Before,
}

/// Where `serve` may have written the generated admin token for these settings: its data
/// directory as seen from here, and, for a config file, the same relative to the config's
/// directory (a `serve` started beside its config). Each once, in that order.
fn token_files(settings: &Settings, config: Option<&Path>) -> Vec<PathBuf> {
    let dir = config::data_dir(settings);
    let mut files = vec![dir.join("admin-token")];
    let config = config.map(Path::to_path_buf).or_else(|| {
        let default = PathBuf::from("webhook-inbox.toml");
        default.exists().then_some(default)
    });
    if let Some(beside) = config.as_deref().and_then(Path::parent)
        && dir.is_relative()
    {
        let beside = if beside.as_os_str().is_empty() {
            Path::new(".")
        } else {
            beside
        };
        files.push(beside.join(&dir).join("admin-token"));
        files.push(beside.join("admin-token"));
    }
    files.dedup();
    files
}

/// The settings `serve` would run on with this config, without creating anything: no
/// generated token or secret is written here, only read.
fn settings_for_client(config: Option<&Path>) -> anyhow::Result<Settings> {
    match Settings::load(config, std::env::vars())? {
        Some(settings) => Ok(settings),
        None => Ok(Settings::from_toml(
            "",
            "embedded default",
            std::env::vars(),
        )?),
    }
}

/// The URL a client on this machine uses for a `listen` address: a wildcard address
/// (`0.0.0.0`, `[::]`) is reached through loopback.
pub fn url_for_listen(listen: &str) -> String {
    let (host, port) = listen.rsplit_once(':').unwrap_or((listen, "8080"));
    let host = match host {
        "0.0.0.0" | "" => "127.0.0.1",
        "[::]" => "[::1]",
        other => other,
    };
    format!("http://{host}:{port}")
}

/// The server URL alone (for `replay`, which needs no token).
pub fn resolve_url(url: Option<&str>, config: Option<&Path>) -> anyhow::Result<String> {
    match url {
        Some(u) => Ok(u.trim_end_matches('/').to_string()),
        None => Ok(url_for_listen(&settings_for_client(config)?.listen)),
    }
}

pub struct ApiClient {
    base: String,
    token: Option<String>,
    /// With no token found: the files looked in, for the error.
    looked: Vec<PathBuf>,
    http: reqwest::blocking::Client,
}

impl ApiClient {
    /// Resolve URL and token in the order of the module doc; the config is read only when a
    /// flag or variable leaves something open.
    pub fn new(api: &Api<'_>, remote: &Remote) -> anyhow::Result<ApiClient> {
        let remote = &Remote {
            url: api.before.url.clone().or_else(|| remote.url.clone()),
            token: api.before.token.clone().or_else(|| remote.token.clone()),
        };
        let config = api.config;
        let settings = match (&remote.url, &remote.token) {
            (Some(_), Some(_)) => None,
            _ => Some(settings_for_client(config)?),
        };
        let base = match (&remote.url, &settings) {
            (Some(u), _) => u.trim_end_matches('/').to_string(),
            (None, Some(s)) => url_for_listen(&s.listen),
            (None, None) => unreachable!("settings are read when --url is missing"),
        };
        let mut looked = Vec::new();
        let token = match (&remote.token, &settings) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(s)) if !s.admin_token.is_empty() => Some(s.admin_token.expose().into()),
            // As `serve` does for an empty `admin_token`: the generated one in the data dir.
            (None, Some(s)) => {
                looked = token_files(s, config);
                looked
                    .iter()
                    .find_map(|f| std::fs::read_to_string(f).ok())
                    .map(|t| t.trim().to_string())
            }
            (None, None) => None,
        };
        Ok(ApiClient {
            base,
            looked: if token.is_none() { looked } else { Vec::new() },
            token,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn send(
        &self,
        req: reqwest::blocking::RequestBuilder,
    ) -> Result<reqwest::blocking::Response, CliError> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let response = req
            .send()
            .map_err(|e| CliError::Unreachable(unreachable_message(&e, &self.base)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body: Value = response.json().unwrap_or(Value::Null);
        let code = body["error"].as_str().unwrap_or("error").to_string();
        let message = body["message"].as_str().unwrap_or("").to_string();
        Err(match status.as_u16() {
            401 if self.token.is_none() => CliError::Refused(format!(
                "no admin token found: none given (--token, WEBHOOK_INBOX_ADMIN_TOKEN), none in \
                 the config (`admin_token`), and no generated one in {}; the server at {} \
                 refused the call",
                if self.looked.is_empty() {
                    "its data directory".to_string()
                } else {
                    self.looked
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                self.base
            )),
            401 => CliError::Refused(format!(
                "the server at {} refused the token ({message}); pass --token, set \
                 WEBHOOK_INBOX_ADMIN_TOKEN, or point --config at the server's config (the \
                 embedded default keeps the token in data/admin-token)",
                self.base
            )),
            400..=499 => CliError::Api { code, message },
            _ => CliError::Unreachable(format!(
                "the server failed with {status}: {code}: {message}"
            )),
        })
    }

    pub fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value, CliError> {
        let req = self.http.get(format!("{}{path}", self.base)).query(query);
        self.send(req)?
            .json()
            .map_err(|e| CliError::Unreachable(format!("unreadable answer: {e}")))
    }

    pub fn post(
        &self,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, CliError> {
        let mut req = self.http.post(format!("{}{path}", self.base)).query(query);
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req)?
            .json()
            .map_err(|e| CliError::Unreachable(format!("unreadable answer: {e}")))
    }

    /// A streamed GET (export): the response to copy from.
    /// Any method with an optional JSON body (`PATCH`, `DELETE`).
    pub fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CliError> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req)?
            .json()
            .map_err(|e| CliError::Unreachable(format!("unreadable answer: {e}")))
    }

    pub fn get_stream(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<reqwest::blocking::Response, CliError> {
        self.send(self.http.get(format!("{}{path}", self.base)).query(query))
    }
}

/// What a failed request means for the user, rather than reqwest's "error sending request".
pub fn unreachable_message(error: &reqwest::Error, base: &str) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return format!(
                "connection refused: is the server running at {base}? (set --url, \
                 WEBHOOK_INBOX_URL or the config's `listen`)"
            );
        }
        cause = e.source();
    }
    if error.is_timeout() {
        return format!("{base} did not answer in time");
    }
    let mut text = format!("cannot reach {base}");
    let mut cause = std::error::Error::source(error);
    while let Some(e) = cause {
        text.push_str(&format!(": {e}"));
        cause = e.source();
    }
    format!("{text}; is the server running there?")
}

/// `path` segments are user input: percent-encode them.
pub fn segment(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// The rows under `field` of a paged list route (`GET /events`, `GET /rejections`): one page
/// from `cursor` (`None`: the first), or with `all` every page after it (at most 10,000).
/// Returns the rows and the `next_cursor` of the last page read.
pub fn pages(
    client: &ApiClient,
    path: &str,
    query: &[(&str, String)],
    field: &str,
    cursor: Option<String>,
    all: bool,
) -> anyhow::Result<(Vec<Value>, Value)> {
    let mut rows = Vec::new();
    let mut next = cursor.map_or(Value::Null, Value::String);
    for _ in 0..10_000 {
        let mut q = query.to_vec();
        if let Value::String(cursor) = &next {
            q.push(("cursor", cursor.clone()));
        }
        let page = client.get(path, &q)?;
        rows.extend(page[field].as_array().cloned().unwrap_or_default());
        next = page["next_cursor"].clone();
        if !all || next.is_null() {
            break;
        }
    }
    Ok((rows, next))
}
