//! `webhook-inbox listen`: a pull client for a developer's laptop. It claims the events of a
//! `pull` subscription with long polls, posts each to a local URL signed as an `http`
//! subscription signs (Standard Webhooks), and acks each by its answer: a 2xx is done, anything
//! else is retried with the subscription's backoff, and a connection never made gives the
//! event back. No port is opened anywhere.
//!
//! - `server`: the subscription's pull routes (claim, ack, extend), read byte for byte.
//! - `endpoint`: the call to the local URL, and whether it can have reached it.
//! - `batch`: one claimed batch, each call under a lease that covers it.
//! - `session`: with `--source`, a subscription of the session's own, made at start and
//!   deleted at the end.

mod batch;
mod endpoint;
mod server;
mod session;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use clap::Args;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::client::resolve_url;
use crate::config::{self, Settings};
use crate::signature::Secret;

/// How long a new session's routes may take to be served (each node reads the registry's
/// changes within a second).
const SESSION_SERVED: Duration = Duration::from_secs(5);

/// The variable `--token` falls back to.
const TOKEN_ENV: &str = "WEBHOOK_INBOX_PULL_TOKEN";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["subscription", "sources"])))]
pub struct ListenArgs {
    /// The `pull` subscription to take events from.
    #[arg(long, value_name = "NAME")]
    subscription: Option<String>,
    /// Open a session of its own instead: a `pull` subscription that takes this source's events
    /// stored from now on (repeat for several), deleted when `listen` stops.
    #[arg(long = "source", value_name = "SOURCE", conflicts_with_all = ["subscription", "token"])]
    sources: Vec<String>,
    /// With --source: the event types the session takes (globs; default: every type).
    #[arg(long, value_name = "GLOB", num_args = 1.., requires = "sources")]
    types: Vec<String>,
    /// With --source: a jq program run on each event before it is forwarded: its one output
    /// is the body (no output: the event is completed `filtered`; see the subscriptions guide).
    #[arg(long, value_name = "PROGRAM", requires = "sources")]
    transform: Option<String>,
    /// With --source: the admin token that opens the session [default: the config's
    /// `admin_token`, else the generated admin-token file].
    #[arg(
        long,
        env = "WEBHOOK_INBOX_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        requires = "sources"
    )]
    admin_token: Option<String>,
    /// With --source: one of the server's `listen_tokens`, which opens and closes sessions
    /// and nothing else (instead of the admin token).
    #[arg(
        long,
        env = "WEBHOOK_INBOX_LISTEN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        requires = "sources"
    )]
    listen_token: Option<String>,
    /// Where to POST each event, e.g. http://127.0.0.1:3000/hooks.
    #[arg(long, value_name = "URL")]
    forward_to: String,
    /// Base URL of the server [default: from the config's `listen`, else http://127.0.0.1:8080].
    #[arg(long, env = "WEBHOOK_INBOX_URL", value_name = "URL")]
    url: Option<String>,
    /// The subscription's token [default: WEBHOOK_INBOX_PULL_TOKEN, else its `token` in the
    /// config, else the generated one in data/subscription-NAME-token].
    // Not `env = …`: a refused token is reported with where it was read from.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// The Standard Webhooks secret (whsec_…) to sign with [default: one derived from the
    /// token, the same at every run, printed at start].
    #[arg(long, value_name = "SECRET")]
    signing_secret: Option<String>,
    /// Events claimed at once (1 to 1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    batch: u64,
    /// How long the local endpoint may take to answer, in ms.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    timeout_ms: u64,
}

/// Where the token came from, for the message when the server refuses it.
#[derive(Debug, Clone)]
enum TokenOrigin {
    Flag,
    Env,
    Config(PathBuf),
    File(PathBuf),
    /// Answered when the session's subscription was made.
    Session,
}

impl std::fmt::Display for TokenOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenOrigin::Flag => write!(f, "--token"),
            TokenOrigin::Env => write!(f, "the environment variable {TOKEN_ENV}"),
            TokenOrigin::Config(p) => write!(f, "the subscription's `token` in {}", p.display()),
            TokenOrigin::File(p) => write!(f, "the generated token file {}", p.display()),
            TokenOrigin::Session => write!(f, "the session's creation (it may have been removed)"),
        }
    }
}

