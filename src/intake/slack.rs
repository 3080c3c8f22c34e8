//! Slack's Socket Mode (`channels.slack.mode = "socket"`).

use std::sync::Arc;

use antler_channel::{Channel, ChannelError, Parsed};
use antler_slack::{Envelope, Frame, SlackChannel, SlackSocket, SocketConnection};
use tokio_util::sync::CancellationToken;

use super::INTAKE_RETRY;
use crate::ingress::{Ingress, IngressError};
use crate::retry::Backoff;

/// Holds Slack's Socket Mode connection until `stop` is cancelled: one connection, opened
/// again when Slack asks (`disconnect`) or it fails (after a backoff).
pub(crate) async fn read_slack_socket(
    channel: Arc<SlackChannel>,
    socket: SlackSocket,
    ingress: Ingress,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(INTAKE_RETRY);
    let health = ingress.health().clone();
    tracing::info!("slack socket mode started");
    loop {
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = socket.connect() => connected,
        };
        let ended = match connected {
            Ok(mut connection) => {
                backoff.reset();
                health.connection("slack", "connected");
                tracing::info!("slack socket mode connected");
                let ended = serve_slack_socket(&channel, &mut connection, &ingress, &stop).await;
                connection.close().await;
                ended
            }
            Err(e) => Err(e),
        };
        match ended {
            Ok(SocketEnd::Stopped) => {
                health.connection("slack", "stopped");
                return;
            }
            Ok(SocketEnd::Reconnect(reason)) => {
                tracing::info!(%reason, "slack asked for a new socket mode connection");
            }
            Err(e) => {
                health.connection("slack", "reconnecting");
                health.failed("slack", &socket_error(&e));
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

/// A Socket Mode failure as the channel's health sees it: a refused app token refuses the bot.
fn socket_error(error: &antler_slack::SocketError) -> ChannelError {
    match error {
        antler_slack::SocketError::Refused(_) | antler_slack::SocketError::NotAppToken => {
            ChannelError::Refused(error.to_string())
        }
        _ => ChannelError::Transient(error.to_string()),
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
        Parsed::Press(press) => {
            return Answer::Ack(ingress.press(channel as &dyn Channel, &press).await);
        }
        Parsed::Reply(_) | Parsed::Ignore | Parsed::Moved(_) => return Answer::Ack(None),
    };
    if reply.is_some()
        && let Some(refusal) =
            crate::http::webhook::refuse_at_once(ingress, channel as &dyn Channel, &mut events)
                .await
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
