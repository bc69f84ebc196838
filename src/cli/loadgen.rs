//! `webhook-inbox loadgen`: unique, correctly signed deliveries at a fixed concurrency for a
//! given time or count, with throughput and latency percentiles.
//!
//! Every request is built and signed before the clock starts (timestamps stay well inside the
//! 300 s tolerance of a run), and it speaks HTTP/1.1 over keep-alive connections directly (one
//! request in flight per connection) rather than through a client library: during the run the
//! generator only writes bytes and reads answers, so it takes little of the CPU that the server
//! it measures shares on the same machine.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::sign::parse_scheme;
use crate::domain::time::now_secs;
use crate::signature::Scheme;
use crate::signature::Secret;

#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// Target, e.g. http://127.0.0.1:8080/webhooks/demo (plain HTTP on this machine).
    #[arg(long)]
    url: String,
    #[arg(long, value_parser = parse_scheme, default_value = "standard-webhooks")]
    scheme: Scheme,
    #[arg(long)]
    secret: String,
    /// Concurrent connections, one request in flight each.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds to run (ignored when --requests is given).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Stop after this many requests instead of after --duration.
    #[arg(long)]
    requests: Option<u64>,
    /// Requests signed in advance for a --duration run; the run stops early if they run out
    /// (the report says so).
    #[arg(long, default_value_t = 1_500_000)]
    prepared: u64,
    /// Approximate body size in bytes.
    #[arg(long, default_value_t = 300)]
    body_size: usize,
    /// Event ids are `<prefix>-<n>`; give each run its own prefix to keep deliveries unique.
    #[arg(long, default_value = "load")]
    id_prefix: String,
    /// Event ids are `<prefix>-<random hex>` instead, as providers that draw them at random
    /// send them (Stripe's `evt_…`): each lands anywhere in the id index, not at its end.
    #[arg(long)]
    random_ids: bool,
    /// Customers the generated orders spread over.
    #[arg(long, default_value_t = 1000)]
    customers: u64,
    /// Send at this many requests per second in all (0: as fast as the connections go). Each
    /// request has its time in the schedule, and its latency counts from that time, so a
    /// server that stalls is charged for the requests that waited behind the stall.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

struct Target {
    host: String,
    path: String,
}

fn parse_url(url: &str) -> anyhow::Result<Target> {
    let rest = url
        .strip_prefix("http://")
        .context("loadgen speaks plain http:// to a server on this machine")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    Ok(Target {
        host: host.to_string(),
        path: format!("/{path}"),
    })
}

/// One order body of about `size` bytes.
fn body(n: u64, customers: u64, size: usize) -> String {
    let base = json!({
        "type": "order.completed",
        "data": {"order_id": format!("ord-{n}"), "customer_id": format!("cust-{}", n % customers),
                 "points": n % 50 + 1},
    })
    .to_string();
    let pad = size.saturating_sub(base.len() + 10);
    // `pad` keeps the body near the requested size, like real provider payloads.
    format!(
        "{}, \"pad\": \"{}\"}}",
        &base[..base.len() - 1],
        "x".repeat(pad)
    )
}

