//! # antler-feishu
//!
//! Feishu (and Lark, its international twin) for antler: event subscriptions come to
//! `/webhooks/feishu/events`, encrypted with the app's Encrypt Key and signed when one is set,
//! or over the long connection antler opens itself ([`FeishuSocket`], no public URL needed);
//! messages to the bot (private chats, group @mentions, group `/commands`) become antler's
//! normalized messages; answers are replies to the user's message, as message cards whose
//! Markdown is edited in place while they are written.
//!
//! # Why hand-rolled
//!
//! The protocol antler needs is small: five Open API endpoints, one token cache, AES-256-CBC
//! decryption, one SHA-256 signature and serde structs for the v2 message event. The crates
//! that exist do not fit:
//!
//! - open-lark (0.14) is about 220,000 lines in 815 files, aimed at the SDK's WebSocket flow;
//!   it has no webhook decryption nor `X-Lark-Signature` check at all (only an
//!   `event_encrypt_key` field), so the security-critical part would be ours anyway, at a large
//!   compile cost.
//! - feishu-sdk (0.1) has correct decrypt and signature functions, but builds on reqwest 0.13,
//!   whose rustls pulls in `aws-lc-rs` beside the `ring` provider the workspace uses; with two
//!   providers rustls cannot pick one and the first TLS client panics. It also needs Rust 1.89.
//!
//! So this crate uses reqwest 0.12 (rustls on `ring`, as the rest of antler), `aes` + `cbc`,
//! `sha2` and `base64`, and checks itself against the shared test vectors.
//!
//! # What antler sees
//!
//! - A user is their **open_id** (`ou_…`, stable per app): `allowed_users` and `admins` list
//!   open_ids for Feishu. A chat is its chat_id (`oc_…`), as `allowed_chats` names it.
//! - Conversations are `feishu:<tenant_key>:<chat_id>` in private chats and
//!   `feishu:<tenant_key>:<chat_id>:<root_id or message_id>` in groups (one topic, one thread).
//! - A message's event id is its message_id, which every redelivery keeps.
//! - A file or image is [`antler_channel::AttachmentSource::Platform`] with the id
//!   `<message_id>/<key>/<image|file>`, fetched through the message resource endpoint.
//! - Buttons (an approval's Approve and Deny) are `action` buttons on an interactive card;
//!   pressing one is the `card.action.trigger` callback (on the events route, verified like
//!   events, or a `card` frame on the long connection), answered in its response with a toast
//!   for the presser and the card replaced. A button's `value` names the group topic its card
//!   is in, so the press lands in the conversation a message there would.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod channel;
mod client;
mod crypto;
mod frame;
mod normalize;
mod socket;

pub use channel::{
    FeishuChannel, FeishuSettings, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
pub use client::{DEFAULT_API_URL, FeishuApi, FeishuIdentity, LARK_API_URL};
pub use socket::{Delivery, FeishuSocket, SocketConfig, SocketEndpoint};
