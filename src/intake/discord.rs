//! The reader of Discord's Gateway (`channels.discord.gateway = true`).

use tokio_util::sync::CancellationToken;

use super::accept;
use crate::ingress::Ingress;

/// Accepts what Discord's Gateway receives until `stop` is cancelled, then closes it. A
/// message Discord replays after a reconnect is recognised by the inbox's dedupe (its id).
pub(crate) async fn read_discord_gateway(
    mut gateway: antler_discord::DiscordGateway,
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
        let Some(event) = event else { break };
        if !accept(&ingress, event, &stop).await {
            break;
        }
    }
    gateway.stop().await;
    ingress.health().connection("discord", "stopped");
}
