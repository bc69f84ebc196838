//! Prometheus metrics in a registry owned by the application (no process-global recorder), so
//! that several servers can run in one test process without sharing counters.

use std::collections::HashMap;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::{LifecycleCounts, StatusCounts, SubscriptionInfo};

type Labels = Vec<(&'static str, String)>;
/// Labels whose values are all fixed names (handlers, outcomes, results): no allocation per
/// observation, which the consumers make twice per event.
type StaticLabels = [(&'static str, &'static str); 2];

/// The results of `webhook_inbox_deliveries_total`.
const DELIVERY_RESULTS: [&str; 5] = [
    "queued",
    "duplicate",
    "payload_mismatch",
    "rejected",
    "forbidden",
];

pub struct Metrics {
    registry: Registry,
    deliveries: Family<Labels, Counter>,
    /// The delivery counters of the configured sources, looked up without building labels (a
    /// delivery is the hot path); every series exists from the start, at 0.
    source_deliveries: HashMap<String, [Counter; 5]>,
    processed: Family<StaticLabels, Counter>,
    attempts: Family<StaticLabels, Counter>,
    events: Family<Labels, Gauge>,
    oldest_pending: Gauge<f64, std::sync::atomic::AtomicU64>,
    subscription_events: Family<Labels, Gauge>,
    subscription_lag: Family<Labels, Gauge>,
    subscription_oldest: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    subscription_paused: Family<Labels, Gauge>,
    subscription_probing: Family<Labels, Gauge>,
    forwards: Family<Labels, Counter>,
    pulls: Family<Labels, Counter>,
    filtered_out: Family<Labels, Counter>,
    transform_failures: Family<Labels, Counter>,
    transform_filtered: Family<Labels, Counter>,
    alerts: Family<Labels, Counter>,
    alert_evaluations: Counter,
    purged: Counter,
    rejections_dropped: Counter,
    trace_spans: Family<Labels, Counter>,
    tombstones: Gauge,
    database_bytes: Family<Labels, Gauge>,
    ingest_seconds: Histogram,
    processing_seconds: Histogram,
}

fn histogram() -> Histogram {
    // 100 µs .. ~13 s: from a fast commit to a slow downstream call.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn delivery_labels(source: &str, result: &str) -> Labels {
    vec![("source", source.to_string()), ("result", result.into())]
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::with_sources(std::iter::empty())
    }

    /// Metrics with the delivery counters of these sources created up front.
    pub fn with_sources<'a>(sources: impl IntoIterator<Item = &'a str>) -> Metrics {
        let deliveries = Family::<Labels, Counter>::default();
        let source_deliveries = sources
            .into_iter()
            .map(|source| {
                let counters = DELIVERY_RESULTS.map(|result| {
                    deliveries
                        .get_or_create(&delivery_labels(source, result))
                        .clone()
                });
                (source.to_string(), counters)
            })
            .collect();
        let mut registry = Registry::default();
        let m = Metrics {
            deliveries,
            source_deliveries,
            processed: Family::default(),
            attempts: Family::default(),
            events: Family::default(),
            oldest_pending: Gauge::default(),
            subscription_events: Family::default(),
            subscription_lag: Family::default(),
            subscription_oldest: Family::default(),
            subscription_paused: Family::default(),
            subscription_probing: Family::default(),
            forwards: Family::default(),
            pulls: Family::default(),
            filtered_out: Family::default(),
            transform_failures: Family::default(),
            transform_filtered: Family::default(),
            alerts: Family::default(),
            alert_evaluations: Counter::default(),
            purged: Counter::default(),
            rejections_dropped: Counter::default(),
            trace_spans: Family::default(),
            tombstones: Gauge::default(),
            database_bytes: Family::default(),
            ingest_seconds: histogram(),
            processing_seconds: histogram(),
            registry: Registry::default(),
        };
        // Counters get their `_total` suffix from the encoder.
        registry.register(
            "webhook_inbox_deliveries",
            "Webhook deliveries by source and result (queued, duplicate, payload_mismatch, rejected, forbidden: from outside the source's allow_from)",
            m.deliveries.clone(),
        );
        registry.register(
            "webhook_inbox_processed",
            "Events completed by handler and outcome",
            m.processed.clone(),
        );
        registry.register(
            "webhook_inbox_attempts",
            "Handler attempts by handler and result",
            m.attempts.clone(),
        );
        registry.register(
            "webhook_inbox_events",
            "Events in the store by status",
            m.events.clone(),
        );
        registry.register(
            "webhook_inbox_oldest_pending_seconds",
            "Age of the oldest pending event (0 when none)",
            m.oldest_pending.clone(),
        );
        registry.register(
            "webhook_inbox_subscription_events",
            "Each subscription's events by status (pending, claimed, failed)",
            m.subscription_events.clone(),
        );
        registry.register(
            "webhook_inbox_subscription_lag",
            "Events waiting for each subscription (pending or claimed)",
            m.subscription_lag.clone(),
        );
        registry.register(
            "webhook_inbox_subscription_oldest_pending_seconds",
            "Age of each subscription's longest-waiting due event (0 when none)",
            m.subscription_oldest.clone(),
        );
        registry.register(
            "webhook_inbox_subscription_paused",
            "1 while a subscription is paused by ops",
            m.subscription_paused.clone(),
        );
        registry.register(
            "webhook_inbox_purged",
            "Events this process made tombstones of (retention purge)",
            m.purged.clone(),
        );
        registry.register(
            "webhook_inbox_rejections_dropped",
            "Refused deliveries not kept for GET /rejections: the writer's queue was full (a flood)",
            m.rejections_dropped.clone(),
        );
        registry.register(
            "webhook_inbox_trace_spans",
            "Spans of traces ([telemetry]) by result: exported, dropped (the export queue was full), failed (the collector refused or did not answer)",
            m.trace_spans.clone(),
        );
        registry.register(
            "webhook_inbox_forwards",
            "Calls of http subscriptions to their endpoints, by subscription and result (2xx, 4xx, 5xx, 410, timeout, connection)",
            m.forwards.clone(),
        );
        registry.register(
            "webhook_inbox_pulls",
            "Events of pull subscriptions claimed by clients and acknowledged, by subscription and action (claimed, done, retry, fail, release, lease_lost)",
            m.pulls.clone(),
        );
        registry.register(
            "webhook_inbox_filtered_out",
            "Events a subscription's route took and its filter left out (no state), by subscription: counted by this node's fan-outs",
            m.filtered_out.clone(),
        );
        registry.register(
            "webhook_inbox_transform_failures",
            "Deliveries whose transform failed (an error, several outputs, a budget), by subscription: each fails its state permanently",
            m.transform_failures.clone(),
        );
        registry.register(
            "webhook_inbox_transform_filtered",
            "Deliveries whose transform gave no output, by subscription: each completes its state with outcome `filtered`",
            m.transform_filtered.clone(),
        );
        registry.register(
            "webhook_inbox_alerts",
            "Alert notices by result: sent, retried (sent after a failed attempt; also counted in sent), failed (an attempt), dropped (given up)",
            m.alerts.clone(),
        );
        registry.register(
            "webhook_inbox_alert_evaluations",
            "Rounds of alert evaluation this node finished (whatever they found)",
            m.alert_evaluations.clone(),
        );
        registry.register(
            "webhook_inbox_subscription_probing",
            "1 while a subscription's circuit breaker is open (its endpoint or the downstream failed; one probe per interval)",
            m.subscription_probing.clone(),
        );
        registry.register(
            "webhook_inbox_tombstones",
            "Purged events kept as tombstones (their dedup key, no body)",
            m.tombstones.clone(),
        );
        registry.register(
            "webhook_inbox_database_bytes",
            "SQLite database file pages, in use or free (reused before the file grows)",
            m.database_bytes.clone(),
        );
        registry.register(
            "webhook_inbox_ingest_seconds",
            "Time from a delivery's arrival to its answer",
            m.ingest_seconds.clone(),
        );
        registry.register(
            "webhook_inbox_processing_seconds",
            "Time a handler takes for one event",
            m.processing_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    /// `result`: queued, duplicate, payload_mismatch, rejected or forbidden.
    pub fn delivery(&self, source: &str, result: &'static str) {
        let known = self.source_deliveries.get(source).and_then(|counters| {
            let i = DELIVERY_RESULTS.iter().position(|r| *r == result)?;
            Some(&counters[i])
        });
        match known {
            Some(counter) => counter.inc(),
            None => self
                .deliveries
                .get_or_create(&delivery_labels(source, result))
                .inc(),
        };
    }

    pub fn processed(&self, handler: &'static str, outcome: &'static str) {
        self.processed
            .get_or_create(&[("handler", handler), ("outcome", outcome)])
            .inc();
    }

    pub fn attempt(&self, handler: &'static str, result: &'static str) {
        self.attempts
            .get_or_create(&[("handler", handler), ("result", result)])
            .inc();
    }

    /// The counter of one `http` subscription's calls with one result (see
    /// `webhook_inbox_forwards`), for its forwarder to keep: no labels built per call.
    pub fn forward_counter(&self, subscription: &str, result: &'static str) -> Counter {
        self.forwards
            .get_or_create(&vec![
                ("subscription", subscription.to_string()),
                ("result", result.into()),
            ])
            .clone()
    }

    /// One subscription's count of failed transforms (`failures`) or of transforms that gave
    /// no output.
    pub fn transform_counter(&self, subscription: &str, failures: bool) -> Counter {
        let family = if failures {
            &self.transform_failures
        } else {
            &self.transform_filtered
        };
        family
            .get_or_create(&vec![("subscription", subscription.to_string())])
            .clone()
    }

    /// The counter of one `pull` subscription's action (see `webhook_inbox_pulls`).
    pub fn pull_counter(&self, subscription: &str, action: &'static str) -> Counter {
        self.pulls
            .get_or_create(&vec![
                ("subscription", subscription.to_string()),
                ("action", action.into()),
            ])
            .clone()
    }

    /// `webhook_inbox_alert_evaluations_total`, for the evaluator to keep.
    pub fn alert_evaluations(&self) -> Counter {
        self.alert_evaluations.clone()
    }

    /// The counter of one result of `webhook_inbox_alerts`, for the alert tasks to keep.
    pub fn alert_counter(&self, result: &'static str) -> Counter {
        self.alerts
            .get_or_create(&vec![("result", result.into())])
            .clone()
    }

    /// The counters the span exporter keeps (see `webhook_inbox_trace_spans`).
    pub fn span_counters(&self) -> crate::telemetry::export::SpanCounters {
        let counter = |result: &str| {
            self.trace_spans
                .get_or_create(&vec![("result", result.into())])
                .clone()
        };
        crate::telemetry::export::SpanCounters {
            exported: counter("exported"),
            dropped: counter("dropped"),
            failed: counter("failed"),
        }
    }

    pub fn observe_ingest(&self, seconds: f64) {
        self.ingest_seconds.observe(seconds);
    }

    pub fn observe_processing(&self, seconds: f64) {
        self.processing_seconds.observe(seconds);
    }

    pub fn purged(&self, n: usize) {
        self.purged.inc_by(n as u64);
    }

    pub fn rejection_dropped(&self) {
        self.rejections_dropped.inc();
    }

    /// The retention gauges, set before a render.
    pub fn set_lifecycle(&self, counts: &LifecycleCounts) {
        self.tombstones.set(counts.tombstones);
        for (state, bytes) in [
            ("used", counts.database_bytes - counts.free_bytes),
            ("free", counts.free_bytes),
        ] {
            self.database_bytes
                .get_or_create(&vec![("pages", state.into())])
                .set(bytes);
        }
    }

    /// The per-subscription gauges, set before a render (live subscriptions only).
    pub fn set_subscriptions(&self, subs: &[SubscriptionInfo], now_ms: i64) {
        for s in subs.iter().filter(|s| !s.removed) {
            let name = || vec![("subscription", s.name.clone())];
            for (status, n) in [
                ("pending", s.counts.pending),
                ("claimed", s.counts.claimed),
                ("failed", s.counts.failed),
            ] {
                let labels = vec![("subscription", s.name.clone()), ("status", status.into())];
                self.subscription_events.get_or_create(&labels).set(n);
            }
            self.subscription_lag
                .get_or_create(&name())
                .set(s.counts.pending + s.counts.claimed);
            self.subscription_oldest
                .get_or_create(&name())
                .set(s.counts.lag_seconds(now_ms).unwrap_or(0.0));
            self.subscription_paused
                .get_or_create(&name())
                .set(i64::from(s.paused));
            if s.has_breaker() {
                self.subscription_probing
                    .get_or_create(&name())
                    .set(i64::from(s.probe_at.is_some()));
            }
        }
    }

    /// Render the text format, with the store-derived gauges read just before.
    /// Bring `webhook_inbox_filtered_out` up to the store's totals (this node's fan-outs).
    pub fn set_filtered_out(&self, totals: &[(String, u64)]) {
        for (name, total) in totals {
            let counter = self
                .filtered_out
                .get_or_create(&vec![("subscription", name.clone())]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    pub fn render(&self, counts: &StatusCounts, now_ms: i64) -> String {
        for (status, n) in [
            ("pending", counts.pending),
            ("claimed", counts.claimed),
            ("completed", counts.completed),
            ("failed", counts.failed),
        ] {
            self.events
                .get_or_create(&vec![("status", status.into())])
                .set(n);
        }
        self.oldest_pending
            .set(counts.lag_seconds(now_ms).unwrap_or(0.0));
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
