//! Telegram's polling mode: a `getUpdates` loop feeding the same pipeline as the webhook, for
//! machines without a public URL; the reader of Discord's Gateway (`gateway = true`); and
//! Feishu's long connection (`mode = "websocket"`).
//!
//! An update is confirmed to Telegram only by the next call, with a higher offset, and that
//! call is made only after every event of the batch was accepted (stored and synced). A crash
//! in between makes Telegram send the batch again after the restart; the inbox's dedupe on
//! `update_id` recognises it, so nothing is skipped and nothing is answered twice, without an
//! offset of antler's own to keep.
//!
//! Feishu's long connection works the same way: an event's frame is answered (code 200) only
//! after its events were accepted; unanswered, Feishu delivers it again, and the inbox's dedupe
//! on the message_id recognises it.

use std::sync::Arc;
use std::time::Duration;

use antler_channel::{ChannelError, ChatMove, Parsed};
use antler_feishu::{Delivery, FeishuChannel, FeishuSocket, SocketConfig};
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

/// Holds Feishu's long connection until `stop` is cancelled: connects (endpoint, then socket),
/// accepts each event and answers its frame, and reconnects when the connection ends. The
/// first reconnection waits a random time within the server's `ReconnectNonce`; failed
/// attempts back off up to its `ReconnectInterval`, at most `ReconnectCount` of them when that
/// is not negative. A refusal retrying will not fix (credentials, not an internal app, too
/// many connections) ends it, as it ends the SDKs' client.
pub(crate) async fn read_feishu_socket(
    channel: Arc<FeishuChannel>,
    ingress: Ingress,
    stop: CancellationToken,
) {
    let mut config = SocketConfig::default();
    let mut failures: u32 = 0;
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = open_feishu_socket(&channel) => connected,
        };
        let mut socket = match connected {
            Ok(socket) => socket,
            Err(e) if !e.is_retryable() => {
                tracing::error!(error = %e, "feishu long connection refused; no more attempts (see `antler doctor`)");
                metrics::counter!("antler_feishu_socket_refused_total").increment(1);
                return;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                metrics::counter!("antler_feishu_socket_errors_total").increment(1);
                if u32::try_from(config.reconnect_count).is_ok_and(|most| failures >= most) {
                    tracing::error!(error = %e, attempts = failures, "feishu long connection: giving up, as the server's ReconnectCount says");
                    return;
                }
                wait = RetryPolicy::forever(Duration::from_secs(1), config.reconnect_interval)
                    .backoff(failures);
                tracing::warn!(error = %e, retry_in = ?wait, "feishu long connection failed");
                continue;
            }
        };
        failures = 0;
        tracing::info!(device_id = %socket.device_id, "feishu long connection open");
        loop {
            let delivery = tokio::select! {
                () = stop.cancelled() => None,
                delivery = socket.next() => delivery,
            };
            let Some(delivery) = delivery else { break };
            if !answer_feishu(&channel, &ingress, delivery).await {
                break;
            }
        }
        config = socket.config();
        socket.close().await;
        if stop.is_cancelled() {
            return;
        }
        // As the SDKs: a random wait first, so that a fleet does not come back all at once.
        wait = config.reconnect_nonce.mul_f64(fastrand::f64());
        tracing::info!(retry_in = ?wait, "feishu long connection ended; reconnecting");
    }
}

/// Asks where to connect, then connects.
async fn open_feishu_socket(channel: &FeishuChannel) -> Result<FeishuSocket, ChannelError> {
    FeishuSocket::connect(channel.api().socket_endpoint().await?).await
}

/// Reads one event of the long connection as the webhook reads its body, accepts what it
/// holds and answers the frame as the webhook answers: 200 once accepted (stored and synced),
/// or when there is nothing to take; 500 when it should come again, where the webhook answers
/// 503 (the bot's identity is not known yet, the backlog is full, the store failed). `false`
/// once antler stops (the frame unanswered: Feishu delivers it again).
async fn answer_feishu(channel: &FeishuChannel, ingress: &Ingress, delivery: Delivery) -> bool {
    let parsed = serde_json::from_slice(&delivery.payload)
        .map_err(|_| ChannelError::Malformed("not JSON".to_owned()))
        .and_then(|event| channel.parse_json(&event));
    let code = match parsed {
        Ok(Parsed::Events(events)) => {
            let mut code = 200;
            for event in events {
                match ingress.accept(event, false).await {
                    Ok(_) | Err(IngressError::Dropped) => {}
                    Err(IngressError::ShuttingDown) => return false,
                    Err(e) => {
                        tracing::warn!(error = %e, "a feishu event could not be accepted; Feishu delivers it again");
                        metrics::counter!("antler_feishu_socket_refused_events_total").increment(1);
                        code = 500;
                        break;
                    }
                }
            }
            code
        }
        Ok(_) => 200,
        Err(ChannelError::Transient(e)) => {
            tracing::warn!(error = %e, "a feishu event waits for the bot's identity");
            metrics::counter!("antler_feishu_socket_deferred_total").increment(1);
            500
        }
        Err(e) => {
            // Another delivery of it would be the same: answered, so it is not sent again.
            tracing::warn!(error = %e, "a feishu long connection payload is not an event");
            200
        }
    };
    delivery.answer(code);
    true
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
                tracing::warn!(error = %e, retry_in = ?wait, "a polled event could not be accepted");
                tokio::select! {
                    () = stop.cancelled() => return false,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}
