#![allow(dead_code)] // each test module uses a different part
//! `spawn_app()`: the real server on port 0 over a fresh SQLite file in a temp dir, with the
//! consumer pool off so that tests drive processing with `drain()` instead of sleeping.

use std::sync::Arc;
use std::time::Duration;

pub use crate::harness::*;
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::oneshot;
use webhook_inbox::config::Settings;
use webhook_inbox::consumer::Consumer;
use webhook_inbox::domain::time::now_secs;
use webhook_inbox::signature::Scheme;
use webhook_inbox::signature::Secret;
use webhook_inbox::startup::{Application, BuildOptions};
use webhook_inbox::store::Store;

pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const PLAIN_SECRET: &str = "It's a Secret to Everybody";
pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const SUBMIT_TOKEN: &str = "test-submit-token";

/// The test config: one source per scheme, plus a strict one. Tests adjust it with `tweak`.
pub fn test_config(dir: &TempDir) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
database_url = "sqlite://{db}"
admin_token = "{ADMIN_TOKEN}"
submission_tokens = ["{SUBMIT_TOKEN}"]
body_limit_bytes = 4096

[consumers]
workers = 0
lease_seconds = 30
max_attempts = 3
backoff_base_ms = 1
backoff_max_ms = 5

[[sources]]
name = "shop"
scheme = "standard-webhooks"
secrets = ["whsec_b2xkIHNlY3JldCBiZWZvcmUgcm90YXRpb24=", "{SW_SECRET}"]

[[sources]]
name = "strict"
scheme = "standard-webhooks"
secrets = ["{SW_SECRET}"]
on_payload_mismatch = "reject"

[[sources]]
name = "stripe"
scheme = "stripe"
secrets = ["whsec_stripe_test_secret"]

[[sources]]
name = "github"
scheme = "github"
secrets = ["{PLAIN_SECRET}"]

[[sources]]
name = "shopify"
scheme = "shopify"
secrets = ["{PLAIN_SECRET}"]

[[sources]]
name = "hmac"
scheme = "hmac-sha256"
secrets = ["{PLAIN_SECRET}"]
"#,
        db = dir.path().join("inbox.db").display()
    )
}

pub struct TestApp {
    pub address: String,
    pub dir: TempDir,
    pub settings: Settings,
    pub store: Arc<dyn Store>,
    pub consumer: Arc<Consumer>,
    pub client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The database of [`spawn_app_on`], kept (a PostgreSQL one is dropped with the app).
    db: Option<crate::stores::TestDb>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}, BuildOptions::default()).await
}

pub fn init_logs() {
    if std::env::var_os("TEST_LOG").is_some() {
        webhook_inbox::telemetry::init(webhook_inbox::config::LogFormat::Text);
    }
}

/// [`spawn_app`] on a fresh database of `kind`.
pub async fn spawn_app_on(kind: crate::stores::StoreKind) -> TestApp {
    spawn_app_with_on(kind, |_| {}, BuildOptions::default()).await
}

/// [`spawn_app_with`] on a fresh database of `kind`.
pub async fn spawn_app_with_on(
    kind: crate::stores::StoreKind,
    tweak: impl FnOnce(&mut String),
    options: BuildOptions,
) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::stores::TestDb::create(kind, dir.path());
    let mut config: String = test_config(&dir)
        .lines()
        .map(|line| match line.starts_with("database_url") {
            true => format!("database_url = \"{}\"\n", db.url()),
            false => format!("{line}\n"),
        })
        .collect();
    tweak(&mut config);
    let mut app = spawn_in(dir, &config, options).await;
    app.db = Some(db);
    app
}

pub async fn spawn_app_with(tweak: impl FnOnce(&mut String), options: BuildOptions) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(&dir);
    tweak(&mut config);
    spawn_in(dir, &config, options).await
}

/// Start on an existing directory (a restart on the same database file).
pub async fn spawn_in(dir: TempDir, config: &str, mut options: BuildOptions) -> TestApp {
    init_logs();
    let settings = Settings::from_toml(config, "test", Vec::new()).expect("test config is valid");
    options.http_workers = options.http_workers.or(Some(2));
    // This process is the test harness: transforms run in the built binary's workers.
    options.transform_worker = options
        .transform_worker
        .or_else(|| Some(env!("CARGO_BIN_EXE_webhook-inbox").into()));
    let app = Application::build(settings.clone(), options).expect("app builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let store = app.store();
    let consumer = app.consumer();
    let (tx, rx) = oneshot::channel::<()>();
    let server = tokio::spawn(app.run(async {
        let _ = rx.await;
    }));
    TestApp {
        address,
        dir,
        settings,
        store,
        consumer,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap(),
        shutdown: Some(tx),
        server: Some(server),
        db: None,
    }
}

pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl Reply {
    pub fn error_code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("<no error field>")
    }

    /// Asserts the SPEC error shape and returns the code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "body: {}", self.body);
        assert_eq!(self.error_code(), code, "body: {}", self.body);
        assert!(
            self.body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "error without message: {}",
            self.body
        );
    }
}

