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
//! The publishes of the forwarder's calls in flight share one connection and go out in small
//! groups, each group on a confirm channel of its own (lane.rs: why a publish waits for its
//! group's confirms before it knows it was not returned).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::Mutex;

mod lane;

use super::call::{Answer, webhook_id};
use crate::store::Claimed;
use crate::subscriptions::{HttpTarget, amqp::MAX_SHORT_STRING, template};
use lane::{Lane, Place, Settled};

/// Persistent: the broker writes it to disk before it confirms it to a durable queue.
const PERSISTENT: u8 = 2;

/// The broker of one subscription: connected on the first publish and again whenever the
/// connection was closed (a broker restarted). A channel is dropped, and so closed, after a
/// group in which a publish got no confirm (a publish to an exchange that is not there closes
/// it on the broker's side; a timed-out one may still be confirmed later).
pub struct Publisher {
    target: HttpTarget,
    connection: Mutex<Option<Arc<Connection>>>,
    /// The group new publishes join while it is open.
    open: Mutex<Option<Arc<Lane>>>,
    /// Confirm channels with no publish in flight.
    idle: std::sync::Mutex<Vec<Channel>>,
}

impl Publisher {
    pub fn new(target: HttpTarget) -> Publisher {
        Publisher {
            target,
            connection: Mutex::new(None),
            open: Mutex::new(None),
            idle: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.target.timeout_ms)
    }

    /// Publish `body` (taken from the claim) with the event's properties and headers and its
    /// W3C `traceparent` when it has one, and wait for the confirms of its group, all within
    /// the subscription's timeout. A connect that fails or times out sent nothing.
    pub async fn publish(
        &self,
        (event, traceparent): (&Claimed, Option<&str>),
        body: Vec<u8>,
    ) -> Answer {
        let started = tokio::time::Instant::now();
        let place = match tokio::time::timeout(self.timeout(), self.place()).await {
            Ok(Ok(place)) => place,
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
        match tokio::time::timeout(left, self.send(place, event, traceparent, body)).await {
            Ok(answer) => answer,
            Err(_) => {
                let error = format!(
                    "no confirm from the broker within {} ms (it may have taken the message)",
                    self.target.timeout_ms
                );
                failed(error, true, "timeout")
            }
        }
    }

    /// A place in the open group, or the first in a new group on an idle or new channel.
    async fn place(&self) -> Result<Place, String> {
        let mut open = self.open.lock().await;
        if let Some(place) = open.as_ref().and_then(Lane::join) {
            return Ok(place);
        }
        let place = Lane::first(self.channel().await?);
        *open = Some(place.lane.clone());
        Ok(place)
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

    async fn send(
        &self,
        mut place: Place,
        event: &Claimed,
        traceparent: Option<&str>,
        body: Vec<u8>,
    ) -> Answer {
        let claim = &event.claim;
        let message_id = webhook_id(&claim.source, &claim.event_id);
        let exchange = self.target.exchange.as_deref().unwrap_or_default();
        let key = template::fill(
            self.target.routing_key.as_deref().unwrap_or_default(),
            &claim.source,
            &event.event_type,
        );
        let at = format!("exchange `{exchange}` with routing key `{key}`");
        if key.len() > MAX_SHORT_STRING {
            let error = format!("the routing key is over {MAX_SHORT_STRING} bytes: {at}");
            if let Some(channel) = place.leave(true, None) {
                self.idle().push(channel);
            }
            return failed(error, false, "not_sent");
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
            .with_message_id(message_id.as_str().into())
            .with_delivery_mode(PERSISTENT)
            .with_content_type(content_type.into())
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = match place
            .lane
            .channel
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
                return failed(error, !unsent, "connection");
            }
        };
        let confirmation = match confirm.await {
            Ok(Confirmation::NotRequested) => {
                let error = format!("the channel is not in confirm mode (publish to {at})");
                return failed(error, true, "connection");
            }
            Ok(confirmation) => confirmation,
            Err(e) => {
                // The broker closes the channel of a publish to an exchange that is not there:
                // nothing was routed. Any other loss may have come after it took the message.
                let missing = matches!(
                    e.kind(),
                    ErrorKind::ProtocolError(p)
                        if *p.kind() == AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)
                );
                let error = format!("no confirm for the publish to {at}: {e}");
                return if missing {
                    failed(error, false, "refused")
                } else {
                    failed(error, true, "connection")
                };
            }
        };
        let (acked, carried) = match &confirmation {
            Confirmation::Ack(carried) => (true, carried.as_ref()),
            Confirmation::Nack(carried) => (false, carried.as_ref()),
            Confirmation::NotRequested => (false, None),
        };
        if let Some(channel) = place.leave(true, carried) {
            self.idle().push(channel);
        }
        match (place.settled(&message_id).await, acked) {
            (Settled::Returned(code, text), _) => failed(
                format!(
                    "the broker returned the message: no queue is bound to {at} ({code} {text})"
                ),
                false,
                "refused",
            ),
            (Settled::Clear, true) => Answer::Delivered(200),
            // A message routed to several queues is nacked when one of them refuses it while
            // the others hold it: it may have been delivered.
            (Settled::Clear, false) => failed(
                format!("the broker nacked the publish to {at}"),
                true,
                "refused",
            ),
            (Settled::Unknown, _) => failed(
                format!(
                    "confirmed, but a publish beside it on its channel got no confirm and may \
                     have taken its return (publish to {at})"
                ),
                true,
                "connection",
            ),
        }
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
