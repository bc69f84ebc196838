//! Fakes and a store-level harness: a recording `DownstreamSystem` (the one seam to the
//! outside), a wrapper that counts a real handler's calls, and a store plus consumer over a
//! fresh database of either store (`stores::StoreKind`) for tests of the consumer side without
//! HTTP.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tempfile::TempDir;
use webhook_inbox::config::ConsumerSettings;
use webhook_inbox::consumer::Consumer;
use webhook_inbox::handlers::{DownstreamError, DownstreamSystem, Handled, Handler, Registry};
use webhook_inbox::store::{Claimed, EventDetail, EventOrigin, InsertOutcome, NewDelivery, Store};

use crate::helpers::{drain_blocking, init_logs};
use crate::stores::{StoreKind, TestDb};

/// A downstream that records every call and answers as told.
#[derive(Default)]
pub struct RecordingDownstream {
    pub calls: Mutex<Vec<String>>,
    pub fail_with: Mutex<Option<DownstreamError>>,
    /// Held for this long inside each call (to let a lease run out).
    pub delay: Mutex<Duration>,
}

impl RecordingDownstream {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl DownstreamSystem for RecordingDownstream {
    fn submit(&self, key: &str, _body: &[u8]) -> Result<String, DownstreamError> {
        self.calls.lock().unwrap().push(key.to_string());
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        match self.fail_with.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok("recorded".into()),
        }
    }
}

/// Wraps a real handler: counts calls per event, can fail the first `fail_first` calls with a
/// retryable error (`usize::MAX`: always), and can hold each call for `delay`.
pub struct Recording {
    inner: Arc<dyn Handler>,
    pub calls: Mutex<std::collections::HashMap<String, usize>>,
    pub fail_first: std::sync::atomic::AtomicUsize,
    pub delay: Mutex<Duration>,
    /// The next call waits here until the test sends (or drops the sender); later calls run.
    pub hold_next: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Recording {
    pub fn wrap(inner: &Arc<dyn Handler>) -> Arc<Recording> {
        Arc::new(Recording {
            inner: Arc::clone(inner),
            calls: Mutex::default(),
            fail_first: Default::default(),
            delay: Mutex::new(Duration::ZERO),
            hold_next: Mutex::new(None),
        })
    }

    pub fn total_calls(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }

    pub fn calls_for(&self, event_id: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .get(event_id)
            .copied()
            .unwrap_or(0)
    }
}

impl Handler for Recording {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn mode(&self) -> webhook_inbox::domain::DeliveryMode {
        self.inner.mode()
    }

    fn call_timeout(&self) -> Option<Duration> {
        self.inner.call_timeout()
    }

    fn handle(&self, event: &Claimed) -> Handled {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(event.claim.event_id.clone())
            .or_default() += 1;
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let held = self.hold_next.lock().unwrap().take();
        if let Some(gate) = held {
            let _ = gate.recv_timeout(Duration::from_secs(30));
        }
        use std::sync::atomic::Ordering;
        let failing = self
            .fail_first
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                0 => None,
                usize::MAX => Some(usize::MAX),
                n => Some(n - 1),
            })
            .is_ok();
        if failing {
            return Handled::Retryable("transient failure (injected)".into());
        }
        self.inner.handle(event)
    }
}

/// A store and a consumer over a fresh database, without HTTP: for tests of the consumer side
/// itself. The loyalty and audit handlers are wrapped in `Recording`.
pub struct Harness {
    pub dir: TempDir,
    pub store: Arc<dyn Store>,
    pub consumer: Arc<Consumer>,
    pub loyalty: Arc<Recording>,
    pub audit: Arc<Recording>,
    pub downstream: Arc<RecordingDownstream>,
    /// Off only for a test that damages the file on purpose.
    pub check_integrity: bool,
    /// Last, so that it goes after the store that holds connections to it.
    pub db: TestDb,
}

/// Every test over a SQLite harness ends with the file checked: no store operation may leave a
/// malformed database behind.
impl Drop for Harness {
    fn drop(&mut self) {
        if let TestDb::Sqlite(path) = &self.db
            && self.check_integrity
            && !std::thread::panicking()
        {
            assert_integrity(path);
        }
    }
}

pub fn assert_integrity(path: &std::path::Path) {
    if !path.exists() {
        return;
    }
    let conn = rusqlite::Connection::open(path).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok", "{}", path.display());
}

impl Harness {
    /// Over SQLite (for SQLite-only tests).
    pub fn new(max_attempts: u32, lease_seconds: u64) -> Harness {
        Harness::on(StoreKind::Sqlite, max_attempts, lease_seconds)
    }

    pub fn on(kind: StoreKind, max_attempts: u32, lease_seconds: u64) -> Harness {
        Harness::with_mode_on(
            kind,
            max_attempts,
            lease_seconds,
            webhook_inbox::domain::DeliveryMode::AtMostOnce,
        )
    }