async fn reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply {
        status,
        body,
        headers,
    }
}

impl TestApp {
    /// Stop the server gracefully and hand back its directory (for a restart).
    pub async fn stop(mut self) -> TempDir {
        self.shutdown.take().unwrap().send(()).unwrap();
        self.server.take().unwrap().await.unwrap().unwrap();
        self.dir
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// POST a body with the given headers to `/webhooks/{source}`.
    pub async fn post_webhook(
        &self,
        source: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Reply {
        let mut req = self
            .client
            .post(self.url(&format!("/webhooks/{source}")))
            .header("Content-Type", "application/json")
            .body(body.to_vec());
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        reply(req.send().await.unwrap()).await
    }

    /// Sign with the source's scheme and first matching secret, and post.
    pub async fn deliver(&self, source: &str, event_id: &str, body: &str) -> Reply {
        let headers = sign_for(&self.settings, source, event_id, body.as_bytes());
        self.post_webhook(source, &headers, body.as_bytes()).await
    }

    /// The `/metrics` text (an open route).
    pub async fn metrics_text(&self) -> String {
        let r = self.client.get(self.url("/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    }

    pub async fn get(&self, path: &str) -> Reply {
        let r = self
            .client
            .get(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        reply(r).await
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: Option<Value>) -> Reply {
        let mut req = self.client.post(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        reply(req.send().await.unwrap()).await
    }

    pub async fn admin_post(&self, path: &str, body: Option<Value>) -> Reply {
        self.post(path, Some(ADMIN_TOKEN), body).await
    }

    /// Run claim passes until nothing is due (bounded).
    pub async fn drain(&self) -> usize {
        let consumer = Arc::clone(&self.consumer);
        tokio::task::spawn_blocking(move || drain_blocking(&consumer, "test-worker"))
            .await
            .unwrap()
    }

    pub async fn event(&self, source: &str, event_id: &str) -> Value {
        let r = self.get(&format!("/events/{source}/{event_id}")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }

    pub async fn balance(&self, customer: &str) -> i64 {
        self.get(&format!("/loyalty/{customer}")).await.body["balance"]
            .as_i64()
            .unwrap()
    }

    /// Count rows of a table directly in the database file.
    pub fn count(&self, sql: &str) -> i64 {
        let conn = rusqlite::Connection::open(self.dir.path().join("inbox.db")).unwrap();
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }
}

/// Claim passes until one claims nothing and no stored event waits for its fan-out; at most
/// 1000 passes. (On PostgreSQL an event is fanned out once every write transaction older than
/// it has ended, in any database of the cluster: other tests' too.)
pub fn drain_blocking(consumer: &Consumer, worker: &str) -> usize {
    let mut total = 0;
    for _ in 0..1000 {
        let n = consumer
            .run_once(worker, 100, &|| false)
            .expect("claim pass");
        let waiting = || {
            consumer
                .store()
                .status_counts()
                .expect("status counts")
                .fan_out_waiting
                > 0
        };
        if n == 0 && waiting() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if n == 0 {
            // Retries with millisecond backoff may be due a moment later.
            std::thread::sleep(Duration::from_millis(20));
            if consumer
                .run_once(worker, 100, &|| false)
                .expect("claim pass")
                == 0
            {
                return total;
            }
        }
        total += n;
    }
    panic!("drain did not finish in 1000 passes");
}

pub fn sign_for(
    settings: &Settings,
    source: &str,
    event_id: &str,
    body: &[u8],
) -> Vec<(String, String)> {
    let s = settings.source(source).expect("source exists");
    let secret: &Secret = s.secrets.last().unwrap();
    s.scheme
        .sign(secret, event_id, "order.completed", body, now_secs())
        .unwrap()
}

pub fn sign_with(
    scheme: Scheme,
    secret: &str,
    event_id: &str,
    body: &[u8],
    ts: i64,
) -> Vec<(String, String)> {
    scheme
        .sign(&Secret::new(secret), event_id, "order.completed", body, ts)
        .unwrap()
}

pub fn order_body(order_id: &str, customer: &str, points: i64) -> String {
    serde_json::json!({
        "type": "order.completed",
        "data": {"order_id": order_id, "customer_id": customer, "points": points}
    })
    .to_string()
}

/// A subscription with the tests' defaults: every event, at least once, 5 attempts, backoff
/// from 1 to 4 ms, no HTTP target, unordered.
pub fn test_subscription(
    name: &str,
    kind: webhook_inbox::subscriptions::Kind,
) -> webhook_inbox::subscriptions::Subscription {
    webhook_inbox::subscriptions::Subscription {
        name: name.into(),
        kind,
        route: webhook_inbox::subscriptions::Route::default(),
        mode: webhook_inbox::domain::DeliveryMode::AtLeastOnce,
        max_attempts: 5,
        backoff_base_ms: 1,
        backoff_max_ms: 4,
        http: None,
        token: None,
        ordering: None,
        filter: None,
        transform: None,
    }
}
