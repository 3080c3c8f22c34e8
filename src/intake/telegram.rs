//! Telegram's polling mode (`channels.telegram.mode = "polling"`): a `getUpdates` loop.

use std::sync::Arc;

use antler_channel::{ChannelError, ChatMove, Parsed};
use antler_telegram::TelegramChannel;
use tokio_util::sync::CancellationToken;

use super::{INTAKE_RETRY, accept};
use crate::ingress::Ingress;
use crate::retry::Backoff;

/// How long one `getUpdates` waits for an update (below teloxide's 17 s request timeout).
const LONG_POLL_SECS: u32 = 10;

/// Polls until `stop` is cancelled.
pub(crate) async fn poll_telegram(
    channel: Arc<TelegramChannel>,
    ingress: Ingress,
    stop: CancellationToken,
) {
    let mut offset: Option<i32> = None;
    let mut backoff = Backoff::new(INTAKE_RETRY);
    let health = ingress.health().clone();
    tracing::info!("telegram polling started");
    loop {
        let fetched = tokio::select! {
            () = stop.cancelled() => return,
            fetched = channel.api().get_updates(offset, LONG_POLL_SECS) => fetched,
        };
        let updates = match fetched {
            Ok(updates) => {
                backoff.reset();
                health.connection("telegram", "connected");
                updates
            }
            Err(e) => {
                health.failed("telegram", &e);
                health.connection("telegram", "reconnecting");
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
                Ok(Parsed::Press(press)) => {
                    // Answered through the Bot API; a failure to decide is told to the presser.
                    ingress.press(channel.as_ref(), &press).await;
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

/// Moves a chat's conversation ([`Ingress::move_chat`]), retrying while the store fails;
/// `false` once antler stops.
async fn move_chat(ingress: &Ingress, chat_move: &ChatMove, stop: &CancellationToken) -> bool {
    let mut backoff = Backoff::new(INTAKE_RETRY);
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
