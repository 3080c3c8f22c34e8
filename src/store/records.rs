//! The store's own record formats for the records written with every message: inbox items,
//! dedupe entries, outbox items and thread messages.
//!
//! A record is one byte naming its format, then the body in postcard (serde's compact binary
//! form: fields in order, integers as varints, no names). The formats are the store's types,
//! not the domain's: a field added to [`InboundEvent`] or [`ChatMessage`] does not change
//! what is on disk until a new format says so, and an old format is still read while a
//! migration from it exists. A format never changes once written; a change is a new format
//! number with its own types here.
//!
//! Schema 2 stored these records as the domain types' JSON, which starts with `{`: no
//! format number here may be `b'{'`, so a record's first byte always tells the two apart
//! (the migration relies on it to run again after a crash halfway).
//!
//! Strings are `Cow`s: writing borrows the domain value's strings, reading owns them.

use std::borrow::Cow;

use antler_channel::{
    AttachmentRef, AttachmentSource, ConversationKey, InboundEvent, OutboundFile, OutboundMessage,
    Receipt, ReplyContext, UserRef,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::rules::DedupeEntry;
use super::{InboxItem, InboxStatus, OutboxItem, OutboxStatus, StoreError};
use crate::agent::message::{Authored, ChatMessage, ContentPart, ToolCall};
use crate::telemetry::TraceContext;

/// The first byte of a schema-2 record (JSON).
pub(crate) const JSON_RECORD: u8 = b'{';

/// A value kept in the store as one of its own records.
pub(crate) trait Record: Sized {
    /// What it is, for errors.
    const WHAT: &'static str;
    /// The format this build writes.
    const FORMAT: u8;
    /// The record of `self` in the current format.
    fn to_record(&self) -> Result<Vec<u8>, StoreError>;
    /// The value of a record in any format this build reads.
    fn from_record(bytes: &[u8]) -> Result<Self, StoreError>;
}

/// Whether `bytes` is a record in `T`'s current format.
#[cfg(test)]
pub(crate) fn is_current<T: Record>(bytes: &[u8]) -> bool {
    bytes.first() == Some(&T::FORMAT)
}

/// Whether `bytes` is a schema-2 record (JSON), which a migration converts; a record in any
/// of the store's own formats, current or older, is left as it is.
pub(crate) fn is_json(bytes: &[u8]) -> bool {
    bytes.first() == Some(&JSON_RECORD)
}

fn codec_error(what: &'static str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Codec {
        what,
        detail: detail.to_string(),
    }
}

fn write<T: Serialize>(what: &'static str, format: u8, body: &T) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(128);
    out.push(format);
    postcard::to_extend(body, out).map_err(|e| codec_error(what, e))
}

/// The body of a record in `format`; anything else (another format, bytes left over) is an
/// error naming what was found.
fn read<T: DeserializeOwned>(
    what: &'static str,
    format: u8,
    bytes: &[u8],
) -> Result<T, StoreError> {
    match bytes.split_first() {
        Some((&found, body)) if found == format => {
            let (value, rest) =
                postcard::take_from_bytes(body).map_err(|e| codec_error(what, e))?;
            if rest.is_empty() {
                Ok(value)
            } else {
                Err(codec_error(
                    what,
                    format!("{} bytes after the record", rest.len()),
                ))
            }
        }
        Some((&JSON_RECORD, _)) => Err(codec_error(
            what,
            "a schema-2 record (JSON) in a store that was not migrated",
        )),
        Some((found, _)) => Err(codec_error(what, format!("unknown record format {found}"))),
        None => Err(codec_error(what, "an empty record")),
    }
}

fn text(value: &str) -> Cow<'_, str> {
    Cow::Borrowed(value)
}

fn opt_text(value: &Option<String>) -> Option<Cow<'_, str>> {
    value.as_deref().map(Cow::Borrowed)
}

fn owned(value: Option<Cow<'_, str>>) -> Option<String> {
    value.map(Cow::into_owned)
}

fn receipt(value: Option<Cow<'_, str>>) -> Option<Receipt> {
    value.map(|id| Receipt {
        platform_message_id: id.into_owned(),
    })
}

fn receipt_id(value: &Option<Receipt>) -> Option<Cow<'_, str>> {
    value
        .as_ref()
        .map(|r| Cow::Borrowed(r.platform_message_id.as_str()))
}

// ---- inbox items (format 1) ----

