//! One publish of a `nats` subscription (SPEC section 13): the event's body as stored, to its
//! subject on a JetStream stream, done when the stream's ack arrives.
//!
//! `Nats-Msg-Id` is the event's `webhook-id`, so the stream's duplicate window drops a
//! re-publish (an attempt that timed out after the broker stored it, a claim that outlived its
//! lease): the stream holds each event once, as a receiver's dedup on `webhook-id` does.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use tokio::sync::OnceCell;

use super::call::{Answer, webhook_id};
use crate::store::Claimed;
use crate::subscriptions::{HttpTarget, template};

/// The broker of one subscription: connected on the first publish (and again after a failed
/// connect), then kept; the client reconnects by itself after that.
pub struct Publisher {
    target: HttpTarget,
    jetstream: OnceCell<jetstream::Context>,
}

impl Publisher {
    pub fn new(target: HttpTarget) -> Publisher {
        Publisher {
            target,
            jetstream: OnceCell::new(),
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.target.timeout_ms)
    }

    /// Connect, with the URL's credentials (`user:password@`, or a token as the user) or the
    /// `creds_file`'s (a JWT the broker checks, and a nonce signed with the seed), and check
    /// the configured stream exists. Errors never name the URL.
    async fn connect(&self) -> Result<jetstream::Context, Answer> {
        let mut url = reqwest::Url::parse(&self.target.url)
            .map_err(|_| refused("the broker's URL does not parse".into(), "not_sent"))?;
        let mut options = async_nats::ConnectOptions::new()
            .connection_timeout(self.timeout())
            .name("webhook-inbox");
        let user = url.username().to_string();
        match (user.is_empty(), url.password()) {
            (true, _) => {}
            (false, Some(password)) => {
                options = options.user_and_password(user, password.to_string());
            }
            (false, None) => options = options.token(user),
        }
        // The client would not read them from the URL itself.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        if let Some(file) = &self.target.ca_file {
            options = options.add_root_certificates(file.into()).require_tls(true);
        }
        if let Some(file) = &self.target.creds_file {
            options = options.credentials_file(file).await.map_err(|e| {
                refused(
                    format!("could not read the creds_file (nothing was sent): {e}"),
                    "not_sent",
                )
            })?;
        }
        let client = options.connect(url.as_str()).await.map_err(|e| {
            refused(
                format!("could not connect to the broker (nothing was sent): {e}"),
                "connection",
            )
        })?;
        let mut context = jetstream::new(client);
        context.set_timeout(self.timeout());
        if let Some(stream) = &self.target.stream {
            context.get_stream(stream).await.map_err(|e| {
                refused(
                    format!("the stream `{stream}` is not there (nothing was sent): {e}"),
                    "refused",
                )
            })?;
        }
        Ok(context)
    }

    /// Publish `body` (taken from the claim) with the event's headers and its W3C
    /// `traceparent` when it has one, and wait for the ack, all within the subscription's
    /// timeout.
    pub async fn publish(
        &self,
        (event, traceparent): (&Claimed, Option<&str>),
        body: Vec<u8>,
    ) -> Answer {
        let sent = self.send(event, traceparent, body);
        match tokio::time::timeout(self.timeout(), sent).await {
            Ok(answer) => answer,
            Err(_) => Answer::Failed {
                error: format!(
                    "no ack from the broker within {} ms (it may have stored the event)",
                    self.target.timeout_ms
                ),
                unknown: true,
                retry_after_ms: None,
                result: "timeout",
            },
        }
    }

    async fn send(&self, event: &Claimed, traceparent: Option<&str>, body: Vec<u8>) -> Answer {
        let context = match self.jetstream.get_or_try_init(|| self.connect()).await {
            Ok(c) => c,
            Err(answer) => return answer,
        };
        let claim = &event.claim;
        let subject = template::fill(
            self.target
                .subject
                .as_deref()
                .unwrap_or("webhooks.{source}"),
            &claim.source,
            &event.event_type,
        );
        let content_type = event
            .content_type
            .as_deref()
            .unwrap_or("application/octet-stream");
        let mut message = jetstream::message::PublishMessage::build()
            .payload(body.into())
            .message_id(webhook_id(&claim.source, &claim.event_id))
            .header("Content-Type", header_value(content_type))
            .header("webhook-inbox-source", header_value(&claim.source))
            .header("webhook-inbox-event-id", header_value(&claim.event_id))
            .header("webhook-inbox-event-type", header_value(&event.event_type))
            .header("webhook-inbox-attempt", claim.attempt.to_string());
        if let Some(traceparent) = traceparent {
            message = message.header(crate::telemetry::traces::TRACEPARENT, traceparent);
        }
        let ack = match context.send_publish(subject.clone(), message).await {
            Ok(future) => future.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(_) => Answer::Delivered(200),
            Err(e) => {
                let (unknown, result) = match e.kind() {
                    // Nothing was stored: no stream takes the subject, or it is too big.
                    PublishErrorKind::StreamNotFound | PublishErrorKind::MaxPayloadExceeded => {
                        (false, "refused")
                    }
                    PublishErrorKind::TimedOut => (true, "timeout"),
                    _ => (true, "connection"),
                };
                Answer::Failed {
                    error: format!("the broker did not ack the publish to `{subject}`: {e}"),
                    unknown,
                    retry_after_ms: None,
                    result,
                }
            }
        }
    }
}

/// A header's value on one line: the protocol's headers end at a line break.
fn header_value(value: &str) -> String {
    value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn refused(error: String, result: &'static str) -> Answer {
    Answer::Failed {
        error,
        unknown: false,
        retry_after_ms: None,
        result,
    }
}
