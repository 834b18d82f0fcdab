//! Backoff for requests that are safe to repeat.

use std::time::Duration;

use rand::RngExt;

/// How a safe request is retried after a transient failure.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, the first included (1 disables retries).
    pub max_attempts: u32,
    /// Delay before the first retry (before jitter); doubles each time.
    pub base_delay: Duration,
    /// Longest delay between tries.
    pub max_delay: Duration,
}

/// Default: 6 tries, 100 ms doubling to at most 5 s (about 10 s in all).
pub const DEFAULT_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 6,
    base_delay: Duration::from_millis(100),
    max_delay: Duration::from_secs(5),
};

impl Default for RetryPolicy {
    fn default() -> Self {
        DEFAULT_RETRY
    }
}

impl RetryPolicy {
    /// Never retry.
    pub const NONE: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
    };

    /// Delay before retry number `retry` (1-based): exponential with full
    /// jitter, but never below what the server asked for.
    pub fn delay(&self, retry: u32, server_asked: Option<Duration>) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
            .min(self.max_delay);
        let jittered = exp.mul_f64(rand::rng().random_range(0.0..=1.0));
        jittered.max(server_asked.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_are_capped_and_honour_retry_after() {
        let p = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for retry in 1..10 {
            assert!(p.delay(retry, None) <= Duration::from_secs(1));
        }
        assert!(p.delay(1, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
    }
}