#[derive(Serialize, Deserialize)]
struct InboxV1<'a> {
    seq: u64,
    event: EventV1<'a>,
    thread_id: Cow<'a, str>,
    fresh_thread: bool,
    running: bool,
    attempts: u32,
    accepted_at_ms: u64,
    draft: Option<Cow<'a, str>>,
}

#[derive(Serialize, Deserialize)]
struct EventV1<'a> {
    channel: Cow<'a, str>,
    event_id: Cow<'a, str>,
    conversation: Cow<'a, str>,
    user_id: Cow<'a, str>,
    user_name: Option<Cow<'a, str>>,
    user_admin: bool,
    user_aliases: Vec<Cow<'a, str>>,
    text: Cow<'a, str>,
    reply_to: Option<Cow<'a, str>>,
    received_at_ms: u64,
    attachments: Vec<AttachmentV1<'a>>,
    group: bool,
    chat: Option<Cow<'a, str>>,
    refused: bool,
    follow_up: bool,
    unsupported: Option<Cow<'a, str>>,
    interactive: bool,
    reply_context: Option<Cow<'a, str>>,
}

#[derive(Serialize, Deserialize)]
struct AttachmentV1<'a> {
    name: Cow<'a, str>,
    media_type: Option<Cow<'a, str>>,
    size: Option<u64>,
    source: SourceV1<'a>,
}

#[derive(Serialize, Deserialize)]
enum SourceV1<'a> {
    Platform(Cow<'a, str>),
    Url(Cow<'a, str>),
    Inline(Cow<'a, str>),
}

impl<'a> EventV1<'a> {
    fn of(event: &'a InboundEvent) -> Self {
        Self {
            channel: text(&event.channel),
            event_id: text(&event.event_id),
            conversation: text(event.conversation.as_str()),
            user_id: text(&event.user.id),
            user_name: opt_text(&event.user.name),
            user_admin: event.user.admin,
            user_aliases: event.user.aliases.iter().map(|a| text(a)).collect(),
            text: text(&event.text),
            reply_to: opt_text(&event.reply_to),
            received_at_ms: event.received_at_ms,
            attachments: event.attachments.iter().map(AttachmentV1::of).collect(),
            group: event.group,
            chat: opt_text(&event.chat),
            refused: event.refused,
            follow_up: event.follow_up,
            unsupported: opt_text(&event.unsupported),
            interactive: event.interactive,
            reply_context: event.reply_context.as_ref().map(|c| text(c.expose())),
        }
    }

    fn into_event(self) -> InboundEvent {
        InboundEvent {
            channel: self.channel.into_owned(),
            event_id: self.event_id.into_owned(),
            conversation: ConversationKey::from(self.conversation.into_owned()),
            user: UserRef {
                id: self.user_id.into_owned(),
                name: owned(self.user_name),
                admin: self.user_admin,
                aliases: self.user_aliases.into_iter().map(Cow::into_owned).collect(),
            },
            text: self.text.into_owned(),
            reply_to: owned(self.reply_to),
            received_at_ms: self.received_at_ms,
            attachments: self
                .attachments
                .into_iter()
                .map(AttachmentV1::into_ref)
                .collect(),
            group: self.group,
            chat: owned(self.chat),
            refused: self.refused,
            follow_up: self.follow_up,
            unsupported: owned(self.unsupported),
            interactive: self.interactive,
            reply_context: self.reply_context.map(ReplyContext::new),
            media_group: None,
        }
    }
}

impl<'a> AttachmentV1<'a> {
    fn of(attachment: &'a AttachmentRef) -> Self {
        Self {
            name: text(&attachment.name),
            media_type: opt_text(&attachment.media_type),
            size: attachment.size,
            source: match &attachment.source {
                AttachmentSource::Platform { id } => SourceV1::Platform(text(id)),
                AttachmentSource::Url { url } => SourceV1::Url(text(url)),
                AttachmentSource::Inline { data_base64 } => SourceV1::Inline(text(data_base64)),
            },
        }
    }

    fn into_ref(self) -> AttachmentRef {
        AttachmentRef {
            name: self.name.into_owned(),
            media_type: owned(self.media_type),
            size: self.size,
            source: match self.source {
                SourceV1::Platform(id) => AttachmentSource::Platform {
                    id: id.into_owned(),
                },
                SourceV1::Url(url) => AttachmentSource::Url {
                    url: url.into_owned(),
                },
                SourceV1::Inline(data) => AttachmentSource::Inline {
                    data_base64: data.into_owned(),
                },
            },
        }
    }
}

// ---- trace contexts (telemetry.rs): 24 bytes, the trace id and the accepting span's id ----

#[derive(Serialize, Deserialize)]
struct TraceV1 {
    trace_id: [u8; 16],
    span_id: [u8; 8],
}

impl TraceV1 {
    fn of(trace: TraceContext) -> Self {
        Self {
            trace_id: trace.trace_id,
            span_id: trace.span_id,
        }
    }

    fn into_context(self) -> TraceContext {
        TraceContext {
            trace_id: self.trace_id,
            span_id: self.span_id,
        }
    }
}

// ---- inbox items (format 3: format 2, then the message's trace) ----

#[derive(Serialize, Deserialize)]
struct InboxV3<'a> {
    v2: InboxV2<'a>,
    trace: TraceV1,
}

/// Format 2: format 1, then what an event gained since. Still read.
#[derive(Serialize, Deserialize)]
struct InboxV2<'a> {
    v1: InboxV1<'a>,
    media_group: Option<Cow<'a, str>>,
}

