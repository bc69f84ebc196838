//! `webhook-inbox replay FILE`: redeliver a replay file on purpose. Each line is re-signed with
//! a fresh timestamp using its source's scheme and secret, and sent with bounded concurrency.
//! Replaying an export into the server it came from is all duplicates.
//!
//! Output is meant for scripts as much as for people: problems are reported by physical line
//! number (blank lines count), in file order, with how many were not shown; `--json` lists
//! every failed line, and `--rejects FILE` writes the failed lines unchanged, ready to replay.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::client::{CliError, resolve_url, segment, unreachable_message};
use super::sign::parse_scheme;
use crate::config::Settings;
use crate::domain::replay::ReplayLine;
use crate::domain::time::now_secs;
use crate::signature::Scheme;
use crate::signature::Secret;

/// Problems printed in text mode; `--json` and `--rejects` have them all.
const SHOWN: usize = 10;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The replay file (JSON lines); `-` reads stdin.
    file: PathBuf,
    /// Base URL of the server [default: from the config's `listen`, else http://127.0.0.1:8080].
    #[arg(long, env = "WEBHOOK_INBOX_URL", value_name = "URL")]
    url: Option<String>,
    /// Deliveries in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    concurrency: u16,
    /// Sign every line with this scheme and --secret instead of the config's sources.
    #[arg(long, value_parser = parse_scheme, requires = "secret")]
    scheme: Option<Scheme>,
    #[arg(long, requires = "scheme")]
    secret: Option<String>,
    /// Print the summary as JSON, with every line that was not delivered.
    #[arg(long)]
    json: bool,
    /// Write the lines that were not delivered here, unchanged and in order, to replay again.
    #[arg(long, value_name = "FILE")]
    rejects: Option<PathBuf>,
}

/// Finds the scheme and secret a line is signed with.
type Signer<'a> = dyn Fn(&ReplayLine) -> Result<(Scheme, Secret), String> + Sync + 'a;

/// What became of one line.
#[derive(Debug)]
enum Outcome {
    /// `stored_as`: the event id the server stored, where it is not the line's (a scheme that
    /// reads the id from the body, whose id differs from the line's `event_id`).
    Queued {
        stored_as: Option<String>,
    },
    Duplicate {
        stored_as: Option<String>,
    },
    /// Refused: by us before sending (not a replay line, unknown source) or by the server (4xx).
    Rejected {
        message: String,
        answered: bool,
    },
    /// Not delivered: the server could not be reached, did not answer, or failed (5xx).
    Error {
        message: String,
        answered: bool,
    },
}

impl Outcome {
    fn answered(&self) -> bool {
        match self {
            Outcome::Queued { .. } | Outcome::Duplicate { .. } => true,
            Outcome::Rejected { answered, .. } | Outcome::Error { answered, .. } => *answered,
        }
    }

    fn stored_as(&self) -> Option<&str> {
        match self {
            Outcome::Queued { stored_as } | Outcome::Duplicate { stored_as } => {
                stored_as.as_deref()
            }
            _ => None,
        }
    }

    fn problem(&self) -> Option<(&'static str, &str)> {
        match self {
            Outcome::Queued { .. } | Outcome::Duplicate { .. } => None,
            Outcome::Rejected { message, .. } => Some(("rejected", message)),
            Outcome::Error { message, .. } => Some(("error", message)),
        }
    }
}

/// A delivery line with its physical line number (1-based, blank lines counted).
struct Line {
    number: usize,
    raw: String,
}

fn read_lines(path: &Path) -> anyhow::Result<Vec<Line>> {
    let reader: Box<dyn std::io::Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?)
    };
    let mut lines = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let raw = line.with_context(|| format!("reading line {} of the replay file", i + 1))?;
        if !raw.trim().is_empty() {
            lines.push(Line { number: i + 1, raw });
        }
    }
    Ok(lines)
}

pub fn run(config: Option<&Path>, args: ReplayArgs) -> anyhow::Result<()> {
    let settings: Option<Settings> = match (&args.scheme, config) {
        (Some(_), None) => None,
        _ => Some(super::load_settings(config)?.settings),
    };
    let base = match (&args.url, &settings) {
        (Some(url), _) => url.trim_end_matches('/').to_string(),
        (None, Some(s)) => super::client::url_for_listen(&s.listen),
        (None, None) => resolve_url(None, config)?,
    };
    let lines = read_lines(&args.file)?;
    let http = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    let progress = ProgressBar::new(lines.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {rate} eta {eta}")
            .expect("a valid template")
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.0}/s", state.per_sec());
                },
            ),
    );
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
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::with_capacity(lines.len()));
    std::thread::scope(|scope| {
        for _ in 0..args.concurrency {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(line) = lines.get(i) else { break };
                    let outcome = send_line(&http, &base, &line.raw, &signer);
                    results
                        .lock()
                        .expect("no panics while held")
                        .push((i, outcome));
                    progress.inc(1);
                }
            });
        }
    });
    progress.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let mut results = results.into_inner().expect("threads are done");
    results.sort_by_key(|(i, _)| *i);
    report(&args, &base, &lines, &results, elapsed)
}

