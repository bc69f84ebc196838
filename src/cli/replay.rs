//! `webhook-inbox replay FILE`: redeliver a replay file on purpose. Each line is re-signed with
//! a fresh timestamp using its source's scheme and secret, and sent with bounded concurrency.
//! Replaying an export into the server it came from is all duplicates.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::client::CliError;
use super::sign::parse_scheme;
use crate::config::{Secret, Settings};
use crate::domain::replay::ReplayLine;
use crate::domain::time::now_secs;
use crate::signature::Scheme;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The replay file (JSON lines); `-` reads stdin.
    file: PathBuf,
    /// Base URL of the server.
    #[arg(
        long,
        env = "WEBHOOK_INBOX_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    url: String,
    /// Deliveries in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    concurrency: u16,
    /// Sign every line with this scheme and --secret instead of the config's sources.
    #[arg(long, value_parser = parse_scheme, requires = "secret")]
    scheme: Option<Scheme>,
    #[arg(long, requires = "scheme")]
    secret: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Finds the scheme and secret a line is signed with.
type Signer<'a> = dyn Fn(&ReplayLine) -> Result<(Scheme, Secret), String> + Sync + 'a;

#[derive(Default)]
struct Tally {
    queued: AtomicUsize,
    duplicate: AtomicUsize,
    rejected: AtomicUsize,
    errors: AtomicUsize,
    /// The first few problems, to show what went wrong.
    samples: Mutex<Vec<String>>,
}

impl Tally {
    fn problem(&self, counter: &AtomicUsize, line: usize, what: String) {
        counter.fetch_add(1, Ordering::SeqCst);
        let mut samples = self.samples.lock().expect("no panics while held");
        if samples.len() < 10 {
            samples.push(format!("line {line}: {what}"));
        }
    }
}

fn read_lines(path: &Path) -> anyhow::Result<Vec<String>> {
    let reader: Box<dyn std::io::Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?)
    };
    BufReader::new(reader)
        .lines()
        .collect::<Result<Vec<_>, _>>()
        .context("reading the replay file")
}

pub fn run(config: Option<&Path>, args: ReplayArgs) -> anyhow::Result<()> {
    let settings: Option<Settings> = match (&args.scheme, config) {
        (Some(_), None) => None,
        _ => Some(super::load_settings(config)?.settings),
    };
    let lines: Vec<String> = read_lines(&args.file)?
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .collect();
    let http = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    let base = args.url.trim_end_matches('/').to_string();
    let tally = Tally::default();
    let progress = ProgressBar::new(lines.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {per_sec} eta {eta}")
            .expect("a valid template"),
    );
    let next = AtomicUsize::new(0);
    let signer = |line: &ReplayLine| -> Result<(Scheme, Secret), String> {
        if let (Some(scheme), Some(secret)) = (args.scheme, &args.secret) {
            return Ok((scheme, Secret::new(secret.clone())));
        }
        let source = settings
            .as_ref()
            .and_then(|s| s.source(&line.source))
            .ok_or_else(|| format!("source `{}` is not in the config", line.source))?;
        Ok((source.scheme, source.secrets[0].clone()))
    };
    std::thread::scope(|scope| {
        for _ in 0..args.concurrency {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(raw) = lines.get(i) else { break };
                    send_line(&http, &base, raw, i + 1, &signer, &tally);
                    progress.inc(1);
                }
            });
        }
    });
    progress.finish_and_clear();
    let count = |c: &AtomicUsize| c.load(Ordering::SeqCst);
    let (queued, duplicate, rejected, errors) = (
        count(&tally.queued),
        count(&tally.duplicate),
        count(&tally.rejected),
        count(&tally.errors),
    );
    if args.json {
        println!(
            "{}",
            json!({"sent": lines.len(), "queued": queued, "duplicate": duplicate,
                   "rejected": rejected, "errors": errors})
        );
    } else {
        println!(
            "replayed {}: {queued} queued, {duplicate} duplicate, {rejected} rejected, {errors} errors",
            lines.len()
        );
    }
    for sample in tally.samples.lock().expect("threads are done").iter() {
        eprintln!("  {sample}");
    }
    match (rejected, errors) {
        (0, 0) => Ok(()),
        (_, 0) => Err(CliError::Refused(format!("{rejected} line(s) were rejected")).into()),
        _ => Err(CliError::Unreachable(format!("{errors} line(s) could not be delivered")).into()),
    }
}

fn send_line(
    http: &reqwest::blocking::Client,
    base: &str,
    raw: &str,
    number: usize,
    signer: &Signer<'_>,
    tally: &Tally,
) {
    let prepared = serde_json::from_str::<ReplayLine>(raw)
        .map_err(|e| format!("not a replay line: {e}"))
        .and_then(|line| {
            let body = line.body_bytes()?;
            let (scheme, secret) = signer(&line)?;
            let headers =
                scheme.sign(&secret, &line.event_id, &line.event_type, &body, now_secs())?;
            Ok((line, body, headers))
        });
    let (line, body, headers) = match prepared {
        Ok(p) => p,
        Err(e) => return tally.problem(&tally.rejected, number, e),
    };
    let mut req = http
        .post(format!(
            "{base}/webhooks/{}",
            super::client::segment(&line.source)
        ))
        .header(
            "Content-Type",
            line.content_type.as_deref().unwrap_or("application/json"),
        )
        .body(body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    match req.send() {
        Ok(r) if r.status().is_success() => {
            let answer: serde_json::Value = r.json().unwrap_or_default();
            match answer["status"].as_str() {
                Some("queued") => tally.queued.fetch_add(1, Ordering::SeqCst),
                _ => tally.duplicate.fetch_add(1, Ordering::SeqCst),
            };
        }
        Ok(r) if r.status().is_client_error() => {
            let status = r.status();
            let text = r.text().unwrap_or_default();
            tally.problem(&tally.rejected, number, format!("{status}: {text}"));
        }
        Ok(r) => {
            let status = r.status();
            tally.problem(&tally.errors, number, format!("{status}"));
        }
        Err(e) => tally.problem(&tally.errors, number, format!("{e}")),
    }
}