/// The first format of inbox items, still read.
const INBOX_V1: u8 = 1;

/// The second format of inbox items, still read (a fresh trace stands in for the missing one).
const INBOX_V2: u8 = 2;

impl Record for InboxItem {
    const WHAT: &'static str = "inbox item";
    const FORMAT: u8 = 3;

    fn to_record(&self) -> Result<Vec<u8>, StoreError> {
        let v2 = InboxV2 {
            v1: InboxV1 {
                seq: self.seq,
                event: EventV1::of(&self.event),
                thread_id: text(&self.thread_id),
                fresh_thread: self.fresh_thread,
                running: self.status == InboxStatus::Running,
                attempts: self.attempts,
                accepted_at_ms: self.accepted_at_ms,
                draft: receipt_id(&self.draft),
            },
            media_group: opt_text(&self.event.media_group),
        };
        let record = InboxV3 {
            v2,
            trace: TraceV1::of(self.trace),
        };
        write(Self::WHAT, Self::FORMAT, &record)
    }

    fn from_record(bytes: &[u8]) -> Result<Self, StoreError> {
        let (InboxV2 { v1, media_group }, trace) = match bytes.first() {
            Some(&INBOX_V1) => (
                InboxV2 {
                    v1: read(Self::WHAT, INBOX_V1, bytes)?,
                    media_group: None,
                },
                TraceContext::fresh(),
            ),
            Some(&INBOX_V2) => (read(Self::WHAT, INBOX_V2, bytes)?, TraceContext::fresh()),
            _ => {
                let InboxV3 { v2, trace } = read(Self::WHAT, Self::FORMAT, bytes)?;
                (v2, trace.into_context())
            }
        };
        let mut event = v1.event.into_event();
        event.media_group = owned(media_group);
        Ok(Self {
            seq: v1.seq,
            event,
            thread_id: v1.thread_id.into_owned(),
            fresh_thread: v1.fresh_thread,
            status: if v1.running {
                InboxStatus::Running
            } else {
                InboxStatus::Pending
            },
            attempts: v1.attempts,
            accepted_at_ms: v1.accepted_at_ms,
            trace,
            draft: receipt(v1.draft),
        })
    }
}

// ---- dedupe entries (format 1) ----

#[derive(Serialize, Deserialize)]
struct DedupeV1<'a> {
    expires_at_ms: u64,
    thread_id: Cow<'a, str>,
    seq: Option<u64>,
}

impl Record for DedupeEntry {
    const WHAT: &'static str = "dedupe entry";
    const FORMAT: u8 = 1;

    fn to_record(&self) -> Result<Vec<u8>, StoreError> {
        let record = DedupeV1 {
            expires_at_ms: self.expires_at_ms,
            thread_id: text(&self.thread_id),
            seq: self.seq,
        };
        write(Self::WHAT, Self::FORMAT, &record)
    }

    fn from_record(bytes: &[u8]) -> Result<Self, StoreError> {
        let record: DedupeV1<'_> = read(Self::WHAT, Self::FORMAT, bytes)?;
        Ok(Self {
            expires_at_ms: record.expires_at_ms,
            thread_id: record.thread_id.into_owned(),
            seq: record.seq,
        })
    }
}

// ---- outbox items (format 2: format 1, then the answered message's trace) ----

#[derive(Serialize, Deserialize)]
struct OutboxV2<'a> {
    v1: OutboxV1<'a>,
    trace: TraceV1,
}

