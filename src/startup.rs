//! Wiring: store, ingest writer, consumers and the HTTP server, and their orderly shutdown.

use std::future::Future;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::http::KeepAlive;
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use tokio::sync::Notify;

use crate::config::Database;
use crate::config::Settings;
use crate::consumer::{Consumer, ConsumerPool, PoolOptions};
use crate::handlers::{DownstreamSystem, HttpDownstream, Registry};
use crate::ingest::{IngestOptions, Ingestor};
use crate::metrics::Metrics;
use crate::rejections::{self, Rejections};
use crate::retention;
use crate::routes::{self, AppState};
use crate::store::{self, Hold, Holder, Store, StoreError};
use crate::tls::Certificates;

/// How long shutdown waits for the last spans to reach the collector.
const TRACES_FLUSH: Duration = Duration::from_secs(5);

/// What a caller (main, tests, benchmarks) may choose beyond the config file.
#[derive(Default)]
pub struct BuildOptions {
    /// HTTP worker threads; default: one per core.
    pub http_workers: Option<usize>,
    /// Replaces the HTTP downstream (tests pass a recording fake).
    pub downstream: Option<Arc<dyn DownstreamSystem>>,
    pub ingest: IngestOptions,
    /// How often idle consumers look for due retries.
    pub idle_poll: Option<Duration>,
    /// Replaces the routing table (tests wrap handlers to count calls).
    pub registry: Option<Box<dyn FnOnce(Registry) -> Registry>>,
    /// How often the background retention purge runs (default [`retention::DEFAULT_EVERY`]).
    pub purge_every: Option<Duration>,
    /// A listener bound already (`serve` binds before it writes any file); default: bind
    /// `listen`.
    pub listener: Option<TcpListener>,
    /// Replaces `alert_every_ms` (tests evaluate alerts every 100 ms; the setting's floor is a
    /// second).
    pub alert_every: Option<Duration>,
    /// The binary whose `transform-worker` command runs transforms; default: this process's
    /// (tests, whose process is the test harness, name the built `webhook-inbox`).
    pub transform_worker: Option<std::path::PathBuf>,
}

pub struct Application {
    server: Server,
    port: u16,
    state: web::Data<AppState>,
    pool_options: PoolOptions,
    /// The registry's `http` and `pull` subscriptions this node serves.
    served: Arc<crate::served::Served>,
    /// Ends the long polls of `pull` clients at shutdown.
    stop_polls: tokio::sync::watch::Sender<bool>,
    purge_every: Duration,
    /// This node's share of its database, while it runs (see [`Store::hold`]).
    _held: Hold,
    /// The HTTPS certificate, when `tls_cert` and `tls_key` are set: SIGHUP reloads it.
    tls: Option<Arc<Certificates>>,
    /// Writes refused deliveries for `GET /rejections` (none when `keep_count` is 0).
    rejection_writer: Option<rejections::Writer>,
    /// This node's record in the registry: kept alive while it runs, removed when it stops.
    node: Node,
    /// The alert evaluator and senders, when `[[alerts]]` names a channel.
    alerts: Option<crate::alerts::Alerts>,
}

/// `host-pid`: which process made an attempt, in the history.
pub fn worker_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}

/// Open the store the settings name and bring its schema up to date.
pub fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn Store>> {
    let database = settings.database()?;
    if let Database::Sqlite(path) = &database {
        refuse_unwritable(path)?;
    }
    let store = store::open(&database)?;
    store.migrate().context("applying migrations")?;
    Ok(store)
}

/// How long `serve` waits for a PostgreSQL server that is not up yet at start (a host's
/// services starting together), trying every [`DATABASE_RETRY`]. Once started, a node rides
/// out an outage by itself (503 meanwhile); at start, past this, it exits.
pub const DATABASE_WAIT: Duration = Duration::from_secs(60);
const DATABASE_RETRY: Duration = Duration::from_secs(2);

