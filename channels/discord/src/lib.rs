//! # antler-discord
//!
//! Discord for antler, on serenity's interaction models and Ed25519 verifier: application
//! commands (`/ask`, `/new`, `/status`, the "Ask antler" message command) come to the
//! Interactions Endpoint URL `/webhooks/discord/interactions`, signed with the application's
//! key; each is deferred at once (`{"type":5}`) and answered by editing the deferred response,
//! longer answers continued in follow-ups, streamed answers edited in place at most once a
//! second. Plain messages and @mentions need Discord's Gateway, which this crate does not run.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod channel;
mod client;
mod normalize;

pub use channel::{
    DiscordChannel, DiscordSettings, MESSAGE_LIMIT, SIGNATURE_HEADER, TIMESTAMP_HEADER,
    TOKEN_LIFETIME,
};
pub use client::{
    CommandSpec, DEFAULT_API_URL, DiscordApi, DiscordIdentity, OptionSpec, Registration,
};
