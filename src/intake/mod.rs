//! Intake that antler reaches out for, for machines without a public URL: Telegram's polling
//! mode, Discord's Gateway, Slack's Socket Mode and Feishu's long connection. Each feeds the
//! same ingress as the webhooks, and tells the platform it has a message only once the
//! ingress accepted it (stored and synced).
//!
//! - Telegram: an update is confirmed only by the next `getUpdates`, with a higher offset,
//!   made only after every event of the batch was accepted. A crash in between makes Telegram
//!   send the batch again after the restart; the inbox's dedupe on `update_id` recognises it,
//!   so nothing is skipped and nothing is answered twice, without an offset of antler's own.
//! - Slack: an envelope is acknowledged only after its events were accepted, with what the
//!   webhook would have answered (a slash command's immediate reply). One that could not be
//!   accepted is not acknowledged, so Slack delivers it again (`retry_attempt`), as after a
//!   webhook's 5xx; the inbox's dedupe answers a redelivery once.
//! - Feishu: an event's frame is answered (code 200) only after its events were accepted;
//!   unanswered, Feishu delivers it again, and the inbox's dedupe on the message id
//!   recognises it.
//! - Discord: a message the Gateway replays after a reconnect is recognised by its id.

mod discord;
mod feishu;
mod slack;
mod telegram;

pub(crate) use discord::read_discord_gateway;
pub(crate) use feishu::read_feishu_socket;
pub(crate) use slack::read_slack_socket;
pub(crate) use telegram::poll_telegram;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ingress::{Ingress, IngressError};
use crate::retry::{Backoff, RetryPolicy};

/// The waits after a failed read (or accept): from 1 s up to 60 s.
const INTAKE_RETRY: RetryPolicy =
    RetryPolicy::forever(Duration::from_secs(1), Duration::from_secs(60));

/// Accepts one event, retrying while the store fails; `false` once antler stops.
pub(super) async fn accept(
    ingress: &Ingress,
    event: antler_channel::InboundEvent,
    stop: &CancellationToken,
) -> bool {
    let mut backoff = Backoff::new(INTAKE_RETRY);
    loop {
        match ingress.accept(event.clone(), false).await {
            Ok(_) | Err(IngressError::Dropped) => return true,
            Err(IngressError::ShuttingDown) => return false,
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_in = ?wait, "a polled event could not be accepted");
                tokio::select! {
                    () = stop.cancelled() => return false,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}
