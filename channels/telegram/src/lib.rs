//! # antler-telegram
//!
//! Telegram for antler, on teloxide's types: [`normalize`] turns an `Update` into antler's
//! normalized message and the facts the shared group-addressing rule needs.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::single_range_in_vec_init
    )
)]

mod channel;
mod client;
mod normalize;

pub use channel::{SECRET_HEADER, TelegramChannel, TelegramSettings};
pub use client::{
    ALLOWED_UPDATES, MenuCommand, SendFailure, Target, TelegramApi, WebhookSettings, WebhookStatus,
};
pub use normalize::{
    AddressFacts, BotIdentity, Incoming, Normalized, UnreadableUpdate, normalize, read_update,
};
