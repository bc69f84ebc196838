//! `webhook-inbox subscriptions create|update|delete`: the registry's runtime routes (SPEC
//! section 13), one flag per field of a config's `[[subscriptions]]` table (`url` and `token`
//! as `--endpoint-url` and `--pull-token`: `--url` and `--token` name the server and its admin
//! token, as in every API command). Only the flags given are sent: an update changes those
//! fields and keeps the others.

use clap::Args;
use serde_json::{Map, Value, json};

use super::client::{Api, ApiClient, Remote, segment};
use super::table::text;

/// The fields of a subscription, as flags (each optional; the server checks them as it checks
/// a config).
#[derive(Debug, Args)]
pub struct FieldArgs {
    /// A source it takes (repeat for several); default: every source.
    #[arg(long = "source", value_name = "SOURCE")]
    sources: Vec<String>,
    /// A glob on the event type it takes (repeat for several); default: every type.
    #[arg(long = "type", value_name = "GLOB")]
    types: Vec<String>,
    /// `http`: the endpoint to call; `nats`, `amqp`: the broker (the field `url`; `--url` is
    /// the server's).
    #[arg(long, value_name = "URL")]
    endpoint_url: Option<String>,
    /// `nats`: the subject template (`{source}`, `{type}`).
    #[arg(long)]
    subject: Option<String>,
    /// `nats`: the JetStream stream checked before the first publish.
    #[arg(long)]
    stream: Option<String>,
    /// `nats`: a creds file on the nodes (a user JWT and its nkey seed, as `nsc` writes one).
    #[arg(long)]
    creds_file: Option<String>,
    /// `amqp`: the exchange (`""`: the default exchange).
    #[arg(long)]
    exchange: Option<String>,
    /// `amqp`: the routing key template (`{source}`, `{type}`).
    #[arg(long)]
    routing_key: Option<String>,
    /// `http`: a `whsec_` secret (default: one is generated and printed once).
    #[arg(long)]
    signing_secret: Option<String>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    #[arg(long)]
    ca_file: Option<String>,
    #[arg(long)]
    concurrency: Option<u64>,
    #[arg(long)]
    rate_per_second: Option<u64>,
    /// `at-least-once` or `at-most-once`.
    #[arg(long)]
    mode: Option<String>,
    #[arg(long)]
    max_attempts: Option<u64>,
    #[arg(long)]
    backoff_base_ms: Option<u64>,
    #[arg(long)]
    backoff_max_ms: Option<u64>,
    /// `pull`: the bearer token of its routes, the field `token` (`--token` is the admin's;
    /// default: one is generated and printed once).
    #[arg(long, value_name = "TOKEN")]
    pull_token: Option<String>,
    /// A JSON pointer into the body: events of one key in order.
    #[arg(long)]
    ordered_by: Option<String>,
    /// `hold` or `skip`.
    #[arg(long)]
    on_failure: Option<String>,
    /// Conditions on the body, as JSON: `{"path":"/data/object/amount","gte":1000}` (see the
    /// subscriptions guide).
    #[arg(long, value_name = "JSON", value_parser = json_text)]
    filter: Option<String>,
    /// A jq program whose one output is delivered (`http`, `pull`, `nats`; see the
    /// subscriptions guide). `--transform ''` on `update` removes it.
    #[arg(long, value_name = "PROGRAM")]
    transform: Option<String>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    name: String,
    /// `http`, `nats`, `amqp`, `pull`, `loyalty-credit`, `audit`, `downstream`.
    #[arg(long)]
    kind: String,
    /// Boxed: the flags of every field would make this the largest command by far.
    #[command(flatten)]
    fields: Box<FieldArgs>,
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    name: String,
    /// Boxed: the flags of every field would make this the largest command by far.
    #[command(flatten)]
    fields: Box<FieldArgs>,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    name: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// JSON text, checked when the flag is read (kept as text: the command's size stays small).
fn json_text(text: &str) -> Result<String, String> {
    serde_json::from_str::<Value>(text)
        .map(|_| text.to_string())
        .map_err(|e| format!("not JSON: {e}"))
}

impl FieldArgs {
    /// The flags given, as the body's fields.
    fn body(&self) -> Map<String, Value> {
        let mut body = Map::new();
        let lists = [("sources", &self.sources), ("types", &self.types)];
        for (field, list) in lists {
            if !list.is_empty() {
                body.insert(field.into(), json!(list));
            }
        }
        let texts = [
            ("url", &self.endpoint_url),
            ("subject", &self.subject),
            ("stream", &self.stream),
            ("creds_file", &self.creds_file),
            ("exchange", &self.exchange),
            ("routing_key", &self.routing_key),
            ("signing_secret", &self.signing_secret),
            ("ca_file", &self.ca_file),
            ("mode", &self.mode),
            ("token", &self.pull_token),
            ("ordered_by", &self.ordered_by),
            ("on_failure", &self.on_failure),
        ];
        for (field, value) in texts {
            if let Some(v) = value {
                body.insert(field.into(), json!(v));
            }
        }
        let numbers = [
            ("timeout_ms", self.timeout_ms),
            ("concurrency", self.concurrency),
            ("rate_per_second", self.rate_per_second),
            ("max_attempts", self.max_attempts),
            ("backoff_base_ms", self.backoff_base_ms),
            ("backoff_max_ms", self.backoff_max_ms),
        ];
        for (field, value) in numbers {
            if let Some(v) = value {
                body.insert(field.into(), json!(v));
            }
        }
        if let Some(filter) = self
            .filter
            .as_deref()
            .and_then(|f| serde_json::from_str(f).ok())
        {
            body.insert("filter".into(), filter);
        }
        match self.transform.as_deref() {
            None => {}
            Some("") => {
                body.insert("transform".into(), Value::Null);
            }
            Some(program) => {
                body.insert("transform".into(), json!(program));
            }
        }
        body
    }
}

/// The subscription as one line, and a generated secret on a line of its own (shown once).
fn print(answer: &Value, json: bool, verb: &str) {
    if json {
        println!("{answer}");
        return;
    }
    println!(
        "{}: {verb} ({}, origin {})",
        text(&answer["name"]),
        text(&answer["kind"]),
        text(&answer["origin"])
    );
    for field in ["signing_secret", "token"] {
        if let Some(secret) = answer[field].as_str() {
            println!("{field}: {secret}");
            println!("(shown this once: keep it)");
        }
    }
}

pub fn create(api: &Api, args: CreateArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.fields.remote)?;
    let mut body = args.fields.body();
    body.insert("name".into(), json!(args.name));
    body.insert("kind".into(), json!(args.kind));
    let answer = client.post("/subscriptions", &[], Some(&Value::Object(body)))?;
    print(&answer, args.fields.json, "created");
    Ok(())
}

