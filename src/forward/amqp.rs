//! One publish of an `amqp` subscription (SPEC section 13): the event's body as stored, to its
//! exchange with its routing key, `mandatory`, on a channel in confirm mode. Done only when the
//! broker confirms it and did not return it: a message no queue takes comes back as a
//! `basic.return` before its ack, and is a failed attempt naming the exchange and the key.
//!
//! `message_id` is the event's `webhook-id`: RabbitMQ keeps no duplicate window, so a
//! re-publish (an attempt that timed out after the broker took it, a claim that outlived its
//! lease) is a second copy in the queue, which the consumer drops by that id
//! (examples/amqp_consumer.py).
//!
//! The publishes of the forwarder's calls in flight share one connection, each on a confirm
//! channel of its own, taken from the subscription's idle ones (so at most `concurrency` are
//! open). One publish in flight per channel is what makes a `basic.return` that publish's:
//! lapin hands a return to whichever confirm of the channel it resolves next, and RabbitMQ acks
//! an unroutable publish together with the routable ones confirmed before it (`multiple`),
//! which lapin resolves in no set order; on one shared channel an unroutable event could be
//! completed (tests/api/amqp_channels.rs). It costs the broker more CPU a message than one
//! channel (docs/performance.md).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::Mutex;

use super::call::{Answer, webhook_id};
use crate::store::Claimed;
use crate::subscriptions::{HttpTarget, amqp::MAX_SHORT_STRING, template};

/// Persistent: the broker writes it to disk before it confirms it to a durable queue.
const PERSISTENT: u8 = 2;

/// The broker of one subscription: connected on the first publish and again whenever the
/// connection was closed (a broker restarted). A channel is dropped, and so closed, after any
/// publish on it that did not end with its confirm (a publish to an exchange that is not there
/// closes it on the broker's side; a timed-out one may still be confirmed later).
pub struct Publisher {
    target: HttpTarget,
    connection: Mutex<Option<Arc<Connection>>>,
    /// Confirm channels with no publish in flight.
    idle: std::sync::Mutex<Vec<Channel>>,
}

impl Publisher {
    pub fn new(target: HttpTarget) -> Publisher {
        Publisher {
            target,
            connection: Mutex::new(None),
            idle: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.target.timeout_ms)
    }