pub fn run(config: Option<&Path>, mut args: ListenArgs) -> anyhow::Result<()> {
    let target = reqwest::Url::parse(&args.forward_to)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .context("--forward-to must be an http:// or https:// URL")?;
    let Some(subscription) = args.subscription.take() else {
        let session = session::Session::open(
            config,
            args.url.clone(),
            args.listen_token.take().or(args.admin_token.take()),
            &args.sources,
            (&args.types, args.transform.as_deref()),
        )?;
        eprintln!(
            "Session `{}` opened: events stored from now on, until this stops.",
            session.name
        );
        let base = session.base().to_string();
        let (name, token) = (session.name.clone(), session.token.clone());
        let ran = forward(&args, target, &base, &name, token, TokenOrigin::Session);
        match session.close() {
            Ok(Some(finished)) => eprintln!(
                "Session `{name}` deleted ({finished} of its events left unhandled, finished \
                 as `removed`)."
            ),
            Ok(None) => eprintln!("Session `{name}` was removed already."),
            Err(e) => eprintln!(
                "{e:#}; the server removes it once it has idled for `session_idle_seconds`"
            ),
        }
        return ran;
    };
    let settings = Settings::load(config, std::env::vars())?;
    let base = resolve_url(args.url.as_deref(), config)?;
    let (token, origin) = match (&args.token, std::env::var(TOKEN_ENV)) {
        (Some(t), _) => (t.clone(), TokenOrigin::Flag),
        (None, Ok(t)) if !t.is_empty() => (t, TokenOrigin::Env),
        (None, _) => token_from(settings.as_ref(), config, &subscription)?,
    };
    forward(&args, target, &base, &subscription, token, origin)
}

/// Forward the events of `subscription` to `target` until stopped (Ctrl-C) or refused.
fn forward(
    args: &ListenArgs,
    target: reqwest::Url,
    base: &str,
    subscription: &str,
    token: String,
    origin: TokenOrigin,
) -> anyhow::Result<()> {
    let secret = match &args.signing_secret {
        Some(s) => {
            crate::signature::Scheme::StandardWebhooks
                .check_secret(s)
                .map_err(|m| anyhow::anyhow!("--signing-secret: {m}"))?;
            Secret::new(s.clone())
        }
        None => derived_secret(&token),
    };
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let session = matches!(origin, TokenOrigin::Session);
    let server = server::Server::new(http.clone(), base, subscription, token, origin);
    let timeout = Duration::from_millis(args.timeout_ms);
    eprintln!(
        "Forwarding events of subscription `{subscription}` from {base} to {}\nSigned with {} \
         (Standard Webhooks; --signing-secret to choose). Ctrl-C stops.",
        args.forward_to,
        secret.expose()
    );
    let endpoint = endpoint::Endpoint::new(http, target, secret, timeout);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        if session {
            server.served(SESSION_SERVED).await?;
        }
        batch::Listener::new(server, endpoint, args.batch)
            .run(crate::startup::shutdown_signal())
            .await
    })
}

/// The subscription's token as the server on this machine knows it.
fn token_from(
    settings: Option<&Settings>,
    config: Option<&Path>,
    name: &str,
) -> anyhow::Result<(String, TokenOrigin)> {
    if let Some(s) = settings.and_then(|s| s.subscriptions.iter().find(|s| s.name == name))
        && let Some(t) = &s.token
    {
        let path = config.map_or_else(|| PathBuf::from("webhook-inbox.toml"), Path::to_path_buf);
        return Ok((t.clone(), TokenOrigin::Config(path)));
    }
    let dir = match settings {
        Some(s) => config::data_dir(s),
        None => PathBuf::from("data"),
    };
    let file = crate::subscriptions::token_file(&dir, name);
    match std::fs::read_to_string(&file) {
        Ok(t) => Ok((t.trim().to_string(), TokenOrigin::File(file))),
        Err(e) => Err(anyhow::anyhow!(
            "no token for subscription `{name}`: no --token, no {TOKEN_ENV}, none in the config, \
             and {} cannot be read ({e}); pass the token the subscription was created with",
            file.display()
        )),
    }
}

/// A signing secret derived from the token: the same at every run, so that the local
/// receiver's configuration holds across restarts.
fn derived_secret(token: &str) -> Secret {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    mac.update(b"webhook-inbox listen signing secret");
    let key = mac.finalize().into_bytes();
    Secret::new(format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(&key[..24])
    ))
}
