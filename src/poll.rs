//! Telegram's polling mode: a `getUpdates` loop feeding the same pipeline as the webhook, for
//! machines without a public URL; and the reader of Discord's Gateway (`gateway = true`).
//!
//! An update is confirmed to Telegram only by the next call, with a higher offset, and that
//! call is made only after every event of the batch was accepted (stored and synced). A crash
//! in between makes Telegram send the batch again after the restart; the inbox's dedupe on
//! `update_id` recognises it, so nothing is skipped and nothing is answered twice, without an
//! offset of antler's own to keep.

use std::sync::Arc;
use std::time::Duration;

use antler_channel::{ChannelError, ChatMove, Parsed};
use antler_telegram::TelegramChannel;
use tokio_util::sync::CancellationToken;

use crate::ingress::{Ingress, IngressError};
use crate::retry::{Backoff, RetryPolicy};

/// How long one `getUpdates` waits for an update (below teloxide's 17 s request timeout).
const LONG_POLL_SECS: u32 = 10;
/// The waits after a failed `getUpdates` (or accept): from 1 s up to 60 s.
const POLL_RETRY: RetryPolicy =
    RetryPolicy::forever(Duration::from_secs(1), Duration::from_secs(60));

/// Polls until `stop` is cancelled.
pub(crate) async fn poll_telegram(
    channel: Arc<TelegramChannel>,
    ingress: Ingress,
    stop: CancellationToken,
) {
    let mut offset: Option<i32> = None;
    let mut backoff = Backoff::new(POLL_RETRY);
    tracing::info!("telegram polling started");
    loop {
        let fetched = tokio::select! {
            () = stop.cancelled() => return,
            fetched = channel.api().get_updates(offset, LONG_POLL_SECS) => fetched,
        };
        let updates = match fetched {
            Ok(updates) => {
                backoff.reset();
                updates
            }
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_in = ?wait, "telegram getUpdates failed");
                metrics::counter!("antler_telegram_poll_errors_total").increment(1);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                continue;
            }
        };
        for update in updates {
            match channel.parse_json(&update) {
                Ok(Parsed::Events(events)) => {
                    for event in events {
                        if !accept(&ingress, event, &stop).await {
                            return;
                        }
                    }
                }
                Ok(Parsed::Moved(chat_move)) => {
                    if !move_chat(&ingress, &chat_move, &stop).await {
                        return;
                    }
                }
                Ok(_) => {}
                Err(ChannelError::Transient(e)) => {
                    // It may be for the bot, whose username is not known yet: not confirmed,
                    // so the next getUpdates (after a wait) returns it again.
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, retry_in = ?wait, "a polled telegram update waits for the bot's identity");
                    metrics::counter!("antler_telegram_poll_deferred_total").increment(1);
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "a polled telegram update is not one"),
            }
            // Confirmed to Telegram by the next call.
            if let Some(id) = update
                .get("update_id")
                .and_then(serde_json::Value::as_i64)
                .and_then(|id| i32::try_from(id).ok())
            {
                offset = Some(id.saturating_add(1));
            }
        }
    }
}

/// Accepts what Discord's Gateway receives until `stop` is cancelled, then closes it. A
/// message Discord replays after a reconnect is recognised by the inbox's dedupe (its id).
pub(crate) async fn read_discord_gateway(
    mut gateway: antler_discord::DiscordGateway,
    ingress: Ingress,
    stop: CancellationToken,
) {
    tracing::info!("discord gateway started");
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => break,
            event = gateway.events.recv() => event,
        };
        let Some(event) = event else { break };
        if !accept(&ingress, event, &stop).await {
            break;
        }
    }
    gateway.stop().await;
}

/// Moves a chat's conversation ([`Ingress::move_chat`]), retrying while the store fails;
/// `false` once antler stops.
async fn move_chat(ingress: &Ingress, chat_move: &ChatMove, stop: &CancellationToken) -> bool {
    let mut backoff = Backoff::new(POLL_RETRY);
    loop {
        match ingress.move_chat(chat_move).await {
            Ok(()) => return true,
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_in = ?wait, "a chat's move could not be recorded");
                tokio::select! {
                    () = stop.cancelled() => return false,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Accepts one event, retrying while the store fails; `false` once antler stops.
async fn accept(
    ingress: &Ingress,
    event: antler_channel::InboundEvent,
    stop: &CancellationToken,
) -> bool {
    let mut backoff = Backoff::new(POLL_RETRY);
    loop {
        match ingress.accept(event.clone(), false).await {
            Ok(_) | Err(IngressError::Dropped) => return true,
            Err(IngressError::ShuttingDown) => return false,
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_in = ?wait, "a polled telegram update could not be accepted");
                tokio::select! {
                    () = stop.cancelled() => return false,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}
