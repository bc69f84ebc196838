//! Exponential backoff with jitter: base × 2^(n-1), capped, then a random point in its upper
//! half, so that events that failed together do not all come back together. One rule for
//! every claimer (the consumer workers, the forwarders, the pull routes).

use rand::Rng;

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    base_ms: u64,
    max_ms: u64,
}

impl Backoff {
    pub fn new(base_ms: u64, max_ms: u64) -> Backoff {
        Backoff { base_ms, max_ms }
    }

    /// The ceiling for the `attempt`-th retry (1-based), before jitter.
    pub fn ceiling_ms(&self, attempt: i64) -> u64 {
        let exp = attempt.clamp(1, 63) as u32 - 1;
        self.base_ms
            .saturating_mul(1u64.checked_shl(exp).unwrap_or(u64::MAX))
            .min(self.max_ms)
    }

    pub fn delay_ms(&self, attempt: i64) -> i64 {
        let ceiling = self.ceiling_ms(attempt);
        let low = ceiling / 2;
        let jittered = if ceiling > low {
            rand::rng().random_range(low..=ceiling)
        } else {
            ceiling
        };
        i64::try_from(jittered).unwrap_or(i64::MAX)
    }

    /// Where a retryable failure leaves its event, the same for every kind of consumer: failed
    /// once `budget_used` claims have spent `max_attempts`, else pending again after the backoff
    /// (or after `retry_after_ms`, when the other side asked for longer).
    pub fn retry_or_give_up(
        &self,
        budget_used: i64,
        max_attempts: u32,
        error: String,
        retry_after_ms: Option<i64>,
        now: i64,
    ) -> crate::store::Next {
        if budget_used >= i64::from(max_attempts) {
            return crate::store::Next::Fail {
                error: format!("{error} (gave up after {budget_used} attempts)"),
                result: crate::store::AttemptResult::RetryableError,
                abandoned: false,
            };
        }
        let backoff = self.delay_ms(budget_used);
        crate::store::Next::Retry {
            at: now + backoff.max(retry_after_ms.unwrap_or(0)),
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_then_caps() {
        let b = Backoff::new(1000, 3_600_000);
        assert_eq!(b.ceiling_ms(1), 1000);
        assert_eq!(b.ceiling_ms(2), 2000);
        assert_eq!(b.ceiling_ms(5), 16_000);
        assert_eq!(b.ceiling_ms(40), 3_600_000);
        assert_eq!(b.ceiling_ms(1000), 3_600_000);
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let b = Backoff::new(1000, 3_600_000);
        for attempt in 1..20 {
            let ceiling = b.ceiling_ms(attempt) as i64;
            for _ in 0..50 {
                let d = b.delay_ms(attempt);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "{d} outside [{}, {ceiling}]",
                    ceiling / 2
                );
            }
        }
    }
}
