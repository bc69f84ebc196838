//! A real browser for the dashboard tests: Debian's chromium driven through chromedriver
//! (WebDriver) with fantoccini. Chromedriver listens on a free 127.0.0.1 port and is killed on
//! drop; chromium gets a fresh profile and the flags that keep it off the network.
//! [`Driver::run`] runs a test in a session and, when anything in it fails, saves a screenshot
//! of the view as it was and names the file in the panic message.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use serde_json::{Value, json};

use crate::process::free_port;
use crate::requires;

/// Chromium and chromedriver on `PATH`, or why not (for `requires::available`).
pub fn found() -> Result<(), String> {
    requires::command("chromium")?;
    requires::command("chromedriver")
}

/// A running chromedriver; killed on drop, whatever the test's outcome.
pub struct Driver {
    child: Child,
    pub url: String,
    profile: tempfile::TempDir,
    log: PathBuf,
}

impl Driver {
    /// Start chromedriver and wait (bounded) until it answers `/status`.
    pub async fn start() -> Driver {
        let port = free_port();
        let profile = tempfile::tempdir().unwrap();
        let log = profile.path().join("chromedriver.log");
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            profile,
            log,
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = client
                .get(format!("{}/status", driver.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if let Ok(r) = ready {
                let body: Value = r.json().await.unwrap_or_default();
                if body["value"]["ready"] == true {
                    return driver;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start: {}",
                driver.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A headless chromium session whose viewport is `width` CSS pixels wide.
    pub async fn session(&self, width: u32) -> Client {
        let user_data = self.profile.path().join("profile");
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--hide-scrollbars",
            &format!("--window-size={width},900"),
            &format!("--user-data-dir={}", user_data.display()),
        ];
        let mut options = json!({"args": args, "binary": chromium_binary()});
        // Headless windows are at least 500 px wide; a phone's viewport is emulated instead.
        if width < 500 {
            options["mobileEmulation"] =
                json!({"deviceMetrics": {"width": width, "height": 844, "pixelRatio": 1.0}});
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("no chromium session: {e}\n{}", self.logs()))
    }

    /// Run `test` in a session `width` CSS pixels wide, closed afterwards. When the test
    /// panics (an assertion, a timeout, a missing element), the page as it was is saved as
    /// `target/ui-screenshots/FAILED-<name>-<width>.png` and the panic message names that file
    /// and the page's URL.
    pub async fn run<F, Fut>(&self, name: &str, width: u32, test: F)
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = ()>,
    {
        let c = self.session(width).await;
        let outcome = AssertUnwindSafe(test(c.clone())).catch_unwind().await;
        let Err(panic) = outcome else {
            let _ = c.close().await;
            return;
        };
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(a panic without a message)".into());
        let url = c
            .current_url()
            .await
            .map_or_else(|e| format!("unknown ({e})"), |u| u.to_string());
        let shot = match c.screenshot().await {
            Ok(png) => {
                let path = screenshot_dir().join(format!("FAILED-{name}-{width}.png"));
                match std::fs::write(&path, png) {
                    Ok(()) => format!("screenshot of the failing view: {}", path.display()),
                    Err(e) => format!("no screenshot: cannot write {}: {e}", path.display()),
                }
            }
            Err(e) => format!("no screenshot of the failing view: {e}"),
        };
        let _ = c.close().await;
        panic!("{message}\n{shot}\npage: {url}");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromium_binary() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "chromium".into())
}

/// Poll a JavaScript expression (run as a function body) until it returns `true`, at most
/// 10 s; panics with `what` and the last value otherwise ([`Driver::run`] adds a screenshot).
pub async fn wait_until(c: &Client, script: &str, what: &str) {
    wait_at_most(c, Duration::from_secs(10), script, what).await;
}

/// [`wait_until`] with another bound.
pub async fn wait_at_most(c: &Client, within: Duration, script: &str, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let value = c.execute(script, vec![]).await.unwrap_or(Value::Null);
        if value == Value::Bool(true) {
            return;
        }
        if Instant::now() > deadline {
            panic!("timed out after {within:?} waiting for {what}; last value {value}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Run a script and answer its value.
pub async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.expect("script runs")
}

/// Click the element `css` finds, as a user would once it shows: within 10 s it must exist,
/// be displayed and take the click. A page still settling (the nav before sign-in finishes, a
/// view being drawn) answers "element not interactable" for a moment; that is retried, any
/// other error is not.
pub async fn click(c: &Client, css: &str) {
    click_located(c, Locator::Css(css), css).await;
}

/// [`click`] with any locator; `what` names the element in the panic message.
pub async fn click_located(c: &Client, locator: Locator<'_>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let outcome = match c.find(locator).await {
            Ok(element) => match element.is_displayed().await {
                Ok(true) => element.click().await.map_err(|e| e.to_string()),
                Ok(false) => Err("it is not displayed".into()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) if e.is_no_such_element() => Err("no such element".into()),
            Err(e) => panic!("cannot look for {what}: {e}"),
        };
        let why = match outcome {
            Ok(()) => return,
            Err(why) => why,
        };
        let settling = why.contains("not displayed")
            || why.contains("no such element")
            || why.contains("not interactable")
            || why.contains("click intercepted")
            || why.contains("stale element");
        if !settling || Instant::now() > deadline {
            panic!("cannot click {what}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn type_into(c: &Client, css: &str, text: &str) {
    let el = c.find(Locator::Css(css)).await.unwrap();
    el.clear().await.unwrap();
    el.send_keys(text).await.unwrap();
}

/// Where the screenshots of a test run go: `target/ui-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub async fn screenshot(c: &Client, name: &str) -> PathBuf {
    let png = c.screenshot().await.expect("screenshot");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    path
}