pub fn update(api: &Api, args: UpdateArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.fields.remote)?;
    let path = format!("/subscriptions/{}", segment(&args.name));
    let body = Value::Object(args.fields.body());
    let answer = client.call(reqwest::Method::PATCH, &path, Some(&body))?;
    print(&answer, args.fields.json, "updated");
    Ok(())
}

pub fn delete(api: &Api, args: DeleteArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let path = format!("/subscriptions/{}", segment(&args.name));
    let answer = client.call(reqwest::Method::DELETE, &path, None)?;
    if args.json {
        println!("{answer}");
    } else {
        println!(
            "{}: removed, {} unfinished state(s) finished",
            args.name,
            text(&answer["finished"])
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// The subscription whose filter decides and whose transform runs.
    name: String,
    /// The stored event, as SOURCE/EVENT_ID.
    #[arg(long, value_name = "SOURCE/ID")]
    event: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// What a subscription's filter and transform make of a stored event (`POST
/// /subscriptions/preview`): nothing changes.
pub fn preview(api: &Api, args: PreviewArgs) -> anyhow::Result<()> {
    let Some((source, event_id)) = args.event.split_once('/') else {
        anyhow::bail!("--event takes SOURCE/EVENT_ID, e.g. stripe/evt_123");
    };
    let client = ApiClient::new(api, &args.remote)?;
    let sub = client.get(&format!("/subscriptions/{}", segment(&args.name)), &[])?;
    let body = json!({
        "filter": sub["filter"],
        "transform": sub["transform"],
        "event": {"source": source, "event_id": event_id},
    });
    let answer = client.post("/subscriptions/preview", &[], Some(&body))?;
    if args.json {
        println!("{answer}");
    } else if answer["matches"] == json!(true) {
        match answer["outcome"].as_str() {
            Some("filtered") => println!(
                "{}: takes {source}/{event_id}, and its transform gives no output: it would \
                 complete as `filtered`, nothing delivered",
                args.name
            ),
            Some("failed") => println!(
                "{}: takes {source}/{event_id}, and its transform fails: {}",
                args.name,
                answer["error"].as_str().unwrap_or("")
            ),
            _ => {
                println!(
                    "{}: takes {source}/{event_id}; it would deliver:",
                    args.name
                );
                println!("{}", serde_json::to_string_pretty(&answer["delivered"])?);
            }
        }
    } else {
        println!("{}: its filter leaves {source}/{event_id} out", args.name);
    }
    Ok(())
}
