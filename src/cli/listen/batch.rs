//! The loop: claim a batch, forward its events one at a time, ack each as its call ends.
//!
//! Leases cover calls (SPEC section 4): a batch is forwarded one call after another, so before
//! each call the claims still waiting are extended whenever their lease would not cover that
//! call's whole timeout and its ack. A slow endpoint therefore gets each event once, however
//! large the batch.
//!
//! When the endpoint refuses connections, nothing was sent: the batch is given back
//! (`release`: pending and due now, never failed for it) and no more is claimed until a TCP
//! connect succeeds, probed with a bounded exponential backoff, so that an outage of any length
//! costs each event at most the one attempt its claim counted. A long poll that fails or is cut is retried the
//! same way. On Ctrl-C the claims not started are given back; a call in flight may have reached
//! the endpoint, so it is left to its lease.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::endpoint::{Called, Endpoint};
use super::server::{Claim, Server};
use crate::cli::client::CliError;

/// How long a long poll waits for work.
const WAIT: Duration = Duration::from_secs(20);
/// A claim's lease starts on the server before its answer arrives here: taken off its end.
const SLACK: Duration = Duration::from_secs(1);
/// After a call ends, its ack must still find the lease held.
const ACK_ROOM: Duration = Duration::from_secs(1);

const STOPPED: &str = "stopped: unforwarded claims given back";
/// A call in flight may have reached the endpoint: releasing it could deliver it twice at once.
const STOPPED_IN_CALL: &str =
    "stopped: unforwarded claims given back; the call in flight is left to its lease";

pub(super) struct Listener {
    server: Server,
    endpoint: Endpoint,
    batch: u64,
    /// Asked at each claim and extend: two calls and the margins, so that a slow endpoint
    /// costs an extend every other call, and a listener that dies holds its events briefly.
    lease: Duration,
}

/// How a batch ended.
enum Ended {
    /// Every claim forwarded, acked or left to its lease: claim again.
    Done,
    /// The endpoint refused a connection (the cause): wait until it accepts one.
    EndpointDown(String),
    /// Ctrl-C.
    Stopped,
}

/// A bounded exponential backoff.
struct Backoff {
    first: Duration,
    next: Duration,
    max: Duration,
}

impl Backoff {
    fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            next: first,
            max,
        }
    }

    fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}

impl Listener {
    pub fn new(server: Server, endpoint: Endpoint, batch: u64) -> Listener {
        let lease = endpoint.timeout * 2 + SLACK + ACK_ROOM;
        Listener {
            server,
            endpoint,
            batch,
            lease,
        }
    }

    pub async fn run(self, stop: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        tokio::pin!(stop);
        let mut server_backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut endpoint_backoff =
            Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
        loop {
            let claimed = tokio::select! {
                c = self.server.claim(self.batch, self.lease, WAIT) => c,
                () = &mut stop => return Ok(()),
            };
            let arrived = Instant::now();
            let claims = match claimed {
                Ok(claims) => claims,
                Err(CliError::Unreachable(e)) => {
                    let wait = server_backoff.step();
                    eprintln!("{e}; trying again in {wait:?}");
                    if pause(wait, &mut stop).await {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            server_backoff.reset();
            match self.forward(claims, arrived, &mut stop).await {
                Ended::Done => endpoint_backoff.reset(),
                Ended::Stopped => return Ok(()),
                Ended::EndpointDown(cause) => loop {
                    let wait = endpoint_backoff.step();
                    eprintln!(
                        "{} refused the connection ({cause}): its events are given back; \
                         trying it again in {wait:?}",
                        self.endpoint.url()
                    );
                    if pause(wait, &mut stop).await {
                        return Ok(());
                    }
                    if self.endpoint.accepts().await {
                        break;
                    }
                },
            }
        }
    }

    /// One batch, a call at a time, each under a lease that covers it.
    async fn forward(
        &self,
        claims: Vec<Claim>,
        arrived: Instant,
        stop: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> Ended {
        let mut waiting: VecDeque<Claim> = claims.into();
        let mut held_until = arrived + self.lease - SLACK;
        while let Some(claim) = waiting.front() {
            if held_until < Instant::now() + self.endpoint.timeout + ACK_ROOM {
                let sent = Instant::now();
                let tokens = waiting.iter().map(|c| c.token.as_str()).collect();
                let extended = tokio::select! {
                    e = self.server.extend(tokens, self.lease) => e,
                    () = stop.as_mut() => {
                        self.release(waiting.iter(), STOPPED).await;
                        return Ended::Stopped;
                    }
                };
                match extended {
                    Ok(lost) => {
                        // The server's lease starts after `sent`.
                        held_until = sent + self.lease;
                        for c in waiting.iter().filter(|c| lost.contains(&c.token)) {
                            eprintln!(
                                "{}  {}: lease lost before its call; not forwarded, it comes again",
                                c.source, c.event_id
                            );
                        }
                        waiting.retain(|c| !lost.contains(&c.token));
                        continue;
                    }
                    Err(e) => {
                        eprintln!(
                            "could not extend the leases ({e}): the batch's {} events left come \
                             again when their leases end",
                            waiting.len()
                        );
                        return Ended::Done;
                    }
                }
            }
            let called = tokio::select! {
                c = self.endpoint.forward(claim) => c,
                () = stop.as_mut() => {
                    self.release(waiting.iter().skip(1), STOPPED_IN_CALL).await;
                    return Ended::Stopped;
                }
            };
            match called {
                Called::Ack(result) => {
                    self.ack(vec![result]).await;
                    waiting.pop_front();
                }
                Called::NotSent(cause) => {
                    self.release(waiting.iter(), "").await;
                    return Ended::EndpointDown(cause);
                }
            }
        }
        Ended::Done
    }

    /// Give back claims never started: pending and due now, with no retry backoff.
    async fn release(&self, claims: impl Iterator<Item = &Claim>, said: &str) {
        let results: Vec<Value> = claims
            .map(|c| json!({"token": c.token, "outcome": "release"}))
            .collect();
        if !results.is_empty() {
            self.ack(results).await;
        }
        if !said.is_empty() {
            eprintln!("{said}");
        }
    }

    async fn ack(&self, results: Vec<Value>) {
        match self.server.ack(results).await {
            Ok(lost) if lost.is_empty() => {}
            Ok(lost) => eprintln!(
                "{} acks came after their lease ended: those events come again",
                lost.len()
            ),
            Err(e) => eprintln!("could not ack ({e}): the events come again when their leases end"),
        }
    }
}

/// Sleep `wait`, or until `stop`: whether it stopped.
async fn pause(
    wait: Duration,
    stop: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> bool {
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        () = stop.as_mut() => true,
    }
}
