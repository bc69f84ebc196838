//! Wiring: store, ingest writer, consumers and the HTTP server, and their orderly shutdown.

mod database;
mod tasks;

pub use database::{DATABASE_WAIT, open_store};
use database::{open_and_hold, refuse_unwritable};
pub use tasks::shutdown_signal;
use tasks::{Node, heartbeat, reload_on_hangup};

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
use crate::store::{Hold, Store};
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