    /// Publish `body` (taken from the claim) with the event's properties and headers and its
    /// W3C `traceparent` when it has one, and wait for the confirm, all within the
    /// subscription's timeout. A connect that fails or times out sent nothing.
    pub async fn publish(
        &self,
        (event, traceparent): (&Claimed, Option<&str>),
        body: Vec<u8>,
    ) -> Answer {
        let started = tokio::time::Instant::now();
        let channel = match tokio::time::timeout(self.timeout(), self.channel()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => return failed(error, false, "connection"),
            Err(_) => {
                let error = format!(
                    "could not connect to the broker within {} ms (nothing was sent)",
                    self.target.timeout_ms
                );
                return failed(error, false, "connection");
            }
        };
        let left = self.timeout().saturating_sub(started.elapsed());
        let sent = self.send(&channel, event, traceparent, body);
        match tokio::time::timeout(left, sent).await {
            Ok((answer, confirmed)) => {
                if confirmed && channel.status().connected() {
                    self.idle().push(channel);
                }
                answer
            }
            Err(_) => {
                let error = format!(
                    "no confirm from the broker within {} ms (it may have taken the message)",
                    self.target.timeout_ms
                );
                failed(error, true, "timeout")
            }
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Channel>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle open channel, or a new one on the open connection or a new connection's.
    /// Errors never name the URL.
    async fn channel(&self) -> Result<Channel, String> {
        loop {
            let Some(channel) = self.idle().pop() else {
                break;
            };
            if channel.status().connected() {
                return Ok(channel);
            }
        }
        let unopened =
            |e| format!("could not open a channel in confirm mode (nothing was sent): {e}");
        let mut connection = self.connection.lock().await;
        if let Some(open) = connection.as_ref()
            && open.status().connected()
        {
            return confirm_channel(open).await.map_err(unopened);
        }
        *connection = None;
        let open = self
            .connect()
            .await
            .map_err(|e| format!("could not connect to the broker (nothing was sent): {e}"))?;
        let channel = confirm_channel(&open).await.map_err(unopened)?;
        *connection = Some(Arc::new(open));
        Ok(channel)
    }

    /// A connection with the URL's credentials and vhost, and, for `amqps://` to an internal
    /// broker, the subscription's CA (the system's roots otherwise).
    async fn connect(&self) -> lapin::Result<Connection> {
        let tls = OwnedTLSConfig {
            identity: None,
            cert_chain: match &self.target.ca_file {
                Some(file) => Some(std::fs::read_to_string(file).map_err(|e| {
                    lapin::Error::from(std::io::Error::other(format!(
                        "reading ca_file {file}: {e}"
                    )))
                })?),
                None => None,
            },
        };
        let properties =
            ConnectionProperties::default().with_connection_name("webhook-inbox".into());
        Connection::connect_with_config(
            &self.target.url,
            properties,
            tls,
            lapin::runtime::default_runtime()?,
        )
        .await
    }

    /// The answer, and whether the channel is left with no publish in flight (its confirm
    /// came, or nothing was sent), so that another publish may use it.
    async fn send(
        &self,
        channel: &Channel,
        event: &Claimed,
        traceparent: Option<&str>,
        body: Vec<u8>,
    ) -> (Answer, bool) {
        let claim = &event.claim;
        let exchange = self.target.exchange.as_deref().unwrap_or_default();
        let key = template::fill(
            self.target.routing_key.as_deref().unwrap_or_default(),
            &claim.source,
            &event.event_type,
        );
        let at = format!("exchange `{exchange}` with routing key `{key}`");
        if key.len() > MAX_SHORT_STRING {
            let error = format!("the routing key is over {MAX_SHORT_STRING} bytes: {at}");
            return (failed(error, false, "not_sent"), true);
        }
        let mut headers = FieldTable::default();
        let mut header = |name: &str, value: &str| {
            headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
        };
        header("webhook-inbox-source", &claim.source);
        header("webhook-inbox-event-id", &claim.event_id);
        header("webhook-inbox-event-type", &event.event_type);
        header("webhook-inbox-attempt", &claim.attempt.to_string());
        if let Some(traceparent) = traceparent {
            header(crate::telemetry::traces::TRACEPARENT, traceparent);
        }
        let content_type = event
            .content_type
            .as_deref()
            .unwrap_or("application/octet-stream");
        let properties = BasicProperties::default()
            .with_message_id(webhook_id(&claim.source, &claim.event_id).into())
            .with_delivery_mode(PERSISTENT)
            .with_content_type(content_type.into())
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = match channel
            .basic_publish(
                exchange.into(),
                key.as_str().into(),
                options,
                &body,
                properties,
            )
            .await
        {
            Ok(confirm) => confirm,
            Err(e) => {
                // Refused before a frame went out (the channel or connection was already
                // closed), or lost while they were written.
                let unsent = matches!(
                    e.kind(),
                    ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(_)
                );
                let error = format!("could not publish to {at}: {e}");
                return (failed(error, !unsent, "connection"), false);
            }
        };
        let answer = match confirm.await {
            Ok(Confirmation::Ack(None)) => Answer::Delivered(200),
            Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => {
                let error = format!(
                    "the broker returned the message: no queue is bound to {at} ({} {})",
                    returned.reply_code, returned.reply_text
                );
                failed(error, false, "refused")
            }
            // A message routed to several queues is nacked when one of them refuses it while
            // the others hold it: it may have been delivered.
            Ok(Confirmation::Nack(None)) => failed(
                format!("the broker nacked the publish to {at}"),
                true,
                "refused",
            ),
            Ok(Confirmation::NotRequested) => {
                let error = format!("the channel is not in confirm mode (publish to {at})");
                return (failed(error, true, "connection"), false);
            }
            Err(e) => {
                // The broker closes the channel of a publish to an exchange that is not there:
                // nothing was routed. Any other loss may have come after it took the message.
                let missing = matches!(
                    e.kind(),
                    ErrorKind::ProtocolError(p)
                        if *p.kind() == AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)
                );
                let error = format!("no confirm for the publish to {at}: {e}");
                let answer = if missing {
                    failed(error, false, "refused")
                } else {
                    failed(error, true, "connection")
                };
                return (answer, false);
            }
        };
        (answer, true)
    }
}

async fn confirm_channel(connection: &Connection) -> lapin::Result<Channel> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

fn failed(error: String, unknown: bool, result: &'static str) -> Answer {
    Answer::Failed {
        error,
        unknown,
        retry_after_ms: None,
        result,
    }
}
