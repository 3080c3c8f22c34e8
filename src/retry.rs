//! How antler tries again: [`RetryPolicy`] (attempts and exponential backoff with jitter) and
//! [`Backoff`], the growing waits of one run of failures. A leaf every module may use: the
//! gateway (delivery's sends, attachment downloads, Telegram polling, the bots' identity, the
//! turn runner's store retries) and the runtime (model calls, MCP server restarts, the memory
//! updater) back off the same way.

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
    /// Tries for as long as it takes, waiting from `base` up to `max`.
    pub(crate) const fn forever(base: Duration, max: Duration) -> Self {
        Self {
            max_attempts: u32::MAX,
            backoff_base: base,
            backoff_max: max,
        }
    }

    /// The wait before attempt `attempt + 1` (attempt counts from 1): exponential with full
    /// jitter in its upper half, never more than the cap. Half fixed, half random, so that
    /// parallel clients spread out but still back off.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let exponential = self
            .backoff_base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.backoff_max);
        let half = exponential / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// The waits of one run of failures under a policy: each longer than the last (up to the
/// cap), back to the shortest after a success.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    policy: RetryPolicy,
    failures: u32,
}

impl Backoff {
    pub(crate) const fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            failures: 0,
        }
    }

    /// Counts a failure; the wait before trying again.
    pub(crate) fn next_wait(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.backoff(self.failures)
    }

    /// After a success: the next failure waits the shortest again.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_to_the_cap_and_start_over_after_a_success() {
        let mut backoff = Backoff::new(RetryPolicy::forever(
            Duration::from_millis(100),
            Duration::from_millis(800),
        ));
        let ms = Duration::from_millis;
        let waits: Vec<Duration> = (0..6).map(|_| backoff.next_wait()).collect();
        let bounds = [
            (50, 100),
            (100, 200),
            (200, 400),
            (400, 800),
            (400, 800),
            (400, 800),
        ];
        for (wait, (low, high)) in waits.iter().zip(bounds) {
            assert!(
                (ms(low)..=ms(high)).contains(wait),
                "{wait:?} not in {low}..={high} ms"
            );
        }
        backoff.reset();
        assert!(backoff.next_wait() <= ms(100));
    }
}
