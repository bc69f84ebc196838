//! webhook-inbox: a webhook receiver with idempotent consumers.
//!
//! Providers POST signed webhooks; each delivery is verified on its raw bytes, stored under the
//! primary key `(source, event_id)` and acknowledged only after the commit. A pool of consumers
//! claims events atomically and applies their effects once per business fact.
//!
//! # Layout
//! - [`config`]: typed settings (defaults, TOML file, `WEBHOOK_INBOX_*` env), validation, the
//!   embedded default.
//! - [`domain`]: validated values every layer reads (source names, event ids, the event types
//!   the implicit subscriptions take, order credits, times, payloads, the database a URL names,
//!   the `[consumers]` defaults).
//! - [`signature`]: one file per signature scheme; verification and signing.
//! - [`store`]: all SQL, behind the [`store::Store`] trait: the ops half written once over a
//!   dialect ([`store::sql`]), the hot paths per store ([`store::sqlite`], the embedded default,
//!   and [`store::postgres`]), the rules every store follows ([`store::rules`]: finishing,
//!   retries and their backoff).
//! - [`subscriptions`]: the subscriptions a config declares (kinds, routes, filters, ordering,
//!   rules), validated in one place for the config, the API and the CLI; who claims each kind.
//!   It reads no config: [`config`] hands it the defaults and names a mistake's key.
//! - [`ingest`]: the group-commit writer that stores deliveries.
//! - [`consumer`]: claim, handle, finish, sweep; the worker pool.
//! - [`forward`]: `http`, `nats` and `amqp` subscriptions: signed calls to the user's endpoint or
//!   publishes to a broker, one claim, retry and circuit-breaker path; [`forward::shape`]: what
//!   a delivery does with a transform's outcome (the pull routes' too).
//! - [`pull`]: `pull` subscriptions served over HTTP: claims, acks and leases for the user's
//!   workers, and `listen` sessions.
//! - [`transform`]: a subscription's jq program (jaq), run at delivery in warm worker
//!   processes with a CPU, output and memory budget; it reads no claim and no store.
//! - [`secrets`]: subscriptions' secrets shared through the store: sealed at rest with an
//!   optional key, cached for the forwarders and pull routes, shown and rotated with a grace.
//! - [`served`]: the registry's `http` and `pull` subscriptions a node serves, followed as the
//!   registry changes.
//! - [`handlers`]: one file per effect (loyalty credit, audit log, downstream submission).
//! - [`routes`]: HTTP only (extract, call, map errors). [`tls`]: HTTPS certificates, reloaded
//!   on SIGHUP.
//! - [`retention`]: the purge that frees terminal events' bodies and keeps their tombstones.
//! - [`rejections`]: deliveries refused at the edge, kept (bounded) for ops.
//! - [`alerts`]: conditions evaluated by every node, one notice per start and clear, sent to a
//!   chat or a signed webhook from an outbox in the store.
//! - [`metrics`], [`telemetry`]: Prometheus registry; logs through `tracing`; OpenTelemetry
//!   traces of each delivery's path, exported over OTLP/HTTP.
//! - [`startup`]: wiring and graceful shutdown. [`cli`]: the command line.
//!
//! The modules read one way. Lowest first, each reading only those before it: `domain`,
//! `signature`, `tls`; `transform`; `subscriptions`; `config`; `store`; `ingest`, `handlers`,
//! `secrets`, `telemetry`; `metrics`; `consumer`, `forward`, `rejections`, `retention`;
//! `pull`, `alerts`; `served`; `routes`; `startup`; `cli` (`tests/api/layout.rs` holds this
//! list and fails on a read against it, naming the cycle it makes).

pub mod alerts;
pub mod cli;
pub mod config;
pub mod consumer;
pub mod domain;
pub mod forward;
pub mod handlers;
pub mod ingest;
pub mod metrics;
pub mod pull;
pub mod rejections;
pub mod retention;
pub mod routes;
pub mod secrets;
pub mod served;
pub mod signature;
pub mod startup;
pub mod store;
pub mod subscriptions;
pub mod telemetry;
pub mod tls;
pub mod transform;
