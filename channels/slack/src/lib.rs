//! # antler-slack
//!
//! Slack for antler, on slack-morphism's event types, signature verifier and Web API client:
//! the Events API, slash commands and button presses come to `/webhooks/slack/events`,
//! `/webhooks/slack/commands` and `/webhooks/slack/interactions`, signed with the app's
//! signing secret, or over a Socket Mode connection antler opens (no public URL); mentions,
//! DMs and thread replies become antler's normalized messages; answers are posted in the
//! user's thread as mrkdwn and edited in place while they are written; prompts carry Block
//! Kit buttons.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod blocks;
mod channel;
mod client;
mod interaction;
mod manifest;
mod normalize;
mod socket;

pub use channel::{SIGNATURE_HEADER, SlackChannel, SlackSettings, TIMESTAMP_HEADER, WORKING};
pub use client::{DEFAULT_API_URL, SlackApi, SlackIdentity};
pub use manifest::manifest;
pub use socket::{Envelope, Frame, SlackSocket, SocketConnection, SocketError};