fn request(target: &Target, headers: &[(String, String)], body: &str) -> Vec<u8> {
    let mut r = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        target.path,
        target.host,
        body.len()
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// Read one response; returns its status.
async fn read_response(conn: &mut BufReader<TcpStream>, line: &mut String) -> anyhow::Result<u16> {
    line.clear();
    if conn.read_line(line).await? == 0 {
        bail!("connection closed");
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("bad status line")?;
    let mut length = 0usize;
    loop {
        line.clear();
        conn.read_line(line).await?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().context("bad content-length")?;
        }
    }
    let mut sink = vec![0u8; length];
    conn.read_exact(&mut sink).await?;
    Ok(status)
}

struct Shared {
    next: AtomicU64,
    requests: Vec<Vec<u8>>,
    deadline: Instant,
    started: Instant,
    /// The schedule's step (`--rate`), if any.
    every: Option<Duration>,
}

struct ConnResult {
    latencies_us: Vec<u32>,
    statuses: std::collections::BTreeMap<u16, u64>,
    io_errors: u64,
}

async fn connection(target: Arc<Target>, shared: Arc<Shared>) -> ConnResult {
    let mut result = ConnResult {
        latencies_us: Vec::new(),
        statuses: Default::default(),
        io_errors: 0,
    };
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut line = String::new();
    loop {
        let n = shared.next.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(bytes) = shared.requests.get(n) else {
            break;
        };
        if Instant::now() >= shared.deadline {
            break;
        }
        if conn.is_none() {
            match TcpStream::connect(&target.host).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    conn = Some(BufReader::new(s));
                }
                Err(_) => {
                    result.io_errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        let started = match shared.every {
            Some(every) => {
                let due = shared.started + every.mul_f64(n as f64);
                if due >= shared.deadline {
                    break;
                }
                tokio::time::sleep_until(due.into()).await;
                due
            }
            None => Instant::now(),
        };
        let outcome = async {
            c.get_mut().write_all(bytes).await?;
            read_response(c, &mut line).await
        }
        .await;
        match outcome {
            Ok(status) => {
                let us = started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                result.latencies_us.push(us);
                *result.statuses.entry(status).or_default() += 1;
            }
            Err(_) => {
                result.io_errors += 1;
                conn = None;
            }
        }
    }
    result
}

/// Build and sign every request of the run.
fn prepare(args: &LoadgenArgs, target: &Target) -> anyhow::Result<Vec<Vec<u8>>> {
    let count = args.requests.unwrap_or(args.prepared);
    let secret = Secret::new(args.secret.clone());
    let now = now_secs();
    (0..count)
        .map(|n| {
            let id = if args.random_ids {
                format!("{}-{}", args.id_prefix, uuid::Uuid::new_v4().simple())
            } else {
                format!("{}-{n}", args.id_prefix)
            };
            let body = body(n, args.customers, args.body_size);
            let headers = args
                .scheme
                .sign(&secret, &id, "order.completed", body.as_bytes(), now)
                .map_err(anyhow::Error::msg)?;
            Ok(request(target, &headers, &body))
        })
        .collect()
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    f64::from(sorted[rank.min(sorted.len() - 1)]) / 1000.0
}

pub fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    if args.connections == 0 || args.connections > 4096 {
        bail!("--connections must be from 1 to 4096");
    }
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        bail!("--rate must be a number of requests per second, 0 for as fast as possible");
    }
    let target = Arc::new(parse_url(&args.url)?);
    let requests = prepare(&args, &target)?;
    let prepared = requests.len() as u64;
    // One thread: the generator should leave the other core to the server.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let shared = Arc::new(Shared {
        next: AtomicU64::new(0),
        requests,
        started,
        every: (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate)),
        deadline: started
            + if args.requests.is_some() {
                Duration::from_secs(3600)
            } else {
                Duration::from_secs_f64(args.duration)
            },
    });
    let results: Vec<ConnResult> = runtime.block_on(async {
        let tasks: Vec<_> = (0..args.connections)
            .map(|_| tokio::spawn(connection(target.clone(), shared.clone())))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("connection task"));
        }
        out
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies: Vec<u32> = results
        .iter()
        .flat_map(|r| r.latencies_us.iter().copied())
        .collect();
    latencies.sort_unstable();
    let mut statuses = std::collections::BTreeMap::new();
    for r in &results {
        for (s, n) in &r.statuses {
            *statuses.entry(s.to_string()).or_insert(0u64) += n;
        }
    }
    let io_errors: u64 = results.iter().map(|r| r.io_errors).sum();
    let answered = latencies.len() as u64;
    let ok = statuses.get("200").copied().unwrap_or(0);
    let report = json!({
        "requests": answered,
        "ok": ok,
        "statuses": statuses,
        "io_errors": io_errors,
        "seconds": elapsed,
        "rps": answered as f64 / elapsed,
        "latency_ms": {
            "p50": percentile(&latencies, 50.0),
            "p90": percentile(&latencies, 90.0),
            "p99": percentile(&latencies, 99.0),
            "p999": percentile(&latencies, 99.9),
            "max": latencies.last().map(|m| f64::from(*m) / 1000.0).unwrap_or(0.0),
        },
        "connections": args.connections,
        "exhausted": args.requests.is_none() && answered + io_errors >= prepared,
    });
    let text = if args.json {
        report.to_string()
    } else {
        format!(
            "{answered} requests in {elapsed:.1} s: {:.0} req/s; {ok} answered 200, statuses {}, \
             {io_errors} I/O errors{}\nlatency ms: p50 {} p90 {} p99 {} p99.9 {} max {}",
            answered as f64 / elapsed,
            report["statuses"],
            if report["exhausted"] == true {
                " (ran out of prepared requests: raise --prepared)"
            } else {
                ""
            },
            report["latency_ms"]["p50"],
            report["latency_ms"]["p90"],
            report["latency_ms"]["p99"],
            report["latency_ms"]["p999"],
            report["latency_ms"]["max"]
        )
    };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = writeln!(std::io::stdout(), "{text}");
    Ok(())
}
