//! # antler-channel
//!
//! What every antler channel shares: the [`Channel`] trait, the normalized [`InboundEvent`] and
//! [`OutboundMessage`], conversation keys, the group addressing rule ([`addressed`]), the
//! constant-time verification helpers in [`verify`], and the [`render`] toolkit that turns
//! Markdown answers into chunks of platform markup.
//!
//! A channel is pure protocol. [`Channel::verify`] and [`Channel::parse`] are synchronous and
//! work on the raw request (headers and body bytes), so they can be tested against recorded
//! payloads with no runtime; only [`Channel::send`] does I/O. This crate never depends on the
//! gateway (`antler`), which keeps platform crates free of runtime details.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod addressing;
mod event;
mod outbound;
pub mod render;
pub mod verify;

pub use addressing::{Addressing, addressed};
pub use outbound::{header_secs, mask_secrets, read_bounded};

pub use event::{
    AttachmentRef, AttachmentSource, Button, ButtonStyle, ChatMove, ConversationKey, InboundEvent,
    OutboundFile, OutboundMessage, Press, PressAnswer, Prompt, Receipt, ReplyContext, UserRef,
};

use std::time::Duration;

use render::Limit;

/// A webhook request as the platform sent it: headers and the exact body bytes.
///
/// Signatures are computed over the raw bytes, so nothing may parse the body before
/// [`Channel::verify`] has accepted it.
#[derive(Debug, Clone, Copy)]
pub struct WebhookRequest<'a> {
    /// Which of the channel's [`Channel::routes`] it came to (`""` for `/webhooks/<channel>`).
    pub route: &'a str,
    /// The request headers.
    pub headers: &'a http::HeaderMap,
    /// The raw body.
    pub body: &'a [u8],
}

/// What a verified webhook turned into.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// Messages to accept (dedupe, store, answer later).
    Events(Vec<InboundEvent>),
    /// A protocol reply to send back at once (URL challenge, PING), nothing to store.
    Reply(serde_json::Value),
    /// Messages to accept and, once they are durable, a body to answer the request with
    /// (a Slack slash command's acknowledgement, a Discord deferred interaction response).
    /// Accepting comes first: the reply is sent only if every event was accepted.
    EventsWithReply {
        /// Messages to accept, exactly as [`Parsed::Events`].
        events: Vec<InboundEvent>,
        /// The response body (HTTP 200, JSON).
        reply: serde_json::Value,
    },
    /// A well-formed request that asks nothing of antler (the bot's own echo, an unhandled kind).
    Ignore,
    /// A chat moved (a group upgraded to a supergroup): move its conversation, then answer
    /// HTTP 200 with nothing.
    Moved(ChatMove),
    /// Someone pressed one of the bot's buttons: decide what it asks, then answer through
    /// [`Channel::answer_press`]. Nothing is stored in the inbox for the press itself.
    Press(Press),
}

/// The errors of the channel boundary. Each variant carries what the caller's policy needs.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ChannelError {
    /// The request's signature, secret or token did not verify (HTTP 401).
    #[error("unauthorized")]
    Unauthorized,
    /// The request verified but its body is not what the protocol says (HTTP 400).
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The platform asked us to slow down; retry after the given delay.
    #[error("rate limited, retry after {retry_after:?}")]
    RateLimited {
        /// How long the platform asked us to wait.
        retry_after: Duration,
    },
    /// A failure that may go away (5xx, timeout, connection reset): retry with backoff.
    #[error("transient failure: {0}")]
    Transient(String),
    /// A failure that retrying will not fix (4xx other than 429, a deleted chat).
    #[error("permanent failure: {0}")]
    Permanent(String),
    /// A file is larger than antler accepts.
    #[error("the file is larger than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// The channel cannot do what was asked (fetch a file, edit a message).
    #[error("not supported by this channel")]
    Unsupported,
    /// The platform refuses the bot itself (its token was revoked, another instance takes its
    /// updates): nothing it sends or reads works until an operator acts. The channel is
    /// reported unhealthy until a call succeeds again.
    #[error("refused: {0}")]
    Refused(String),
}

impl ChannelError {
    /// Whether the delivery worker should try again.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::RateLimited { .. } | Self::Transient(_))
    }
}

