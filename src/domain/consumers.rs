//! The node's `[consumers]` table: how its workers claim, and the rules (attempts, backoff)
//! a subscription takes when it sets none. Here, not in `config`, because the subscriptions'
//! validation and the consumer read these defaults too, and `config` reads the subscriptions.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerSettings {
    /// Worker tasks claiming events; 0 runs only the HTTP side.
    pub workers: usize,
    /// Most events one claim statement takes.
    pub batch_size: usize,
    /// How long a claim is exclusive before the sweeper may take it back.
    pub lease_seconds: u64,
    /// Claims an event may use before it is `failed`.
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        ConsumerSettings {
            workers: 4,
            batch_size: 256,
            lease_seconds: 30,
            max_attempts: 15,
            backoff_base_ms: 1000,
            backoff_max_ms: 3_600_000,
        }
    }
}

/// The longest backoff that can be set (30 days): it keeps the arithmetic on these settings
/// far from overflow.
pub const MAX_BACKOFF_MS: u64 = 30 * 86_400_000;

impl ConsumerSettings {
    /// The lease in milliseconds (`lease_seconds` is bounded by validation).
    pub fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease_seconds.saturating_mul(1000)).unwrap_or(i64::MAX)
    }
}
