//! `webhook-inbox subscriptions secret|rotate-secret`: a subscription's secret (SPEC section
//! 13), through the HTTP API. The secret is printed on standard output only.

use clap::Args;
use serde_json::json;

use super::client::{Api, ApiClient, Remote, segment};

#[derive(Debug, Args)]
pub struct SecretArgs {
    name: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Debug, Args)]
pub struct RotateArgs {
    name: String,
    /// How long the old secret keeps working beside the new one (0 to 2592000).
    #[arg(long, default_value_t = 86_400)]
    grace_seconds: i64,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// The signing secrets of an `http` subscription, current first, one a line.
pub fn show(api: &Api, args: SecretArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let answer = client.get(
        &format!("/subscriptions/{}/secret", segment(&args.name)),
        &[],
    )?;
    if args.json {
        println!("{answer}");
    } else {
        for secret in answer["signing_secrets"].as_array().into_iter().flatten() {
            println!("{}", secret.as_str().unwrap_or_default());
        }
    }
    Ok(())
}

/// A new secret; the old one keeps working for the grace.
pub fn rotate(api: &Api, args: RotateArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(api, &args.remote)?;
    let path = format!("/subscriptions/{}/rotate-secret", segment(&args.name));
    let answer = client.post(
        &path,
        &[],
        Some(&json!({ "grace_seconds": args.grace_seconds })),
    )?;
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    let secret = answer["signing_secret"]
        .as_str()
        .or_else(|| answer["token"].as_str())
        .unwrap_or_default();
    println!("{secret}");
    eprintln!(
        "the previous one keeps working until {}{}",
        answer["previous_valid_until"].as_str().unwrap_or("?"),
        if answer["token"].is_string() {
            " (the token is shown only now: it is kept as a digest)"
        } else {
            ""
        }
    );
    Ok(())
}