/// Open the store and take the node's hold on it. A PostgreSQL server that is unreachable
/// (the store says `Unavailable`) is waited for, up to [`DATABASE_WAIT`], with a log line per
/// try; any other error (a wrong password, a bad URL) ends the start at once.
fn open_and_hold(database: &Database) -> anyhow::Result<(Arc<dyn Store>, Option<Hold>)> {
    let started = std::time::Instant::now();
    let mut tries = 0u32;
    loop {
        tries += 1;
        let attempt = store::open(database).and_then(|store| {
            let held = store.hold(Holder::Node)?;
            Ok((store, held))
        });
        let error = match attempt {
            Ok(opened) => return Ok(opened),
            Err(e) => e,
        };
        let unreachable = matches!(database, Database::Postgres(_))
            && error
                .chain()
                .any(|c| matches!(c.downcast_ref(), Some(StoreError::Unavailable(_))));
        if !unreachable || started.elapsed() + DATABASE_RETRY > DATABASE_WAIT {
            return Err(error.context(format!(
                "opening the database {} (tried {tries} time(s) over {} s)",
                database.display(),
                started.elapsed().as_secs()
            )));
        }
        tracing::warn!(
            database = %database.display(),
            attempt = tries,
            error = %format!("{error:#}"),
            "waiting for the database: not reachable yet, trying again in {} s (at most {} s)",
            DATABASE_RETRY.as_secs(),
            DATABASE_WAIT.as_secs()
        );
        std::thread::sleep(DATABASE_RETRY);
    }
}

/// A database this process cannot write would otherwise start, say it is ready, answer 503 to
/// every delivery and 500 elsewhere, and have its consumers fail eight times a second: refuse
/// to start instead, saying what to fix.
fn refuse_unwritable(path: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => anyhow::bail!(
            "the database file {} is not writable by this process ({e}): give the user that \
             runs webhook-inbox write access to it and to its directory, or mount its \
             filesystem read-write",
            path.display()
        ),
    }
}

