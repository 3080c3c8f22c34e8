//! [`RetryPolicy`]: attempts and exponential backoff, shared by the gateway (delivery's sends,
//! attachment downloads) and the runtime (MCP server restarts), so it lives here, below both.

use std::time::Duration;

/// How often to try something again, and how long to wait before each new attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// Attempts in all, the first included.
    pub(crate) max_attempts: u32,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1` (attempt counts from 1): exponential with full
    /// jitter in its upper half, never more than the cap.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let exponential = self
            .backoff_base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.backoff_max);
        let half = exponential / 2;
        half + half.mul_f64(fastrand::f64())
    }
}