/// One messaging platform (or antler's own HTTP API) as the gateway sees it.
#[async_trait::async_trait]
pub trait Channel: Send + Sync + 'static {
    /// The channel's name: the first segment of its conversation keys and its route.
    fn name(&self) -> &'static str;

    /// The webhook routes it serves under `/webhooks/<name>`: `""` is that path itself, `"events"`
    /// is `/webhooks/<name>/events` (Slack's events and slash commands come to different URLs).
    fn routes(&self) -> &'static [&'static str] {
        &[""]
    }

    /// Checks what the headers alone can tell (a secret header, the presence and age of a
    /// signature) before the body is read, so an unauthenticated sender cannot make antler
    /// read its body. [`Channel::verify`] still checks the whole request.
    fn verify_headers(&self, _headers: &http::HeaderMap) -> Result<(), ChannelError> {
        Ok(())
    }

    /// Authenticates the raw request. Must compare secrets in constant time.
    fn verify(&self, request: &WebhookRequest<'_>) -> Result<(), ChannelError>;

    /// Turns a verified request into events or an immediate reply.
    fn parse(&self, request: &WebhookRequest<'_>) -> Result<Parsed, ChannelError>;

    /// The answer to a [`Parsed::EventsWithReply`] request whose author the access check
    /// refuses, given at once instead of its reply, with `text` saying why (a Discord
    /// ephemeral message, which only that user sees). The refused events are then not stored
    /// and nothing runs. `None` (the default): the refusal is stored and answered like any
    /// message, through the inbox and the outbox.
    fn refusal_reply(&self, _text: &str) -> Option<serde_json::Value> {
        None
    }

    /// The reply's Markdown as the platform's messages, in order: rendered for the platform and
    /// chunked at its size limit (see [`render::parts`]). By default, the text as it is, in one
    /// message. Delivery sends the parts one by one and records each, so a retry never sends a
    /// part twice.
    fn render(&self, markdown: &str) -> Result<Vec<String>, ChannelError> {
        Ok(vec![markdown.to_owned()])
    }

    /// Sends one part of `message` (one of [`Channel::render`]'s); the receipt names what the
    /// platform created. Where the platform threads replies, part 0 answers the user's message.
    async fn send(
        &self,
        message: &OutboundMessage,
        part: Part<'_>,
    ) -> Result<Receipt, ChannelError>;

    /// Replaces the text of a message the bot sent (`sent`, in `message`'s conversation) with
    /// `part`. A platform that reports "not modified" counts it as success. Channels whose
    /// [`Limits::edits`] is `Some` implement it.
    async fn edit(
        &self,
        _message: &OutboundMessage,
        _sent: &Receipt,
        _part: Part<'_>,
    ) -> Result<(), ChannelError> {
        Err(ChannelError::Unsupported)
    }

    /// Answers `press` with `answer`: shows the notice to the presser alone and, when
    /// [`PressAnswer::update`] is set, replaces the button's message with it, buttons removed.
    /// Returns the body to answer the press's request with (HTTP 200, JSON: a Discord
    /// interaction response, a Feishu card callback's toast and card); `None`, an empty 200.
    /// Channels whose [`Capabilities::buttons`] is set implement it.
    async fn answer_press(
        &self,
        _press: &Press,
        _answer: &PressAnswer,
    ) -> Result<Option<serde_json::Value>, ChannelError> {
        Err(ChannelError::Unsupported)
    }

    /// Marks the user's message `message_id` in `conversation` with where its turn is (a
    /// reaction: 👀 while working, ✅ or ❌ at the end). Channels whose
    /// [`Capabilities::progress_marks`] is set implement it. Best effort: a failure only loses
    /// the mark.
    async fn mark(
        &self,
        _conversation: &ConversationKey,
        _message_id: &str,
        _progress: Progress,
    ) -> Result<(), ChannelError> {
        Err(ChannelError::Unsupported)
    }

    /// The platform's limits on what the bot sends.
    fn limits(&self) -> Limits {
        Limits::default()
    }

    /// Whether the reply `message` may be shown live, in a draft edited while it is written,
    /// on a channel whose [`Limits::edits`] is `Some`. `false` for a reply whose way back
    /// allows only a few messages (a Slack slash command's `response_url`): it is sent whole.
    fn live_reply(&self, _message: &OutboundMessage) -> bool {
        true
    }

    /// What the platform can show.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Shows in `conversation` that the bot is writing, for a few seconds; the caller repeats
    /// it while a turn runs. Best effort: a failure only loses the indicator.
    async fn typing(&self, _conversation: &ConversationKey) -> Result<(), ChannelError> {
        Err(ChannelError::Unsupported)
    }

    /// Sends `file` of `message`, after every text part of it, with `content` (the file
    /// opened and checked by delivery; read it, never open `file` by name). Channels whose
    /// [`Capabilities::files`] is true implement it.
    async fn send_file(
        &self,
        _message: &OutboundMessage,
        _file: &OutboundFile,
        _content: FileContent,
    ) -> Result<Receipt, ChannelError> {
        Err(ChannelError::Unsupported)
    }

    /// Downloads an attachment's bytes, at most `max_bytes` of them (more is
    /// [`ChannelError::TooLarge`], found out without reading the rest).
    async fn fetch_attachment(
        &self,
        _attachment: &AttachmentRef,
        _max_bytes: u64,
    ) -> Result<Vec<u8>, ChannelError> {
        Err(ChannelError::Unsupported)
    }
}

/// The bytes of a reply's file: the file delivery opened (beneath the thread's outputs, links
/// refused) and checked, positioned at its start.
#[derive(Debug)]
pub struct FileContent {
    /// The open file.
    pub file: std::fs::File,
    /// Its size when it was opened: what a channel announces and sends.
    pub size: u64,
}

/// What a platform can show besides text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// It delivers a reply's files itself ([`Channel::send_file`]): the one place that says
    /// so. When it does not, delivery appends a line per file (`📎 report.csv (12 KB)`) to the
    /// reply's text instead.
    pub files: bool,
    /// It can show images.
    pub images: bool,
    /// It can show that the bot is writing ([`Channel::typing`]).
    pub typing: bool,
    /// It marks the user's message with the turn's progress ([`Channel::mark`]).
    pub progress_marks: bool,
    /// It shows a part's [`Part::buttons`] and reads presses back ([`Parsed::Press`],
    /// [`Channel::answer_press`]).
    pub buttons: bool,
}