impl Application {
    /// Bind the listener and build everything; nothing runs until [`Application::run`].
    pub fn build(settings: Settings, options: BuildOptions) -> anyhow::Result<Application> {
        let settings = Arc::new(settings);
        // Bound first: a port in use must not leave a new database file behind.
        let listener = match options.listener {
            Some(listener) => listener,
            None => TcpListener::bind(&settings.listen)
                .with_context(|| format!("binding {}", settings.listen))?,
        };
        let database = settings.database()?;
        if let Database::Sqlite(path) = &database {
            refuse_unwritable(path)?;
        }
        let tls = match (&settings.tls_cert, &settings.tls_key) {
            (Some(cert), Some(key)) => Some(Certificates::load(cert, key)?),
            _ => None,
        };
        let (store, held) = open_and_hold(&database)?;
        let held = held.ok_or_else(|| {
            anyhow::anyhow!(
                "a `webhook-inbox copy` into this database is running: start the node once it \
                 has finished"
            )
        })?;
        // Migrated once held: never under a copy that is filling the database.
        store.migrate().context("applying migrations")?;
        if let Some(started) = store.unfinished_copy()? {
            anyhow::bail!(
                "a `webhook-inbox copy` into this database started at {} and did not finish: the \
                 database is half filled. Run the same copy again with --allow-non-empty to \
                 finish it, then start the node",
                crate::domain::time::rfc3339(started)
            );
        }
        let mut subscriptions = crate::config::subscriptions_of(&settings)?;
        let vault = Arc::new(crate::secrets::Vault::new(
            Arc::clone(&store),
            crate::secrets::Sealer::from_base64(settings.secrets_key.expose())?,
        ));
        crate::secrets::prepare(&settings, &vault, &mut subscriptions)
            .context("the subscriptions' secrets")?;
        vault
            .check_all(crate::domain::time::now_ms())
            .context("the subscriptions' secrets")?;
        crate::config::check_tokens(&subscriptions, &settings)?;
        // This node's record first (the names its config holds), then its config applied as
        // the desired state of those: a subscription another live node's config names stays.
        let node = Node {
            name: format!(
                "{}-{}",
                worker_name(),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            subscriptions: subscriptions.iter().map(|s| s.name.clone()).collect(),
            session_idle_ms: i64::try_from(settings.session_idle_seconds.saturating_mul(1000))
                .unwrap_or(i64::MAX),
        };
        store
            .node_seen(
                &node.name,
                &node.subscriptions,
                crate::domain::time::now_ms(),
            )
            .context("recording this node")?;
        store
            .sync_subscriptions(&subscriptions, crate::domain::time::now_ms())
            .context("applying the config's subscriptions")?;
        let metrics = Arc::new(Metrics::with_sources(
            settings.sources.iter().map(|s| s.name.as_str()),
        ));
        let traces = crate::telemetry::Traces::start(&settings.telemetry, metrics.span_counters())
            .context("starting the span exporter ([telemetry])")?;
        let transforms = Arc::new(match options.transform_worker {
            Some(exe) => crate::transform::Pool::new(exe),
            None => crate::transform::Pool::of_this_binary()
                .context("finding this binary, which runs the transforms")?,
        });
        let forward_options = crate::forward::ForwardOptions {
            transforms: Arc::clone(&transforms),
            traces: traces.clone(),
            lease_ms: settings.consumers.lease_ms(),
            idle_poll: options.idle_poll.unwrap_or(Duration::from_millis(500)),
            name: worker_name(),
        };
        let queued = Arc::new(Notify::new());
        store.on_queued(Arc::clone(&queued));
        let ingest = Ingestor::start(Arc::clone(&store), options.ingest, Arc::clone(&queued));
        let downstream = options.downstream.unwrap_or_else(|| {
            Arc::new(HttpDownstream::new(
                &settings.downstream.url,
                Duration::from_millis(settings.downstream.timeout_ms),
            ))
        });
        let mut registry = Registry::new(
            Arc::clone(&store),
            downstream,
            settings.downstream.mode,
            Duration::from_millis(settings.downstream.timeout_ms),
        );
        if let Some(wrap) = options.registry {
            registry = wrap(registry);
        }
        let registry = Arc::new(registry);
        let consumer = Arc::new(
            Consumer::new(
                Arc::clone(&store),
                registry,
                Arc::clone(&metrics),
                &settings.consumers,
            )
            .with_subscriptions(&subscriptions)
            .paced_by(ingest.activity())
            .traced_by(traces.clone()),
        );
        let name = worker_name();
        let lease = Duration::from_secs(settings.consumers.lease_seconds);
        let pool_options = PoolOptions {
            workers: settings.consumers.workers,
            call_out_workers: settings.downstream.concurrency,
            batch_size: settings.consumers.batch_size,
            idle_poll: options.idle_poll.unwrap_or(Duration::from_millis(500)),
            sweep_every: (lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(5)),
            name: name.clone(),
        };
        let (rejections, rejection_writer) = Rejections::new(
            Arc::clone(&store),
            &settings.rejections,
            Arc::clone(&metrics),
        );
        // Every node serves every live `http` and `pull` subscription of the registry, with
        // the registry's settings, whatever its own config names (read once now, so that the
        // pull routes answer from the first request).
        let served = Arc::new(crate::served::Served::new(
            Arc::clone(&store),
            Arc::clone(&metrics),
            Arc::clone(&vault),
            forward_options,
            pool_options.workers > 0,
        ));
        served
            .refresh()
            .context("reading the registry's subscriptions")?;
        let alerts = crate::alerts::Alerts::new(
            Arc::clone(&store),
            Arc::clone(&settings),
            &metrics,
            node.name.clone(),
            options.alert_every,
        )?;
        let (stop_polls, stopping) = tokio::sync::watch::channel(false);
        let state = web::Data::new(AppState {
            settings: Arc::clone(&settings),
            store,
            ingest,
            metrics,
            consumer,
            queued,
            worker_name: name,
            rejections,
            served: Arc::clone(&served),
            vault,
            stopping,
            traces,
            transforms,
        });
        let port = listener.local_addr()?.port();
        let app_state = state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .wrap(routes::RequestId)
                .configure(routes::configure)
        });
        let mut server = match &tls {
            Some(certificates) => {
                server.listen_rustls_0_23(listener, certificates.server_config()?)?
            }
            None => server.listen(listener)?,
        }
        .disable_signals()
        .backlog(4096)
        // Longer than a handler's bound: in-flight requests finish before exit.
        .shutdown_timeout(30);
        let workers = options
            .http_workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let limits = &settings.connections;
        server = server
            .workers(workers)
            // actix counts connections per worker.
            .max_connections(limits.max.div_ceil(workers))
            .client_request_timeout(Duration::from_millis(limits.header_timeout_ms))
            .keep_alive(match limits.keep_alive_seconds {
                0 => KeepAlive::Disabled,
                s => KeepAlive::Timeout(Duration::from_secs(s)),
            });
        Ok(Application {
            server: server.run(),
            port,
            state,
            pool_options,
            served,
            stop_polls,
            purge_every: options.purge_every.unwrap_or(retention::DEFAULT_EVERY),
            _held: held,
            tls,
            rejection_writer,
            node,
            alerts,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether it serves HTTPS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.state.store)
    }

    pub fn consumer(&self) -> Arc<Consumer> {
        Arc::clone(&self.state.consumer)
    }

