//! Feishu's long connection (`channels.feishu.mode = "websocket"`).

use std::sync::Arc;
use std::time::Duration;

use antler_channel::{Channel, ChannelError, Parsed};
use antler_feishu::{Delivery, FeishuChannel, FeishuSocket, SocketConfig};
use tokio_util::sync::CancellationToken;

use crate::ingress::{Ingress, IngressError};
use crate::retry::RetryPolicy;

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
    let health = ingress.health().clone();
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
                health.failed("feishu", &ChannelError::Refused(e.to_string()));
                health.connection("feishu", "stopped");
                tracing::error!(error = %e, "feishu long connection refused; no more attempts (see `antler doctor`)");
                metrics::counter!("antler_feishu_socket_refused_total").increment(1);
                return;
            }
            Err(e) => {
                health.failed("feishu", &e);
                health.connection("feishu", "reconnecting");
                failures = failures.saturating_add(1);
                metrics::counter!("antler_feishu_socket_errors_total").increment(1);
                if u32::try_from(config.reconnect_count).is_ok_and(|most| failures >= most) {
                    tracing::error!(error = %e, attempts = failures, "feishu long connection: giving up, as the server's ReconnectCount says");
                    health.connection("feishu", "stopped");
                    return;
                }
                wait = RetryPolicy::forever(Duration::from_secs(1), config.reconnect_interval)
                    .backoff(failures);
                tracing::warn!(error = %e, retry_in = ?wait, "feishu long connection failed");
                continue;
            }
        };
        failures = 0;
        health.connection("feishu", "connected");
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
/// once antler stops (the frame unanswered: Feishu delivers it again). A card callback (a
/// button pressed) is decided and answered with the toast and card the webhook would answer.
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
        Ok(Parsed::Press(press)) => {
            match ingress.press(channel as &dyn Channel, &press).await {
                Some(result) => delivery.answer_with(&result),
                None => delivery.answer(200),
            }
            return true;
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