fn report(
    args: &ReplayArgs,
    base: &str,
    lines: &[Line],
    results: &[(usize, Outcome)],
    elapsed: f64,
) -> anyhow::Result<()> {
    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|(_, o)| f(o)).count();
    let queued = count(|o| matches!(o, Outcome::Queued { .. }));
    let duplicate = count(|o| matches!(o, Outcome::Duplicate { .. }));
    // Lines the server stored under another event id than the line's: said per line.
    let renamed: Vec<(&Line, &str)> = results
        .iter()
        .filter_map(|(i, o)| o.stored_as().map(|id| (&lines[*i], id)))
        .collect();
    let rejected = count(|o| matches!(o, Outcome::Rejected { .. }));
    let errors = count(|o| matches!(o, Outcome::Error { .. }));
    let sent = count(Outcome::answered);
    let failed: Vec<(&Line, &'static str, &str)> = results
        .iter()
        .filter_map(|(i, o)| o.problem().map(|(kind, m)| (&lines[*i], kind, m)))
        .collect();
    if let Some(path) = &args.rejects {
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for (line, _, _) in &failed {
            writeln!(file, "{}", line.raw)?;
        }
        file.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        let failed: Vec<_> = failed
            .iter()
            .map(|(line, kind, message)| {
                json!({"line": line.number, "result": kind, "error": message})
            })
            .collect();
        println!(
            "{}",
            json!({"lines": lines.len(), "sent": sent, "queued": queued, "duplicate": duplicate,
                   "rejected": rejected, "errors": errors, "failed": failed,
                   "stored_under_another_id": renamed.iter()
                       .map(|(line, id)| json!({"line": line.number, "event_id": id}))
                       .collect::<Vec<_>>()})
        );
    } else {
        let rate = if elapsed > 0.0 {
            lines.len() as f64 / elapsed
        } else {
            0.0
        };
        println!(
            "replayed {} line(s) to {base} in {elapsed:.1} s ({rate:.0}/s): {queued} queued, \
             {duplicate} duplicate, {rejected} rejected, {errors} errors",
            lines.len()
        );
        for (line, _, message) in failed.iter().take(SHOWN) {
            eprintln!("  line {}: {message}", line.number);
        }
        for (line, id) in renamed.iter().take(SHOWN) {
            eprintln!(
                "  line {}: stored as event id `{id}`, not the line's `event_id`: this source's \
                 scheme reads the id from the body",
                line.number
            );
        }
        if renamed.len() > SHOWN {
            eprintln!(
                "  and {} more line(s) stored under another id (--json lists them)",
                renamed.len() - SHOWN
            );
        }
        if failed.len() > SHOWN {
            eprintln!(
                "  and {} more (--json lists them all; --rejects FILE keeps the lines)",
                failed.len() - SHOWN
            );
        }
    }
    if let Some(path) = args.rejects.as_ref().filter(|_| !failed.is_empty()) {
        eprintln!(
            "{} line(s) not delivered written to {}",
            failed.len(),
            path.display()
        );
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
    signer: &Signer<'_>,
) -> Outcome {
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
        Err(message) => {
            return Outcome::Rejected {
                message,
                answered: false,
            };
        }
    };
    let mut req = http
        .post(format!("{base}/webhooks/{}", segment(&line.source)))
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
            let stored_as = answer["event_id"]
                .as_str()
                .filter(|id| *id != line.event_id)
                .map(String::from);
            match answer["status"].as_str() {
                Some("queued") => Outcome::Queued { stored_as },
                _ => Outcome::Duplicate { stored_as },
            }
        }
        Ok(r) => {
            let status = r.status();
            let answer: serde_json::Value = r.json().unwrap_or_default();
            let message = match (answer["error"].as_str(), answer["message"].as_str()) {
                (Some(code), Some(text)) => format!("{} {code}: {text}", status.as_u16()),
                _ => status.to_string(),
            };
            if status.is_client_error() {
                Outcome::Rejected {
                    message,
                    answered: true,
                }
            } else {
                Outcome::Error {
                    message,
                    answered: true,
                }
            }
        }
        Err(e) => Outcome::Error {
            message: unreachable_message(&e, base),
            answered: false,
        },
    }
}