/// The first format of outbox items, still read (a fresh trace stands in for the missing one).
const OUTBOX_V1: u8 = 1;

#[derive(Serialize, Deserialize)]
struct OutboxV1<'a> {
    seq: u64,
    idempotency_key: Cow<'a, str>,
    conversation: Cow<'a, str>,
    thread_id: Cow<'a, str>,
    text: Cow<'a, str>,
    reply_to: Option<Cow<'a, str>>,
    files: Vec<FileV1<'a>>,
    reply_context: Option<Cow<'a, str>>,
    status: StatusV1,
    attempts: u32,
    last_error: Option<Cow<'a, str>>,
    receipt: Option<Cow<'a, str>>,
    parts: Vec<Cow<'a, str>>,
    draft: Option<Cow<'a, str>>,
    created_at_ms: u64,
    finished_at_ms: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct FileV1<'a> {
    name: Cow<'a, str>,
    media_type: Cow<'a, str>,
    size: u64,
}

#[derive(Serialize, Deserialize)]
enum StatusV1 {
    Pending,
    Sent,
    Failed,
}

impl Record for OutboxItem {
    const WHAT: &'static str = "outbox item";
    const FORMAT: u8 = 2;

    fn to_record(&self) -> Result<Vec<u8>, StoreError> {
        let message = &self.message;
        let record = OutboxV1 {
            seq: self.seq,
            idempotency_key: text(&message.idempotency_key),
            conversation: text(message.conversation.as_str()),
            thread_id: text(&message.thread_id),
            text: text(&message.text),
            reply_to: opt_text(&message.reply_to),
            files: message
                .files
                .iter()
                .map(|f| FileV1 {
                    name: text(&f.name),
                    media_type: text(&f.media_type),
                    size: f.size,
                })
                .collect(),
            reply_context: message.reply_context.as_ref().map(|c| text(c.expose())),
            status: match self.status {
                OutboxStatus::Pending => StatusV1::Pending,
                OutboxStatus::Sent => StatusV1::Sent,
                OutboxStatus::Failed => StatusV1::Failed,
            },
            attempts: self.attempts,
            last_error: opt_text(&self.last_error),
            receipt: receipt_id(&self.receipt),
            parts: self
                .parts
                .iter()
                .map(|r| text(&r.platform_message_id))
                .collect(),
            draft: receipt_id(&self.draft),
            created_at_ms: self.created_at_ms,
            finished_at_ms: self.finished_at_ms,
        };
        let record = OutboxV2 {
            v1: record,
            trace: TraceV1::of(self.trace),
        };
        write(Self::WHAT, Self::FORMAT, &record)
    }

    fn from_record(bytes: &[u8]) -> Result<Self, StoreError> {
        let (record, trace) = if bytes.first() == Some(&OUTBOX_V1) {
            let record: OutboxV1<'_> = read(Self::WHAT, OUTBOX_V1, bytes)?;
            (record, TraceContext::fresh())
        } else {
            let OutboxV2 { v1, trace } = read(Self::WHAT, Self::FORMAT, bytes)?;
            (v1, trace.into_context())
        };
        Ok(Self {
            seq: record.seq,
            trace,
            message: OutboundMessage {
                prompts: Vec::new(),
                idempotency_key: record.idempotency_key.into_owned(),
                conversation: ConversationKey::from(record.conversation.into_owned()),
                thread_id: record.thread_id.into_owned(),
                text: record.text.into_owned(),
                reply_to: owned(record.reply_to),
                files: record
                    .files
                    .into_iter()
                    .map(|f| OutboundFile {
                        name: f.name.into_owned(),
                        media_type: f.media_type.into_owned(),
                        size: f.size,
                    })
                    .collect(),
                reply_context: record.reply_context.map(ReplyContext::new),
            },
            status: match record.status {
                StatusV1::Pending => OutboxStatus::Pending,
                StatusV1::Sent => OutboxStatus::Sent,
                StatusV1::Failed => OutboxStatus::Failed,
            },
            attempts: record.attempts,
            last_error: owned(record.last_error),
            receipt: receipt(record.receipt),
            parts: record
                .parts
                .into_iter()
                .map(|id| Receipt {
                    platform_message_id: id.into_owned(),
                })
                .collect(),
            draft: receipt(record.draft),
            created_at_ms: record.created_at_ms,
            finished_at_ms: record.finished_at_ms,
        })
    }
}

// ---- thread messages (format 1) ----

