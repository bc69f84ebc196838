//! OpenTelemetry traces of a delivery's path (SPEC section 15): off unless
//! `[telemetry] otlp_endpoint` is set.
//!
//! The spans are made with the OpenTelemetry API directly, not bridged from `tracing`: only the
//! attributes written here leave the process (never a body, a header or a secret), an
//! unsampled delivery costs no span at all, and a delivery's spans are parented across the
//! group commit and the store, where no `tracing` span reaches.
//!
//! A trace:
//! - `webhook.receive` (server): the request, child of the provider's `traceparent` when it
//!   sent one; its children `webhook.verify` and `webhook.commit` (the wait for the group
//!   commit).
//! - Its context is stored with the event (`traceparent`), so that each subscription's
//!   handling, later and on any node, continues the trace: `webhook.deliver` (consumer), per
//!   subscription and attempt, with `webhook.claim` (the claim that fanned the event out or
//!   took it again), `webhook.transform` (its `transform`, run in a batch with the events
//!   claimed beside it), `webhook.call` (client: an `http` subscription's request, whose
//!   `traceparent` header names it) or `webhook.handle` (an in-process handler), and
//!   `webhook.ack` (the commit of its next state). A `pull` claim's answer carries, per
//!   claim, the context of its `webhook.deliver` span, which ends with the claim: the client's
//!   own spans continue it.
//!
//! Sampling is parent-based: a provider's sampled `traceparent` is sampled, an unsampled one
//! is not, and a new trace is sampled at `sample_ratio`. With tracing off, a provider's
//! `traceparent` is still stored and passed on unchanged (forwards and pull claims), at the
//! cost of the column.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, Span};

use super::export::{self, SpanCounters};
use crate::config::TelemetrySettings;
use crate::store::{Claimed, Finished, Next};

/// The header and field name of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The node's tracer, or nothing when tracing is off; cheap to clone.
#[derive(Clone, Default)]
pub struct Traces {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.on() {
            "Traces(on)"
        } else {
            "Traces(off)"
        })
    }
}

impl Traces {
    /// Tracing off: no span, a provider's `traceparent` passed on.
    pub fn off() -> Traces {
        Traces::default()
    }

