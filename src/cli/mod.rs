//! The command line: `serve`, `migrate`, `sign`, `events`, `listen`, `replay`, `loadgen`, `backup`, `copy`, `alerts`, and
//! `completions`/`man` for shells and manuals. `main.rs` only calls
//! [`run`] and maps errors to exit codes: 0 success, 1 the API refused (or a replay line was
//! rejected), 2 usage or configuration error, 3 the server could not be reached or failed.

mod alerts;
mod backup;
pub mod client;
mod copy;
mod events;
mod listen;
mod loadgen;
mod manual;
mod purge;
mod rejections;
mod replay;
mod retry;
mod secrets;
mod show;
mod sign;
mod subscription_changes;
mod subscriptions;
mod table;
mod when;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::{self, Database, Settings};
use crate::startup::{Application, BuildOptions, shutdown_signal};
use crate::store;
use crate::telemetry;

#[derive(Debug, Parser)]
#[command(
    name = "webhook-inbox",
    version,
    about = "A webhook receiver with idempotent consumers"
)]
pub struct Cli {
    /// Config file (default: ./webhook-inbox.toml if present, else the embedded default).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    before: client::Before,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP server and the consumer pool (Ctrl-C stops it gracefully).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Print the headers that sign a body read from stdin, for curl (`curl -H @headers`).
    Sign(sign::SignArgs),
    /// Inspect, retry and export events through the HTTP API.
    #[command(subcommand, after_help = client::RESOLUTION_HELP)]
    Events(events::EventsCommand),
    /// Deliveries refused at the edge (bad signature, unknown source, …), through the HTTP API.
    #[command(subcommand)]
    Rejections(rejections::RejectionsCommand),
    /// The user's consumers: list, pause, resume, backfill, recover, create, update, delete,
    /// through the HTTP API.
    #[command(subcommand)]
    Subscriptions(Box<subscriptions::SubscriptionsCommand>),
    /// Forward a pull subscription's events to a local URL, signed, without opening a port
    /// (a developer's laptop).
    Listen(listen::ListenArgs),
    /// Redeliver a replay file (from `events export`), re-signed with fresh timestamps.
    Replay(replay::ReplayArgs),
    /// Send unique signed deliveries at a fixed concurrency; report throughput and latency.
    Loadgen(loadgen::LoadgenArgs),
    /// Print a shell completion script (e.g. `webhook-inbox completions bash`).
    Completions(manual::CompletionsArgs),
    /// Print the man page, or write one page per command into a directory.
    Man(manual::ManArgs),
    /// Copy the SQLite database to FILE, consistently, while the server keeps serving.
    Backup(backup::BackupArgs),
    /// Copy a whole database into another store (e.g. SQLite into PostgreSQL).
    Copy(copy::CopyArgs),
    /// The `[[alerts]]` channels: `alerts test` sends each a test notice.
    #[command(subcommand)]
    Alerts(alerts::AlertsCommand),
    /// A worker process of the node's transforms (started by `serve`; reads its pipe).
    #[command(hide = true)]
    TransformWorker,
}

/// Settings as `serve` uses them, and whether they are the embedded default.
pub struct Loaded {
    pub settings: Settings,
    pub embedded: bool,
}

/// The config file, else the embedded default; an empty admin token is generated and kept.
pub fn load_settings(path: Option<&Path>) -> anyhow::Result<Loaded> {
    complete_settings(read_settings(path)?)
}

/// The config file, else the embedded default, as written: nothing generated or kept yet.
fn read_settings(path: Option<&Path>) -> anyhow::Result<Loaded> {
    Ok(match Settings::load(path, std::env::vars())? {
        Some(settings) => Loaded {
            settings,
            embedded: false,
        },
        None => Loaded {
            settings: Settings::from_toml("", "embedded default", std::env::vars())?,
            embedded: true,
        },
    })
}

