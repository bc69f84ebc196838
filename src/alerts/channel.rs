//! A channel: what a notice looks like to it, and the one bounded call that sends it.

use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::config::{AlertSettings, ChannelKind};
use crate::domain::time::rfc3339;
use crate::store::alerts::Notice;

/// One `[[alerts]]` entry ready to send.
pub struct Channel {
    pub name: String,
    pub settings: AlertSettings,
    client: reqwest::Client,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").field("name", &self.name).finish()
    }
}

/// The `webhook-id` of a notice: the same on every attempt and node, so that a receiver that
/// deduplicates on it sees a notice re-sent after a crash once.
pub fn notice_id(alert: &str, episode: i64, phase: &str) -> String {
    let digest = Sha256::new()
        .chain_update(alert.as_bytes())
        .chain_update([0u8])
        .chain_update(episode.to_be_bytes())
        .chain_update(phase.as_bytes())
        .finalize();
    format!("alert_{}", hex::encode(&digest[..16]))
}

/// The condition and subject of an alert key (`channel/condition/subject`).
fn parts(alert: &str) -> (&str, &str) {
    let mut it = alert.splitn(3, '/');
    let _channel = it.next();
    (it.next().unwrap_or(""), it.next().unwrap_or(""))
}

impl Channel {
    pub fn new(settings: &AlertSettings) -> anyhow::Result<Channel> {
        let timeout = Duration::from_millis(settings.timeout_ms);
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("building the alert channel's HTTP client")?;
        Ok(Channel {
            name: settings.channel().to_string(),
            settings: settings.clone(),
            client,
        })
    }

    /// The JSON body of a notice for this channel's kind.
    pub fn body(&self, n: &Notice) -> Value {
        let (condition, subject) = parts(&n.alert);
        let since = rfc3339(n.since);
        match self.settings.kind {
            ChannelKind::Webhook => json!({
                "type": format!("alert.{}", n.phase),
                "alert": n.alert,
                "channel": n.channel,
                "condition": condition,
                "subject": subject,
                "episode": n.episode,
                "phase": n.phase,
                "title": n.title,
                "figure": n.figure,
                "since": since,
                "link": n.link,
            }),
            ChannelKind::Slack => {
                let mark = if n.phase == "started" { "🔴" } else { "✅" };
                let text = format!(
                    "{mark} {} {}: {} (since {since})",
                    n.title, n.phase, n.figure
                );
                json!({
                    "text": text,
                    "blocks": [
                        {"type": "section", "text": {"type": "mrkdwn", "text": format!(
                            "{mark} *{}* {}\n{}\nSince {since}", n.title, n.phase, n.figure)}},
                        {"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
                            "<{}|Open in webhook-inbox> · `{}`", n.link, n.alert)}]}
                    ]
                })
            }
        }
    }

    /// POST the notice, bounded by the channel's `timeout_ms`; `Ok` on a 2xx.
    pub async fn send(&self, n: &Notice, now_ms: i64) -> anyhow::Result<u16> {
        let body = serde_json::to_vec(&self.body(n)).expect("JSON values serialise");
        let mut request = self
            .client
            .post(&self.settings.url)
            .header("content-type", "application/json");
        if let Some(secret) = &self.settings.secret {
            let id = notice_id(&n.alert, n.episode, &n.phase);
            let headers = crate::forward::call::signed_headers(
                std::slice::from_ref(secret),
                &id,
                &body,
                now_ms / 1000,
            )
            .map_err(|e| anyhow::anyhow!("cannot sign: {e}"))?;
            for (name, value) in headers {
                request = request.header(name, value);
            }
        }
        let response = request
            .body(body)
            .send()
            .await
            // The URL is the secret of a `slack` channel: keep it out of the error (logs,
            // `alert_notices.last_error`, the CLI's answer).
            .map_err(|e| e.without_url())
            .context("calling the channel")?;
        let status = response.status();
        if !status.is_success() {
            anyhow::bail!("the channel answered {status}");
        }
        Ok(status.as_u16())
    }
}

/// The notice `webhook-inbox alerts test` sends: marked as a test in every field people read.
pub fn test_notice(channel: &str, link: &str, now_ms: i64) -> Notice {
    Notice {
        id: 0,
        alert: format!("{channel}/test/{}", uuid::Uuid::new_v4().simple()),
        episode: 1,
        phase: "started".into(),
        channel: channel.into(),
        title: "webhook-inbox test notice".into(),
        figure: "this channel receives webhook-inbox alerts; nothing is wrong".into(),
        since: now_ms,
        link: link.into(),
        created_at: now_ms,
        attempts: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slack_notice_has_text_and_blocks_with_the_figure_and_the_link() {
        let settings: AlertSettings =
            toml::from_str("kind = \"slack\"\nurl = \"https://hooks.example.com/x\"\n").unwrap();
        let channel = Channel::new(&settings).unwrap();
        let mut n = test_notice("slack", "https://inbox.example.com/ui/#overview", 0);
        n.alert = "slack/breaker_open/billing".into();
        n.figure = "circuit breaker open".into();
        let body = channel.body(&n);
        let text = body["text"].as_str().unwrap();
        assert!(
            text.contains("circuit breaker open") && text.contains("started"),
            "{text}"
        );
        let blocks = body["blocks"].as_array().unwrap();
        assert_eq!(blocks.len(), 2);
        let context = blocks[1]["elements"][0]["text"].as_str().unwrap();
        assert!(
            context.contains("<https://inbox.example.com/ui/#overview|"),
            "{context}"
        );
        assert!(context.contains("slack/breaker_open/billing"), "{context}");
    }

    #[test]
    fn a_notice_keeps_its_id_across_attempts_and_phases_differ() {
        let started = notice_id("ops/breaker_open/billing", 3, "started");
        assert_eq!(started, notice_id("ops/breaker_open/billing", 3, "started"));
        assert_ne!(started, notice_id("ops/breaker_open/billing", 3, "cleared"));
        assert_ne!(started, notice_id("ops/breaker_open/billing", 4, "started"));
    }
}