    /// The tracer `settings` ask for (off without an endpoint), exporting from a thread of
    /// its own and counting into `counters`.
    pub fn start(settings: &TelemetrySettings, counters: SpanCounters) -> anyhow::Result<Traces> {
        let endpoint = settings.otlp_endpoint.trim();
        if endpoint.is_empty() {
            return Ok(Traces::off());
        }
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("webhook-inbox")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .with_timeout(export::EXPORT_TIMEOUT)
            .with_http_client(export::Client::new()?)
            // A batch that fails is dropped and counted: a retry would hold back the next.
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .build()?;
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(export::Queue::start(exporter, counters)?)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "webhook-inbox");
        Ok(Traces {
            inner: Some(Arc::new(Inner { tracer, provider })),
        })
    }

    pub fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// Send what is queued and stop, within `timeout` (at shutdown).
    pub fn shutdown(&self, timeout: Duration) {
        if let Some(inner) = &self.inner
            && let Err(e) = inner.provider.shutdown_with_timeout(timeout)
        {
            tracing::warn!(error = %e, "spans not all exported at shutdown");
        }
    }

    /// The span of a delivery's request, child of the provider's `traceparent` (the header's
    /// value) when it is a valid one.
    pub fn receive(&self, incoming: Option<&[u8]>) -> Receive {
        let incoming = incoming
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(parse);
        let Some(inner) = &self.inner else {
            return Receive {
                span: None,
                traceparent: incoming.as_ref().map(format),
            };
        };
        let parent = incoming
            .clone()
            .map(|remote| Context::new().with_remote_span_context(remote))
            .unwrap_or_default();
        let span = inner
            .tracer
            .span_builder("webhook.receive")
            .with_kind(SpanKind::Server)
            .start_with_context(&inner.tracer, &parent);
        if span.span_context().is_sampled() {
            Receive {
                traceparent: Some(format(span.span_context())),
                span: Some((Arc::clone(inner), Context::new().with_span(span))),
            }
        } else {
            // Not sampled: no span here, and the provider's context (if any) goes on as it came.
            Receive {
                span: None,
                traceparent: incoming.as_ref().map(format),
            }
        }
    }

    /// The span of one subscription's attempt at a claimed event, in the trace stored with it,
    /// with its claim (`claimed`: when the claim started and ended) as its first child. `None`
    /// when tracing is off or the stored trace is not sampled.
    pub fn deliver(
        &self,
        event: &Claimed,
        subscription: &str,
        claimed: (SystemTime, SystemTime),
    ) -> Option<Delivery> {
        let inner = self.inner.as_ref()?;
        let stored = event.traceparent.as_deref().and_then(parse)?;
        if !stored.is_sampled() {
            return None;
        }
        let parent = Context::new().with_remote_span_context(stored);
        let claim = &event.claim;
        let span = inner
            .tracer
            .span_builder("webhook.deliver")
            .with_kind(SpanKind::Consumer)
            .with_start_time(claimed.0)
            .with_attributes([
                KeyValue::new("webhook.source", claim.source.clone()),
                KeyValue::new("webhook.event_id", claim.event_id.clone()),
                KeyValue::new("webhook.event_type", event.event_type.clone()),
                KeyValue::new("webhook.subscription", subscription.to_string()),
                KeyValue::new("webhook.attempt", claim.attempt),
            ])
            .start_with_context(&inner.tracer, &parent);
        let delivery = Delivery {
            inner: Arc::clone(inner),
            cx: Context::new().with_span(span),
        };
        delivery.done("webhook.claim", SpanKind::Internal, claimed, None);
        Some(delivery)
    }

    /// The `traceparent` a pull claim's answer carries: its `webhook.deliver` span's (ended
    /// with the claim, outcome `claimed`), or the stored context itself when no span is made.
    pub fn pull_claim(
        &self,
        event: &Claimed,
        subscription: &str,
        claimed: (SystemTime, SystemTime),
    ) -> Option<String> {
        match self.deliver(event, subscription, claimed) {
            Some(delivery) => {
                let span = delivery.cx.span();
                span.set_attribute(KeyValue::new("webhook.outcome", "claimed"));
                let traceparent = format(span.span_context());
                span.end_with_timestamp(claimed.1);
                Some(traceparent)
            }
            None => event.traceparent.clone(),
        }
    }
}

/// The request span of one delivery (see [`Traces::receive`]).
pub struct Receive {
    span: Option<(Arc<Inner>, Context)>,
    traceparent: Option<String>,
}

impl Receive {
    /// What is stored with the event: this span's context, or the provider's.
    pub fn traceparent(&self) -> Option<String> {
        self.traceparent.clone()
    }

    /// A child span, running until [`Step::end`]; none when this request is not traced.
    pub fn step(&self, name: &'static str) -> Step {
        Step(self.span.as_ref().map(|(inner, cx)| {
            Box::new(
                inner
                    .tracer
                    .span_builder(name)
                    .start_with_context(&inner.tracer, cx),
            )
        }))
    }

    /// End the request's span with what became of the delivery.
    pub fn end(self, source: &str, event: Option<(&str, &str)>, outcome: &str, status: u16) {
        let Some((_, cx)) = self.span else {
            return;
        };
        let span = cx.span();
        span.set_attribute(KeyValue::new("webhook.source", source.to_string()));
        if let Some((event_id, event_type)) = event {
            span.set_attribute(KeyValue::new("webhook.event_id", event_id.to_string()));
            span.set_attribute(KeyValue::new("webhook.event_type", event_type.to_string()));
        }
        span.set_attribute(KeyValue::new("webhook.outcome", outcome.to_string()));
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            span.set_status(Status::error(outcome.to_string()));
        }
        span.end();
    }
}

