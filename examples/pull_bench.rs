//! The pull client of `scripts/bench-pull`: how fast clients drain a `pull` subscription
//! (claim a batch, ack it `done`), and how soon a long poll answers after a delivery commits.
//!
//! ```text
//! cargo run --release --example pull_bench -- drain --url http://127.0.0.1:18182 \
//!     --subscription orders --token TOKEN --clients 8 --batch 100 --events 200000
//! cargo run --release --example pull_bench -- wake --url http://127.0.0.1:18182 \
//!     --subscription orders --token TOKEN --secret whsec_... --samples 200
//! ```
//! Each prints one JSON line. Talks to 127.0.0.1 only; every loop is bounded in count and time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use webhook_inbox::signature::{Scheme, Secret};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn need(args: &[String], name: &str) -> String {
    arg(args, name).unwrap_or_else(|| panic!("{name} is required"))
}

struct Pull {
    http: reqwest::blocking::Client,
    base: String,
    token: String,
}

impl Pull {
    fn call(&self, route: &str, body: &Value) -> Value {
        let r = self
            .http
            .post(format!("{}/{route}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .unwrap_or_else(|e| panic!("{route}: {e}"));
        assert!(r.status().is_success(), "{route}: {}", r.status());
        r.json().unwrap()
    }

    /// Claim (with a short wait) and ack everything done; the number acked.
    fn round(&self, batch: usize) -> usize {
        let claims = self.call("claim", &json!({"max": batch, "wait_ms": 200}));
        let claims = claims["claims"].as_array().unwrap();
        if claims.is_empty() {
            return 0;
        }
        let results: Vec<Value> = claims
            .iter()
            .map(|c| json!({"token": c["token"], "outcome": "done"}))
            .collect();
        let acked = self.call("ack", &json!({ "results": results }));
        let applied = acked["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["applied"] == true)
            .count();
        assert_eq!(applied, claims.len(), "an ack was not applied");
        applied
    }
}

fn client(args: &[String]) -> Pull {
    Pull {
        http: reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        base: format!(
            "{}/subscriptions/{}",
            need(args, "--url"),
            need(args, "--subscription")
        ),
        token: need(args, "--token"),
    }
}

/// Clients drain `--events` events; events per second from the first claim to the last ack.
fn drain(args: &[String]) {
    let clients: usize = need(args, "--clients").parse().unwrap();
    let batch: usize = need(args, "--batch").parse().unwrap();
    let events: usize = need(args, "--events").parse().unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (pull, done) = (client(args), Arc::clone(&done));
            std::thread::spawn(move || {
                while done.load(Ordering::SeqCst) < events && Instant::now() < deadline {
                    done.fetch_add(pull.round(batch), Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::SeqCst);
    assert_eq!(n, events, "not every event was acked within the deadline");
    println!(
        "{}",
        json!({"clients": clients, "batch": batch, "events": n, "seconds": elapsed,
               "events_per_second": n as f64 / elapsed})
    );
}

/// A long poll waits; a delivery is sent; the time from its 2xx (committed) to the poll's
/// answer, over `--samples` deliveries one at a time.
fn wake(args: &[String]) {
    let samples: usize = need(args, "--samples").parse().unwrap();
    let url = need(args, "--url");
    let secret = Secret::new(need(args, "--secret"));
    let http = reqwest::blocking::Client::new();
    let mut from_ack = Vec::with_capacity(samples);
    let mut from_send = Vec::with_capacity(samples);
    for i in 0..samples {
        let poll = {
            let pull = client(args);
            std::thread::spawn(move || {
                let c = pull.call("claim", &json!({"max": 1, "wait_ms": 10000}));
                let answered = Instant::now();
                let claims = c["claims"].as_array().unwrap().clone();
                assert_eq!(claims.len(), 1, "the poll ended without the event");
                let results =
                    json!({"results": [{"token": claims[0]["token"], "outcome": "done"}]});
                pull.call("ack", &results);
                answered
            })
        };
        // Let the poll start waiting (its first look finds nothing), at varying phases.
        std::thread::sleep(Duration::from_millis(50 + (i as u64 * 37) % 200));
        let id = format!("wake-{}-{i}", std::process::id());
        let body = format!(
            r#"{{"type":"order.completed","data":{{"order_id":"{id}","customer_id":"w","points":1}}}}"#
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let headers = Scheme::StandardWebhooks
            .sign(&secret, &id, "order.completed", body.as_bytes(), now)
            .unwrap();
        let mut req = http
            .post(format!("{url}/webhooks/shop"))
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let sent = Instant::now();
        let status = req.body(body).send().unwrap().status();
        let acked = Instant::now();
        assert!(status.is_success(), "delivery: {status}");
        let answered = poll.join().unwrap();
        from_ack.push(answered.saturating_duration_since(acked).as_secs_f64() * 1000.0);
        from_send.push(answered.saturating_duration_since(sent).as_secs_f64() * 1000.0);
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    println!(
        "{}",
        json!({"samples": samples,
               "p50_ms": pct(&mut from_ack, 0.5), "p99_ms": pct(&mut from_ack, 0.99),
               "max_ms": pct(&mut from_ack, 1.0),
               "from_send_p50_ms": pct(&mut from_send, 0.5),
               "from_send_p99_ms": pct(&mut from_send, 0.99)})
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("drain") => drain(&args),
        Some("wake") => wake(&args),
        _ => panic!("usage: pull_bench drain|wake --url URL --subscription NAME --token TOKEN …"),
    }
}
