//! The wall clock the scheduler reads, and how it waits for a time on it. The system clock
//! is read again at least every [`MAX_NAP`], so a clock set forward or a machine waking from
//! suspend is noticed within that; tests move a [`ManualClock`] by hand.

use std::time::Duration;

/// The longest the system clock is trusted without reading it again.
pub(crate) const MAX_NAP: Duration = Duration::from_secs(30);

/// A wall clock.
#[async_trait::async_trait]
pub(crate) trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Waits until the clock reads `wall_ms` or later, or a while less: the caller reads the
    /// clock again after it returns.
    async fn sleep_until(&self, wall_ms: u64);
}

/// The system's clock, waited on with tokio's timers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemClock;

#[async_trait::async_trait]
impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        crate::now_ms()
    }

    async fn sleep_until(&self, wall_ms: u64) {
        let wait = Duration::from_millis(wall_ms.saturating_sub(self.now_ms()));
        tokio::time::sleep(wait.min(MAX_NAP)).await;
    }
}

/// A clock that moves only when told (tests).
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct ManualClock(std::sync::Arc<tokio::sync::watch::Sender<u64>>);

#[cfg(test)]
impl ManualClock {
    pub(crate) fn new(now_ms: u64) -> Self {
        Self(std::sync::Arc::new(tokio::sync::watch::Sender::new(now_ms)))
    }

    /// Sets the time; whoever waits for it wakes up.
    pub(crate) fn set(&self, now_ms: u64) {
        self.0.send_replace(now_ms);
    }
}

#[cfg(test)]
#[async_trait::async_trait]
impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        *self.0.borrow()
    }

    async fn sleep_until(&self, wall_ms: u64) {
        let mut time = self.0.subscribe();
        let _ = time.wait_for(|now| *now >= wall_ms).await;
    }
}