#[derive(Serialize, Deserialize)]
enum MessageV1<'a> {
    System(Cow<'a, str>),
    User {
        content: Cow<'a, str>,
        parts: Vec<PartV1<'a>>,
    },
    Assistant {
        content: Cow<'a, str>,
        tool_calls: Vec<ToolCallV1<'a>>,
        reasoning: Option<Cow<'a, str>>,
    },
    Tool {
        tool_call_id: Cow<'a, str>,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize, Deserialize)]
enum PartV1<'a> {
    Text(Cow<'a, str>),
    Image(Cow<'a, str>),
}

#[derive(Serialize, Deserialize)]
struct ToolCallV1<'a> {
    id: Cow<'a, str>,
    name: Cow<'a, str>,
    arguments: Cow<'a, str>,
}

// ---- thread messages (format 2: format 1, then who wrote a user message) ----

#[derive(Serialize, Deserialize)]
struct MessageV2<'a> {
    v1: MessageV1<'a>,
    /// A user message's [`Authored::trusted_tail`]; `None` for every other message.
    authored: Option<u64>,
}

/// The first format of thread messages, still read.
const MESSAGE_V1: u8 = 1;

impl Record for ChatMessage {
    const WHAT: &'static str = "message";
    const FORMAT: u8 = 2;

    fn to_record(&self) -> Result<Vec<u8>, StoreError> {
        let (v1, authored) = match self {
            Self::System { content } => (MessageV1::System(text(content)), None),
            Self::User {
                content,
                parts,
                authored,
            } => (
                MessageV1::User {
                    content: text(content),
                    parts: parts
                        .iter()
                        .map(|part| match part {
                            ContentPart::Text { text: t } => PartV1::Text(text(t)),
                            ContentPart::Image { url } => PartV1::Image(text(url)),
                        })
                        .collect(),
                },
                authored.map(|a| a.trusted_tail as u64),
            ),
            Self::Assistant {
                content,
                tool_calls,
                reasoning,
            } => (
                MessageV1::Assistant {
                    content: text(content),
                    tool_calls: tool_calls
                        .iter()
                        .map(|call| ToolCallV1 {
                            id: text(&call.id),
                            name: text(&call.name),
                            arguments: text(&call.arguments),
                        })
                        .collect(),
                    reasoning: opt_text(reasoning),
                },
                None,
            ),
            Self::Tool {
                tool_call_id,
                content,
            } => (
                MessageV1::Tool {
                    tool_call_id: text(tool_call_id),
                    content: text(content),
                },
                None,
            ),
        };
        write(Self::WHAT, Self::FORMAT, &MessageV2 { v1, authored })
    }

    fn from_record(bytes: &[u8]) -> Result<Self, StoreError> {
        let MessageV2 { v1, authored } = if bytes.first() == Some(&MESSAGE_V1) {
            MessageV2 {
                v1: read(Self::WHAT, MESSAGE_V1, bytes)?,
                authored: None,
            }
        } else {
            read(Self::WHAT, Self::FORMAT, bytes)?
        };
        Ok(match v1 {
            MessageV1::System(content) => Self::System {
                content: content.into_owned(),
            },
            MessageV1::User { content, parts } => Self::User {
                content: content.into_owned(),
                parts: parts
                    .into_iter()
                    .map(|part| match part {
                        PartV1::Text(text) => ContentPart::Text {
                            text: text.into_owned(),
                        },
                        PartV1::Image(url) => ContentPart::Image {
                            url: url.into_owned(),
                        },
                    })
                    .collect(),
                authored: authored
                    .map(|tail| {
                        usize::try_from(tail)
                            .map(|trusted_tail| Authored { trusted_tail })
                            .map_err(|_| codec_error(Self::WHAT, "a trusted tail past usize"))
                    })
                    .transpose()?,
            },
            MessageV1::Assistant {
                content,
                tool_calls,
                reasoning,
            } => Self::Assistant {
                content: content.into_owned(),
                tool_calls: tool_calls
                    .into_iter()
                    .map(|call| ToolCall {
                        id: call.id.into_owned(),
                        name: call.name.into_owned(),
                        arguments: call.arguments.into_owned(),
                    })
                    .collect(),
                reasoning: owned(reasoning),
            },
            MessageV1::Tool {
                tool_call_id,
                content,
            } => Self::Tool {
                tool_call_id: tool_call_id.into_owned(),
                content: content.into_owned(),
            },
        })
    }
}

#[cfg(test)]
mod tests;