    pub fn with_mode_on(
        kind: StoreKind,
        max_attempts: u32,
        lease_seconds: u64,
        mode: webhook_inbox::domain::DeliveryMode,
    ) -> Harness {
        init_logs();
        let dir = tempfile::tempdir().unwrap();
        let db = TestDb::create(kind, dir.path());
        let store = db.open_store();
        let downstream = Arc::new(RecordingDownstream::default());
        // Under half the lease, as configuration validation demands.
        let timeout = Duration::from_millis(lease_seconds * 1000 / 4);
        let real = Registry::new(store.clone(), downstream.clone(), mode, timeout);
        let loyalty = Recording::wrap(real.loyalty());
        let audit = Recording::wrap(real.audit());
        let registry =
            Registry::from_parts(loyalty.clone(), audit.clone(), real.downstream().clone());
        let settings = ConsumerSettings {
            workers: 0,
            batch_size: 16,
            lease_seconds,
            max_attempts,
            backoff_base_ms: 1,
            backoff_max_ms: 4,
        };
        // The implicit subscriptions with these rules in the registry, as `serve` applies
        // its config before its consumer reads them.
        store
            .sync_subscriptions(
                &webhook_inbox::subscriptions::implicit_with(&settings, mode),
                webhook_inbox::domain::time::now_ms(),
            )
            .unwrap();
        let consumer = Arc::new(Consumer::new(
            store.clone(),
            Arc::new(registry),
            Arc::new(webhook_inbox::metrics::Metrics::new()),
            &settings,
        ));
        Harness {
            dir,
            store,
            consumer,
            loyalty,
            audit,
            downstream,
            check_integrity: true,
            db,
        }
    }

    /// A consumer of these subscriptions over the harness's recording handlers, claiming
    /// `batch_size` at a time (the harness's own consumer serves the implicit three).
    pub fn consumer_of(
        &self,
        subs: &[webhook_inbox::subscriptions::Subscription],
        batch_size: usize,
    ) -> Arc<Consumer> {
        let registry = Registry::from_parts(
            self.loyalty.clone(),
            self.audit.clone(),
            Registry::new(
                self.store.clone(),
                self.downstream.clone(),
                webhook_inbox::domain::DeliveryMode::AtMostOnce,
                Duration::from_secs(1),
            )
            .downstream()
            .clone(),
        );
        let settings = ConsumerSettings {
            workers: 0,
            batch_size,
            lease_seconds: 30,
            max_attempts: 5,
            backoff_base_ms: 1,
            backoff_max_ms: 4,
        };
        Arc::new(
            Consumer::new(
                self.store.clone(),
                Arc::new(registry),
                Arc::new(webhook_inbox::metrics::Metrics::new()),
                &settings,
            )
            .with_subscriptions(subs),
        )
    }

    /// Store deliveries as the ingest path would.
    pub fn insert(&self, deliveries: &[(&str, &str, &str, String)]) -> Vec<InsertOutcome> {
        let batch: Vec<NewDelivery> = deliveries
            .iter()
            .map(|(source, id, ty, body)| new_delivery(source, id, ty, body))
            .collect();
        self.store.insert_deliveries(&batch).unwrap()
    }

    pub fn drain(&self) -> usize {
        drain_blocking(&self.consumer, "harness")
    }

    pub fn detail(&self, source: &str, id: &str) -> EventDetail {
        self.store.event(source, id).unwrap().expect("event exists")
    }

    pub fn balance(&self, customer: &str) -> i64 {
        self.store
            .loyalty(
                customer,
                webhook_inbox::store::Page {
                    limit: 1,
                    before_seq: None,
                },
            )
            .unwrap()
            .balance
    }

    /// One number from SQL that both stores' schemas answer alike (see `TestDb::count`).
    pub fn count(&self, sql: &str) -> i64 {
        self.db.count(sql)
    }
}

/// A delivery as ingest (or, for `requests`/`request.submitted`, a submit) stores it.
pub fn new_delivery(source: &str, id: &str, ty: &str, body: &str) -> NewDelivery {
    use sha2::Digest;
    let origin = if (source, ty) == ("requests", "request.submitted") {
        EventOrigin::Submission
    } else {
        EventOrigin::Webhook
    };
    NewDelivery {
        source: source.into(),
        event_id: id.into(),
        event_type: ty.into(),
        payload: body.as_bytes().to_vec(),
        content_type: Some("application/json".into()),
        sha256: sha2::Sha256::digest(body.as_bytes()).into(),
        received_at: webhook_inbox::domain::time::now_ms(),
        reject_mismatch: false,
        origin,
        traceparent: None,
    }
}

pub fn results(detail: &EventDetail) -> Vec<String> {
    detail
        .history
        .iter()
        .map(|a| a.result.clone().unwrap_or_else(|| "open".into()))
        .collect()
}
