//! Where finished spans go: a bounded queue in memory, and one thread that sends them to the
//! collector in batches over OTLP/HTTP. Nothing that makes a span ever waits for the
//! collector: a span that finds the queue full is dropped and counted
//! (`webhook_inbox_trace_spans_total{result="dropped"}`), and a collector that does not answer
//! costs the export thread its timeout and the log a line a minute.
//!
//! The SDK's own batch processor does the same but keeps its count of dropped spans to itself,
//! and its HTTP client would be a second `reqwest`: this one sends with the `reqwest` the
//! forwarders use, on a runtime of its own thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _, SpanProcessor};
use parking_lot::{Condvar, Mutex};
use prometheus_client::metrics::counter::Counter;

/// Spans held for the exporter; more are dropped.
pub const QUEUE: usize = 8192;
/// Spans per export request.
const BATCH: usize = 512;
/// How long a span may wait for a batch to fill.
const DELAY: Duration = Duration::from_secs(1);
/// One export's bound (connect and answer).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Export failures are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The counters of `webhook_inbox_trace_spans_total`.
#[derive(Clone, Debug, Default)]
pub struct SpanCounters {
    pub exported: Counter,
    pub dropped: Counter,
    pub failed: Counter,
}

/// The [`SpanProcessor`] of the tracer provider.
#[derive(Debug)]
pub struct Queue {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The thread waits on it for spans, a flush or the stop.
    wake: Condvar,
    /// Flushes wait on it for the thread.
    flushed: Condvar,
    counters: SpanCounters,
}

#[derive(Debug, Default)]
struct State {
    spans: VecDeque<SpanData>,
    /// Flushes asked for and done: a flush is done once the queue it saw has been sent.
    asked: u64,
    done: u64,
    stop: bool,
}

impl Queue {
    /// Start the export thread for `exporter`.
    pub fn start(exporter: SpanExporter, counters: SpanCounters) -> anyhow::Result<Queue> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            flushed: Condvar::new(),
            counters,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("trace-export".into())
            .spawn(move || send_all(&theirs, &exporter, &runtime))?;
        Ok(Queue {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Ask the thread to send what is queued and wait for it, at most `timeout`.
    fn flush_within(&self, timeout: Duration, stop: bool) -> OTelSdkResult {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state.lock();
        state.asked += 1;
        state.stop |= stop;
        let asked = state.asked;
        self.shared.wake.notify_one();
        while state.done < asked {
            if self
                .shared
                .flushed
                .wait_until(&mut state, deadline)
                .timed_out()
            {
                return Err(OTelSdkError::Timeout(timeout));
            }
        }
        Ok(())
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        let mut state = self.shared.state.lock();
        if state.stop || state.spans.len() >= QUEUE {
            drop(state);
            self.shared.counters.dropped.inc();
            return;
        }
        state.spans.push_back(span);
        if state.spans.len() == BATCH {
            self.shared.wake.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush_within(EXPORT_TIMEOUT * 2, false)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let flushed = self.flush_within(timeout, true);
        if flushed.is_ok()
            && let Some(thread) = self.thread.lock().take()
        {
            // It has nothing left to send: it ends at once.
            let _ = thread.join();
        }
        flushed
    }
}

/// The export thread: a batch when one is full, when a span waited `DELAY`, or when a flush
/// asks; until the stop, after which it sends what is left and ends.
fn send_all(shared: &Shared, exporter: &SpanExporter, runtime: &tokio::runtime::Runtime) {
    let mut failing_since_log: Option<(Instant, u64)> = None;
    loop {
        let (batch, asked, stop) = {
            let mut state = shared.state.lock();
            if state.spans.len() < BATCH && state.asked == state.done && !state.stop {
                shared.wake.wait_for(&mut state, DELAY);
            }
            let n = state.spans.len().min(BATCH);
            (
                state.spans.drain(..n).collect::<Vec<_>>(),
                state.asked,
                state.stop,
            )
        };
        if !batch.is_empty() {
            let n = batch.len() as u64;
            match runtime.block_on(exporter.export(batch)) {
                Ok(()) => {
                    shared.counters.exported.inc_by(n);
                }
                Err(e) => {
                    shared.counters.failed.inc_by(n);
                    let (since, count) = failing_since_log.get_or_insert((Instant::now(), 0));
                    *count += n;
                    if *count == n || since.elapsed() >= LOG_EVERY {
                        tracing::warn!(error = %e, spans = *count, "cannot export spans to the OTLP endpoint (dropped; logged once a minute)");
                        failing_since_log = Some((Instant::now(), 0));
                    }
                }
            }
        }
        let mut state = shared.state.lock();
        if state.spans.is_empty() {
            state.done = asked;
            shared.flushed.notify_all();
            if stop {
                return;
            }
        }
    }
}

/// The exporter's HTTP client: the crate's `reqwest`, asynchronous, on the export thread's
/// runtime.
#[derive(Debug)]
pub struct Client(pub reqwest::Client);

impl Client {
    pub fn new() -> anyhow::Result<Client> {
        Ok(Client(
            reqwest::Client::builder()
                .timeout(EXPORT_TIMEOUT)
                .connect_timeout(EXPORT_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .tls_built_in_webpki_certs(false)
                .tls_built_in_native_certs(true)
                .build()?,
        ))
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let response = self.0.execute(request).await?;
        let status = response.status();
        // The collector's answer is small (a partial-success message at most).
        let body = response.bytes().await?;
        Ok(Response::builder().status(status).body(body)?)
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::{Duration, Instant, SystemTime};

    use opentelemetry::InstrumentationScope;
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks, SpanProcessor as _};

    use super::{BATCH, Client, QUEUE, Queue, SpanCounters};

    fn span(i: u64) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(u128::from(i) + 1),
                SpanId::from(i + 1),
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("test"),
            start_time: SystemTime::now(),
            end_time: SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("test").build(),
        }
    }

    /// A collector that takes the connection and never answers: spans past the queue are
    /// dropped and counted at once, never waited for, and a shutdown gives up at its bound.
    #[test]
    fn a_stuck_collector_costs_dropped_spans_not_waiting() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}/v1/traces", silent.local_addr().unwrap());
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .with_http_client(Client::new().unwrap())
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .build()
            .unwrap();
        let counters = SpanCounters::default();
        let queue = Queue::start(exporter, counters.clone()).unwrap();
        let extra = 100;
        let started = Instant::now();
        for i in 0..(QUEUE + BATCH + extra) as u64 {
            queue.on_end(span(i));
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        // The thread holds at most one batch in its stuck export; the queue the rest.
        assert!(
            counters.dropped.get() >= extra as u64,
            "{}",
            counters.dropped.get()
        );
        let asked = Instant::now();
        assert!(
            queue
                .shutdown_with_timeout(Duration::from_millis(200))
                .is_err()
        );
        assert!(asked.elapsed() < Duration::from_secs(1));
        // Spans ended after the shutdown are dropped too.
        let before = counters.dropped.get();
        queue.on_end(span(0));
        assert_eq!(counters.dropped.get(), before + 1);
    }
}
