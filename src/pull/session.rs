//! A `listen` session's liveness (origin `session`, SPEC section 13): each claim says the
//! session is alive (`Store::session_seen`), at most once per [`EVERY`] per session on a node,
//! so that a client's claims cost no extra write each; the heartbeat removes a session not seen
//! for `session_idle_seconds`.

use std::time::{Duration, Instant};

/// The most often one node records that a session claimed.
pub const EVERY: Duration = Duration::from_secs(10);

/// When this node last recorded a session's claim.
#[derive(Debug, Default)]
pub struct Seen {
    last: parking_lot::Mutex<Option<Instant>>,
}

impl Seen {
    /// Whether a claim now is to be recorded (and, if so, it counts as recorded).
    pub fn due(&self) -> bool {
        let mut last = self.last.lock();
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_session_is_recorded_once_per_interval() {
        let seen = super::Seen::default();
        assert!(seen.due());
        assert!(!seen.due());
        assert!(!seen.due());
    }
}
