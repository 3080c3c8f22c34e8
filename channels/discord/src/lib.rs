//! # antler-discord
//!
//! Discord for antler, on serenity's interaction models and Ed25519 verifier: application
//! commands (`/ask`, `/new`, `/status`, the "Ask antler" message command) come to the
//! Interactions Endpoint URL `/webhooks/discord/interactions`, signed with the application's
//! key; each is deferred at once (`{"type":5}`) and answered by editing the deferred response,
//! longer answers continued in follow-ups, streamed answers edited in place at most once a
//! second. With [`DiscordGateway`] (`gateway = true`), plain @mentions and DMs arrive over Discord's
//! websocket too and are answered as the bot's own messages. Approval buttons are message
//! components under the prompt's message; a press is a component interaction on the same
//! endpoint (or over the Gateway when no endpoint is set), answered by updating that message.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod channel;
mod client;
mod gateway;
mod normalize;

pub use channel::{
    DiscordChannel, DiscordSettings, MESSAGE_LIMIT, SIGNATURE_HEADER, TIMESTAMP_HEADER,
    TOKEN_LIFETIME,
};
pub use client::{
    CommandSpec, DEFAULT_API_URL, DiscordApi, DiscordIdentity, OptionSpec, Registration,
};
pub use gateway::{DiscordGateway, GatewayEvent, GatewayPress};
