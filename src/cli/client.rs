//! The HTTP client behind the CLI commands that inspect or change events: they talk to the
//! API, never to the database, so they work against a remote server as well as a local one.

use std::time::Duration;

use clap::Args;
use serde_json::Value;

/// Failures with exit codes that scripts can rely on (see the README).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The API answered and said no (4xx), or some lines of a replay were refused: exit 1.
    #[error("{0}")]
    Refused(String),
    /// The server could not be reached or failed (5xx): exit 3.
    #[error("{0}")]
    Unreachable(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Refused(_) => 1,
            CliError::Unreachable(_) => 3,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// Base URL of the server.
    #[arg(
        long,
        env = "WEBHOOK_INBOX_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// Admin token (default: ./data/admin-token, as the embedded default writes it).
    #[arg(long, env = "WEBHOOK_INBOX_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::blocking::Client,
}

impl ApiClient {
    pub fn new(remote: &Remote) -> anyhow::Result<ApiClient> {
        let token = remote.token.clone().or_else(|| {
            std::fs::read_to_string("data/admin-token")
                .ok()
                .map(|t| t.trim().to_string())
        });
        Ok(ApiClient {
            base: remote.url.trim_end_matches('/').to_string(),
            token,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn http(&self) -> &reqwest::blocking::Client {
        &self.http
    }

    fn send(
        &self,
        req: reqwest::blocking::RequestBuilder,
    ) -> Result<reqwest::blocking::Response, CliError> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let response = req.send().map_err(|e| {
            CliError::Unreachable(format!(
                "cannot reach {} ({e}); is the server running? Set --url or WEBHOOK_INBOX_URL",
                self.base
            ))
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body: Value = response.json().unwrap_or(Value::Null);
        let code = body["error"].as_str().unwrap_or("error");
        let message = body["message"].as_str().unwrap_or("");
        Err(match status.as_u16() {
            401 => CliError::Refused(format!(
                "the server refused the token ({message}); pass --token or set \
                 WEBHOOK_INBOX_ADMIN_TOKEN (the embedded default keeps it in data/admin-token)"
            )),
            400..=499 => CliError::Refused(format!("{code}: {message}")),
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
    pub fn get_stream(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<reqwest::blocking::Response, CliError> {
        self.send(self.http.get(format!("{}{path}", self.base)).query(query))
    }
}

/// `path` segments are user input: percent-encode them.
pub fn segment(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}
