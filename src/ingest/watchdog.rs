//! The writer's watchdog: one thread that answers 503 in place of a stuck writer, instead of a
//! timer per delivery. A commit that has run for the backstop is given up on: its deliveries
//! (whose deadlines came after it started) get their 503 by their deadline plus the backstop,
//! as when each caller gave up on its own timer, and so do the deliveries queued behind it,
//! for as long as it runs. A commit shorter than that is waited for: the store bounds its wait
//! for the write lock, and the writer answers 503 to a queued delivery past its deadline.

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::{IngestError, Shared, lock};

/// How often the watchdog looks: a stuck writer's callers get their 503 up to this early.
const TICK: Duration = Duration::from_millis(100);

pub(super) fn start(shared: Weak<Shared>, backstop: Duration) {
    let tick = TICK.min(backstop / 2).max(Duration::from_millis(1));
    std::thread::Builder::new()
        .name("ingest-watchdog".into())
        .spawn(move || {
            // Ends with the writer, which holds the only strong reference.
            while let Some(shared) = shared.upgrade() {
                look(&shared, Instant::now(), backstop.saturating_sub(tick));
                drop(shared);
                std::thread::sleep(tick);
            }
        })
        .expect("spawning the ingest watchdog thread");
}

fn look(shared: &Shared, now: Instant, stuck: Duration) {
    let mut writing = lock(&shared.writing);
    if writing
        .since
        .is_none_or(|since| now.saturating_duration_since(since) < stuck)
    {
        return;
    }
    for reply in writing.replies.drain(..) {
        let _ = reply.send(Err(IngestError::Timeout));
    }
    // The writer holds the queue only between commits, and it is in one: never waited on.
    if let Ok(queue) = shared.jobs.try_lock() {
        for job in queue.try_iter() {
            let _ = job.reply.send(Err(IngestError::Timeout));
        }
    }
}