/// Where the turn answering a message is, for [`Channel::mark`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The turn started.
    Working,
    /// It answered.
    Done,
    /// It failed; the reply says why.
    Failed,
}

/// One platform message of a reply: its number among the reply's parts and its rendered body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part<'a> {
    /// From 0.
    pub index: usize,
    /// The platform's markup, within its size limit.
    pub body: &'a str,
    /// Buttons to show under it, in one row (the last part of a [`Prompt`]); empty for
    /// every other part, and ignored by a channel without [`Capabilities::buttons`].
    pub buttons: &'a [Button],
}

/// A platform's limits on what the bot sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// How long one message may be, in the unit the platform counts (`None`: no limit antler
    /// knows of).
    pub message: Option<Limit>,
    /// How often one message may be edited. `Some` turns on live replies: while a turn runs, its
    /// streamed text is shown in a draft message edited at this pace, which the final answer
    /// then replaces. `None`: the answer is sent when it is complete.
    pub edits: Option<EditRate>,
}

/// The least time between two edits of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EditRate {
    /// In a private chat.
    pub private: Duration,
    /// In a group chat, where platforms allow fewer messages a minute.
    pub group: Duration,
}

impl EditRate {
    /// The interval for a chat of this kind.
    #[must_use]
    pub fn interval(&self, group: bool) -> Duration {
        if group { self.group } else { self.private }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edit_interval_follows_the_kind_of_chat() {
        let rate = EditRate {
            private: Duration::from_secs(1),
            group: Duration::from_secs(3),
        };
        assert_eq!(rate.interval(false), Duration::from_secs(1));
        assert_eq!(rate.interval(true), Duration::from_secs(3));
        assert_eq!(
            Limits::default().edits,
            None,
            "no drafts unless a channel asks"
        );
    }
}