    /// Serve until `shutdown` resolves, then stop accepting, stop claiming, let started work
    /// finish, release unstarted claims, and return.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let pool = ConsumerPool::start(
            Arc::clone(&self.state.consumer),
            self.pool_options,
            Arc::clone(&self.state.queued),
        );
        let (stop_serving, serving_stopped) = tokio::sync::watch::channel(false);
        let serving = tokio::spawn(
            Arc::clone(&self.served).run(Arc::clone(&self.state.queued), serving_stopped),
        );
        let (stop_purge, purge_stopped) = tokio::sync::watch::channel(false);
        let purge = tokio::spawn(retention::run_background(
            Arc::clone(&self.state.store),
            self.state.settings.retention.clone(),
            Arc::clone(&self.state.metrics),
            self.purge_every,
            purge_stopped,
        ));
        let reloads = self
            .tls
            .map(|certificates| tokio::spawn(reload_on_hangup(certificates)));
        let rejections = self
            .rejection_writer
            .map(|writer| tokio::spawn(writer.run()));
        let (stop_heartbeat, heartbeat_stopped) = tokio::sync::watch::channel(false);
        let heartbeat = tokio::spawn(heartbeat(
            Arc::clone(&self.state.store),
            self.node.clone(),
            heartbeat_stopped,
        ));
        let (stop_alerts, alerts_stopped) = tokio::sync::watch::channel(false);
        let alerts = self
            .alerts
            .map(|alerts| tokio::spawn(alerts.run(alerts_stopped)));
        let handle = self.server.handle();
        let stopping = async {
            shutdown.await;
            tracing::info!("shutting down: no new deliveries or claims");
            // The purge stops after its current batch (a batch is one short transaction).
            let _ = stop_purge.send(true);
            // Long polls answer (with what they have, usually nothing) instead of holding
            // the graceful stop up.
            let _ = self.stop_polls.send(true);
            // Both at once: stop accepting and claiming; in-flight requests and handlers finish.
            let _ = stop_serving.send(true);
            let (_, (), served) = tokio::join!(handle.stop(true), pool.shutdown(), serving);
            if let Err(e) = served {
                tracing::error!(error = %e, "the forwarders' task ended abnormally");
            }
        };
        // The server is polled here, not spawned: its first poll starts the HTTP workers, and
        // on this thread they find the actix System that `serve` runs under (see `cli::serve`).
        let (served, ()) = tokio::join!(self.server, stopping);
        for task in [reloads, rejections].into_iter().flatten() {
            task.abort();
        }
        purge.await.context("retention purge task")?;
        let _ = stop_alerts.send(true);
        if let Some(alerts) = alerts {
            // A call to a channel in flight is bounded by its timeout.
            alerts.await.context("alert tasks")?;
        }
        let _ = stop_heartbeat.send(true);
        heartbeat.await.context("heartbeat task")?;
        // Gone: this node's config keeps no subscription alive any more.
        let (store, node) = (Arc::clone(&self.state.store), self.node.name.clone());
        if let Err(e) = tokio::task::spawn_blocking(move || store.node_gone(&node))
            .await
            .context("node record task")?
        {
            tracing::warn!(error = %e, "cannot remove this node's record: it ages out");
        }
        // Last: the spans of the work finished above, sent within a bound.
        let traces = self.state.traces.clone();
        tokio::task::spawn_blocking(move || traces.shutdown(TRACES_FLUSH))
            .await
            .context("span export task")?;
        served.context("HTTP server")?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// A serving node as the registry knows it (see `store::registry`).
#[derive(Debug, Clone)]
struct Node {
    name: String,
    /// The subscriptions its config names.
    subscriptions: Vec<String>,
    /// A `listen` session not seen for this long is removed (`session_idle_seconds`).
    session_idle_ms: i64,
}

/// Say every `registry::HEARTBEAT` that this node is alive, until stopped. A missed beat (the
/// store unavailable) is logged; the node's config then stops holding its subscriptions only
/// once the record is `registry::NODE_TTL_MS` old.
async fn heartbeat(
    store: Arc<dyn Store>,
    node: Node,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(crate::store::registry::HEARTBEAT) => {}
            _ = stopped.changed() => return,
        }
        let (store, node) = (Arc::clone(&store), node.clone());
        let beat = tokio::task::spawn_blocking(move || {
            let now = crate::domain::time::now_ms();
            store.node_seen(&node.name, &node.subscriptions, now)?;
            store.prune_subscriptions(now, now.saturating_sub(node.session_idle_ms))
        })
        .await;
        match beat {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(
                removed,
                "subscriptions no live node's config names any more, or idle sessions: removed"
            ),
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot record this node's heartbeat"),
            Err(e) => tracing::warn!(error = %e, "the heartbeat task failed"),
        }
    }
}

/// Read the certificate files again at each SIGHUP (a renewed certificate), for as long as the
/// server runs. Connections already open are not touched.
async fn reload_on_hangup(certificates: Arc<Certificates>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch SIGHUP: the certificate will not reload");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            match certificates.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "SIGHUP: the TLS certificate did not reload; the one in use stays"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = certificates;
}

/// SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}
