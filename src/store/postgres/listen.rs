//! Wake-ups across nodes: a commit that queued work sends `NOTIFY webhook_inbox_queued`, and
//! each node that consumes runs one dedicated connection that `LISTEN`s and wakes its idle
//! workers. A notification can be missed (the listener reconnecting, a server restart): the
//! workers' polling stays the fallback, and the listener wakes them once after each
//! reconnection for the same reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use tokio::sync::Notify;

use super::QUEUED_CHANNEL;

/// How long one wait for a notification lasts before the stop flag is looked at again.
const TICK: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Start the listener thread; it ends soon after `stopping` turns true.
pub(super) fn start(config: super::session::Connect, wake: Arc<Notify>, stopping: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("pg-listen".into())
        .spawn(move || run(&config, &wake, &stopping));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no LISTEN thread: idle consumers rely on polling");
    }
}

fn run(config: &super::session::Connect, wake: &Notify, stopping: &AtomicBool) {
    let mut backoff = Duration::from_millis(100);
    while !stopping.load(Ordering::SeqCst) {
        match listen(config, wake, stopping) {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "LISTEN connection lost");
            }
        }
        // Sleep in ticks, so that a store dropped meanwhile stops the thread soon.
        let mut slept = Duration::ZERO;
        while slept < backoff && !stopping.load(Ordering::SeqCst) {
            std::thread::sleep(TICK.min(backoff - slept));
            slept += TICK;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection's life: `Ok` when told to stop, `Err` when the connection failed.
fn listen(
    config: &super::session::Connect,
    wake: &Notify,
    stopping: &AtomicBool,
) -> Result<(), postgres::Error> {
    let mut client = config.connect()?;
    client.batch_execute(&format!("LISTEN {QUEUED_CHANNEL}"))?;
    tracing::debug!("listening for queued work");
    // Anything queued while this connection was down went unheard.
    wake.notify_waiters();
    while !stopping.load(Ordering::SeqCst) {
        // One notification per committed transaction that queued work (the server folds
        // a transaction's copies into one): each wakes the idle workers at once.
        if client.notifications().timeout_iter(TICK).next()?.is_some() {
            wake.notify_waiters();
            continue;
        }
        // A closed connection only shows when it is used: a timed-out wait says nothing.
        if client.is_closed() {
            client.simple_query("")?;
        }
    }
    Ok(())
}
