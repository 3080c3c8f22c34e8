//! Delivery: the outbox drained by a lane per conversation.
//!
//! Each outbox item is sent through its channel, retried with exponential backoff (honouring a
//! platform's retry-after) and, once sent, marked with the platform's receipt, so it is never
//! sent again. Replies of one conversation go out in order; a slow or rate-limited chat does
//! not hold up the others. On start, every pending item is queued again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use antler_channel::{Channel, ChannelError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::lanes::Lanes;
use crate::store::{OutboxItem, Store};

/// Retry policy for sends.
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

/// Sends outbox items. Cloning shares it.
#[derive(Clone)]
pub(crate) struct Delivery {
    lanes: Lanes<OutboxItem>,
    channels: Arc<HashMap<String, Arc<dyn Channel>>>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut channels: Vec<&str> = self.channels.keys().map(String::as_str).collect();
        channels.sort_unstable();
        f.debug_struct("Delivery")
            .field("lanes", &self.lanes)
            .field("channels", &channels)
            .finish()
    }
}

impl Delivery {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        channels: HashMap<String, Arc<dyn Channel>>,
        policy: RetryPolicy,
        tracker: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        let channels = Arc::new(channels);
        let lanes = {
            let channels = Arc::clone(&channels);
            let lane_stop = stop.clone();
            Lanes::new(
                move |item: OutboxItem| {
                    let store = Arc::clone(&store);
                    let channels = Arc::clone(&channels);
                    let stop = stop.clone();
                    async move { deliver(store.as_ref(), &channels, policy, &stop, item).await }
                },
                tracker,
                lane_stop,
            )
        };
        Self { lanes, channels }
    }

    /// The enabled channel called `name` (the first segment of a conversation key), e.g. to
    /// fetch a message's attachments through it.
    pub(crate) fn channel(&self, name: &str) -> Option<Arc<dyn Channel>> {
        self.channels.get(name).cloned()
    }

    /// Queues items for delivery, each on its conversation's lane.
    pub(crate) fn enqueue(&self, items: Vec<OutboxItem>) {
        for item in items {
            let key = item.message.conversation.as_str().to_owned();
            self.lanes.push(&key, item);
        }
    }
}

async fn deliver(
    store: &dyn Store,
    channels: &HashMap<String, Arc<dyn Channel>>,
    policy: RetryPolicy,
    stop: &CancellationToken,
    mut item: OutboxItem,
) {
    let channel_name = item.message.conversation.channel().to_owned();
    let Some(channel) = channels.get(&channel_name) else {
        let error = format!("channel `{channel_name}` is not enabled");
        tracing::error!(seq = item.seq, %error, "cannot deliver");
        if let Err(e) = store
            .delivery_failed(item.seq, &error, true, crate::now_ms())
            .await
        {
            tracing::error!(seq = item.seq, error = %e, "cannot record delivery failure");
        }
        return;
    };
    let channel_label = channel.name();
    loop {
        metrics::counter!("antler_delivery_attempts_total", "channel" => channel_label)
            .increment(1);
        let error = match channel.send(&item.message).await {
            Ok(receipt) => {
                if let Err(e) = store.delivered(item.seq, receipt, crate::now_ms()).await {
                    // Sent but not recorded: it may be sent again after a restart.
                    tracing::error!(seq = item.seq, error = %e, "cannot record delivery");
                }
                return;
            }
            Err(error) => error,
        };
        metrics::counter!("antler_delivery_failures_total", "channel" => channel_label)
            .increment(1);
        let attempts = item.attempts + 1;
        let give_up = !error.is_retryable() || attempts >= policy.max_attempts;
        match store
            .delivery_failed(item.seq, &error.to_string(), give_up, crate::now_ms())
            .await
        {
            Ok(updated) => item = updated,
            Err(e) => {
                tracing::error!(seq = item.seq, error = %e, "cannot record delivery failure");
                return;
            }
        }
        if give_up {
            tracing::error!(seq = item.seq, channel = channel_label, attempts, %error, "delivery failed for good");
            metrics::counter!("antler_delivery_abandoned_total", "channel" => channel_label)
                .increment(1);
            return;
        }
        let wait = match error {
            ChannelError::RateLimited { retry_after } => retry_after.max(policy.backoff(attempts)),
            _ => policy.backoff(attempts),
        };
        tracing::warn!(seq = item.seq, channel = channel_label, attempts, ?wait, %error, "delivery failed; retrying");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            // Still pending in the store: delivered after the restart.
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests;
