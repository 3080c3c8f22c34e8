//! Telegram's polling mode: a `getUpdates` loop feeding the same pipeline as the webhook, for
//! machines without a public URL; the reader of Discord's Gateway (`gateway = true`); and
//! Slack's Socket Mode (`channels.slack.mode = "socket"`).
//!
//! An update is confirmed to Telegram only by the next call, with a higher offset, and that
//! call is made only after every event of the batch was accepted (stored and synced). A crash
//! in between makes Telegram send the batch again after the restart; the inbox's dedupe on
//! `update_id` recognises it, so nothing is skipped and nothing is answered twice, without an
//! offset of antler's own to keep.
//!
//! A Slack envelope is acknowledged likewise only after its events were accepted, and with
//! what the webhook would have answered (a slash command's immediate reply). One that could
//! not be accepted is not acknowledged, so Slack delivers it again (`retry_attempt`), as it
//! does after a webhook's 5xx; the inbox's dedupe answers a redelivery once.

use std::sync::Arc;
use std::time::Duration;

use antler_channel::{Channel, ChannelError, Parsed};
use antler_slack::{Envelope, Frame, SlackChannel, SlackSocket, SocketConnection};
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

/// Holds Slack's Socket Mode connection until `stop` is cancelled: one connection, opened
/// again when Slack asks (`disconnect`) or it fails (after a backoff).
pub(crate) async fn read_slack_socket(
    channel: Arc<SlackChannel>,
    socket: SlackSocket,
    ingress: Ingress,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(POLL_RETRY);
    tracing::info!("slack socket mode started");
    loop {
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = socket.connect() => connected,
        };
        let ended = match connected {
            Ok(mut connection) => {
                backoff.reset();
                tracing::info!("slack socket mode connected");
                let ended = serve_slack_socket(&channel, &mut connection, &ingress, &stop).await;
                connection.close().await;
                ended
            }
            Err(e) => Err(e),
        };
        match ended {
            Ok(SocketEnd::Stopped) => return,
            Ok(SocketEnd::Reconnect(reason)) => {
                tracing::info!(%reason, "slack asked for a new socket mode connection");
            }
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_in = ?wait, "slack socket mode connection failed");
                metrics::counter!("antler_slack_socket_errors_total").increment(1);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Why a Socket Mode connection was left.
enum SocketEnd {
    Stopped,
    /// Slack's `disconnect`, with its reason.
    Reconnect(String),
}

/// Answers envelopes on `connection` until it ends, Slack asks for another, or antler stops.
async fn serve_slack_socket(
    channel: &SlackChannel,
    connection: &mut SocketConnection,
    ingress: &Ingress,
    stop: &CancellationToken,
) -> Result<SocketEnd, antler_slack::SocketError> {
    loop {
        let frame = tokio::select! {
            () = stop.cancelled() => return Ok(SocketEnd::Stopped),
            frame = connection.next() => frame?,
        };
        let envelope = match frame {
            Frame::Envelope(envelope) => envelope,
            Frame::Disconnect(reason) => return Ok(SocketEnd::Reconnect(reason)),
        };
        metrics::counter!("antler_slack_socket_envelopes_total").increment(1);
        match answer_envelope(channel, ingress, &envelope).await {
            Answer::Ack(payload) => {
                let payload = payload.filter(|_| envelope.accepts_response_payload);
                connection.ack(&envelope.envelope_id, payload).await?;
            }
            Answer::Redeliver => {}
            Answer::Stopped => return Ok(SocketEnd::Stopped),
        }
    }
}

/// What to do with an envelope once its events are handled.
enum Answer {
    /// Acknowledge, with the immediate reply if there is one.
    Ack(Option<serde_json::Value>),
    /// Leave it unacknowledged: Slack delivers it again.
    Redeliver,
    Stopped,
}

/// Parses `envelope` as the webhook would its request and accepts its events.
async fn answer_envelope(channel: &SlackChannel, ingress: &Ingress, envelope: &Envelope) -> Answer {
    let parsed = match channel.parse_socket(&envelope.kind, &envelope.payload) {
        Ok(parsed) => parsed,
        Err(ChannelError::Transient(e)) => {
            // As the webhook's 503: it may be for the bot, whose identity is not known yet.
            tracing::warn!(error = %e, retry_attempt = envelope.retry_attempt, "a slack envelope waits for the bot's identity");
            return Answer::Redeliver;
        }
        Err(e) => {
            // It never gets better: acknowledged, as the webhook's 400 is final.
            tracing::warn!(error = %e, kind = %envelope.kind, "a slack envelope antler cannot read");
            return Answer::Ack(None);
        }
    };
    let (mut events, reply) = match parsed {
        Parsed::Events(events) => (events, None),
        Parsed::EventsWithReply { events, reply } => (events, Some(reply)),
        Parsed::Reply(_) | Parsed::Ignore => return Answer::Ack(None),
    };
    if reply.is_some()
        && let Some(refusal) =
            crate::http::webhook::refuse_at_once(ingress, channel as &dyn Channel, &mut events)
    {
        return Answer::Ack(Some(refusal));
    }
    match crate::http::webhook::accept_all(ingress, events).await {
        Ok(()) => Answer::Ack(reply),
        Err(IngressError::ShuttingDown) => Answer::Stopped,
        Err(e) => {
            tracing::warn!(error = %e, retry_attempt = envelope.retry_attempt, "a slack envelope could not be accepted; Slack delivers it again");
            Answer::Redeliver
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
