//! The reader of Discord's Gateway (`channels.discord.gateway = true`).

use std::sync::Arc;

use antler_channel::{Channel, Parsed};
use antler_discord::{DiscordChannel, GatewayEvent, GatewayPress};
use tokio_util::sync::CancellationToken;

use super::accept;
use crate::ingress::Ingress;

/// Accepts what Discord's Gateway receives until `stop` is cancelled, then closes it. A
/// message Discord replays after a reconnect is recognised by the inbox's dedupe (its id); a
/// button press is decided and answered through its interaction's callback.
pub(crate) async fn read_discord_gateway(
    mut gateway: antler_discord::DiscordGateway,
    channel: Arc<DiscordChannel>,
    ingress: Ingress,
    stop: CancellationToken,
) {
    tracing::info!("discord gateway started");
    // serenity reconnects and resumes by itself; antler sees only whether it runs.
    ingress.health().connection("discord", "connected");
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => break,
            event = gateway.events.recv() => event,
        };
        match event {
            None => break,
            Some(GatewayEvent::Message(event)) => {
                if !accept(&ingress, *event, &stop).await {
                    break;
                }
            }
            Some(GatewayEvent::Press(press)) => answer_press(&channel, &ingress, &press).await,
        }
    }
    gateway.stop().await;
    ingress.health().connection("discord", "stopped");
}

/// Decides a press received over the Gateway and answers its interaction with what the
/// endpoint would have answered (a refusal at once, or the decision). A failed callback is
/// logged: the decision stands, and Discord shows the presser that the interaction failed.
async fn answer_press(channel: &DiscordChannel, ingress: &Ingress, press: &GatewayPress) {
    let response = match channel.parse_gateway(press) {
        Parsed::Press(parsed) => ingress.press(channel as &dyn Channel, &parsed).await,
        Parsed::Reply(reply) => Some(reply),
        _ => None,
    };
    let Some(response) = response else { return };
    if let Err(e) = channel.answer_gateway(press, &response).await {
        tracing::warn!(error = %e, "cannot answer a button press received over the discord gateway");
    }
}