/// A running child span (or nothing, untraced). Boxed: a span is about 400 bytes, which every
/// delivery's future would otherwise carry across its wait for the commit, traced or not.
pub struct Step(Option<Box<Span>>);

impl Step {
    pub fn end(self, outcome: &str) {
        if let Some(mut span) = self.0 {
            span.set_attribute(KeyValue::new("webhook.outcome", outcome.to_string()));
            span.end();
        }
    }

    /// This span's `traceparent`, for the request it stands for.
    pub fn traceparent(&self) -> Option<String> {
        self.0.as_ref().map(|s| format(s.span_context()))
    }
}

/// One subscription's attempt at an event (see [`Traces::deliver`]).
pub struct Delivery {
    inner: Arc<Inner>,
    cx: Context,
}

impl Delivery {
    /// A child span, running until [`Step::end`].
    pub fn step(&self, name: &'static str, kind: SpanKind) -> Step {
        Step(Some(Box::new(
            self.inner
                .tracer
                .span_builder(name)
                .with_kind(kind)
                .start_with_context(&self.inner.tracer, &self.cx),
        )))
    }

    /// A child span that already happened (`at`: its start and end).
    pub fn done(
        &self,
        name: &'static str,
        kind: SpanKind,
        at: (SystemTime, SystemTime),
        outcome: Option<&str>,
    ) {
        let mut span = self
            .inner
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_start_time(at.0)
            .start_with_context(&self.inner.tracer, &self.cx);
        if let Some(outcome) = outcome {
            span.set_attribute(KeyValue::new("webhook.outcome", outcome.to_string()));
        }
        span.end_with_timestamp(at.1);
    }

    /// End the attempt, its next state committed at `at` (the `webhook.ack` span).
    pub fn acked(self, at: (SystemTime, SystemTime), outcome: &str) {
        self.done("webhook.ack", SpanKind::Internal, at, Some(outcome));
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("webhook.outcome", outcome.to_string()));
        span.end_with_timestamp(at.1);
    }
}

/// What a handler's answer makes of its attempt, for `webhook.handle`.
pub fn planned(next: &Next) -> &'static str {
    match next {
        Next::Complete { outcome, .. } => outcome.as_str(),
        Next::Retry { .. } => "retry",
        Next::Fail { .. } => "failed",
    }
}

/// What became of an attempt once its next state was committed, for `webhook.ack`.
pub fn outcome(next: &Next, result: &Finished) -> &'static str {
    match (result, next) {
        (Finished::LeaseLost, _) => "lease_lost",
        (_, Next::Complete { outcome, .. }) => outcome.as_str(),
        (_, Next::Retry { .. }) => "retry",
        (_, Next::Fail { .. }) => "failed",
    }
}

/// A W3C `traceparent` (`00-<trace id>-<parent id>-<flags>`), as a remote context; `None` for
/// anything the recommendation says to ignore. A later version's longer value is read by its
/// first four fields, as the recommendation asks.
pub fn parse(value: &str) -> Option<SpanContext> {
    let value = value.trim();
    if !value.is_ascii() {
        return None;
    }
    let bytes = value.as_bytes();
    let lower_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if bytes.len() < 55 || (bytes.len() > 55 && (bytes[55] != b'-' || &value[..2] == "00")) {
        return None;
    }
    let (version, trace, parent, flags) =
        (&value[..2], &value[3..35], &value[36..52], &value[53..55]);
    if [2, 35, 52].iter().any(|&i| bytes[i] != b'-')
        || !lower_hex(version)
        || version == "ff"
        || !lower_hex(trace)
        || !lower_hex(parent)
        || !lower_hex(flags)
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(parent).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    ))
}

/// The `traceparent` of a context (version 00).
pub fn format(cx: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    use super::{format, parse};

    #[test]
    fn traceparents_are_read_as_the_recommendation_says() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = parse(good).expect("valid");
        assert!(cx.is_sampled() && cx.is_remote());
        assert_eq!(format(&cx), good);
        let unsampled = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.is_sampled());
        // A later version with more fields: its first four are read.
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more").is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u{e9}",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }
}