/// The files settings may need, made once and kept: the embedded default's demo source and an
/// empty admin token, under the data directory.
fn complete_settings(mut loaded: Loaded) -> anyhow::Result<Loaded> {
    if loaded.embedded {
        config::add_demo_source(&mut loaded.settings)?;
    }
    config::ensure_admin_token(&mut loaded.settings)?;
    Ok(loaded)
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    let api = client::Api {
        config: cli.config.as_deref(),
        before: &cli.before,
    };
    let talks_to_api = matches!(
        cli.command,
        Command::Events(_) | Command::Rejections(_) | Command::Subscriptions(_)
    );
    if !talks_to_api && (cli.before.url.is_some() || cli.before.token.is_some()) {
        // A usage error (exit 2): `serve` takes no --url, `listen`'s --token is not an admin's.
        anyhow::bail!(
            "--url and --token before the subcommand are for `events`, `rejections` and \
             `subscriptions`; give a command's own options after its name"
        );
    }
    match cli.command {
        Command::Serve => serve(cli.config.as_deref()),
        Command::Migrate => {
            let loaded = load_settings(cli.config.as_deref())?;
            telemetry::init(loaded.settings.log_format);
            // Not `open_store`, which migrates already: this command reports what it applied.
            let database = loaded.settings.database()?;
            let existed = match &database {
                Database::Sqlite(path) => path.exists(),
                Database::Postgres(_) => true,
            };
            let store = store::open(&database)?;
            let applied = store.migrate().context("applying migrations")?;
            println!("{}", migrate_report(&database.display(), existed, &applied));
            Ok(())
        }
        Command::Sign(args) => sign::run(cli.config.as_deref(), args),
        Command::Events(command) => events::run(&api, command),
        Command::Rejections(command) => rejections::run(&api, command),
        Command::Subscriptions(command) => subscriptions::run(&api, *command),
        Command::Listen(args) => listen::run(cli.config.as_deref(), args),
        Command::Replay(args) => replay::run(cli.config.as_deref(), args),
        Command::Loadgen(args) => loadgen::run(args),
        Command::Backup(args) => backup::run(cli.config.as_deref(), args),
        Command::Copy(args) => copy::run(args),
        Command::Alerts(command) => alerts::run(cli.config.as_deref(), command),
        Command::Completions(args) => manual::completions(args),
        Command::Man(args) => manual::man(args),
        Command::TransformWorker => Ok(crate::transform::worker::serve()?),
    }
}

/// One line for `migrate`: what was created and applied, in words.
fn migrate_report(path: &str, existed: bool, applied: &[u32]) -> String {
    let list = applied
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match (existed, applied.is_empty()) {
        (false, _) => format!("created database {path} and applied migrations {list}"),
        (true, true) => format!("database {path} is up to date: no migration to apply"),
        (true, false) => format!("database {path}: applied migrations {list}; now up to date"),
    }
}

fn serve(config: Option<&Path>) -> anyhow::Result<()> {
    let loaded = read_settings(config)?;
    // Bound first: a port in use must leave no token, secret or database file behind.
    let listener = std::net::TcpListener::bind(&loaded.settings.listen)
        .with_context(|| format!("binding {}", loaded.settings.listen))?;
    let loaded = complete_settings(loaded)?;
    telemetry::init(loaded.settings.log_format);
    let settings = loaded.settings;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Under an actix System, each HTTP worker runs its requests on a `LocalSet` (an actix
    // Arbiter). The ingest writer answers a whole batch from its own thread, and a `LocalSet`
    // turns those wake-ups into one wake of the worker; without a System, actix-server runs
    // each request as a task of its own, and every answer costs the writer an eventfd write
    // to wake the worker (measured: 0.75 write(2) per delivery against 0.06, about 5% of
    // ingest's CPU; docs/performance.md).
    let system = actix_web::rt::System::with_tokio_rt(|| runtime);
    system.block_on(async move {
        let listen = settings.listen.clone();
        let data = config::data_dir(&settings);
        let options = BuildOptions {
            listener: Some(listener),
            ..BuildOptions::default()
        };
        let app = Application::build(settings, options)?;
        let scheme = if app.tls() { "https" } else { "http" };
        tracing::info!(%listen, scheme, "webhook-inbox listening");
        if loaded.embedded {
            print_first_steps(&listen, &data, app.tls());
        }
        app.run(shutdown_signal()).await
    })
}

fn print_first_steps(listen: &str, data: &Path, tls: bool) {
    let d = data.display();
    let mut url = client::url_for_listen(listen);
    if tls {
        url = url.replacen("http://", "https://", 1);
    }
    let bin = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "webhook-inbox".into());
    eprintln!(
        "
webhook-inbox is running on the embedded default (no config file); Ctrl-C stops it:
  listening on  {url}
  database      {d}/webhook-inbox.db
  source        demo (standard-webhooks), secret in {d}/demo-secret
  admin token   {d}/admin-token

Send a first webhook from another terminal, in this directory:
  scratch=$(mktemp -d)
  echo '{{\"type\":\"order.completed\",\"data\":{{\"order_id\":\"o-1\",\"customer_id\":\"c-1\",\"points\":10}}}}' > \"$scratch/body.json\"
  {bin} sign --source demo < \"$scratch/body.json\" > \"$scratch/headers.txt\"
  curl -i -H @\"$scratch/headers.txt\" --data-binary @\"$scratch/body.json\" {url}/webhooks/demo

Then look at it:
  curl -H \"Authorization: Bearer $(cat {d}/admin-token)\" {url}/loyalty/c-1
  {bin} events list
"
    );
}

/// The process exit code for an error of [`run`].
pub fn exit_code(error: &anyhow::Error) -> u8 {
    error
        .downcast_ref::<client::CliError>()
        .map(client::CliError::exit_code)
        .unwrap_or(2)
}
