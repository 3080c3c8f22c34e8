use antler_channel::{
    AttachmentRef, AttachmentSource, ConversationKey, InboundEvent, OutboundFile, OutboundMessage,
    Receipt, ReplyContext, UserRef,
};

use super::*;
use crate::agent::message::{ChatMessage, ContentPart, ToolCall};

fn receipt(id: &str) -> Receipt {
    Receipt {
        platform_message_id: id.to_owned(),
    }
}

/// An event with every field set, strings with multi-byte characters included.
fn event() -> InboundEvent {
    InboundEvent {
        channel: "feishu".to_owned(),
        event_id: "ev-1".to_owned(),
        conversation: ConversationKey::new("feishu", ["t1", "oc_1", "om_1"]),
        user: UserRef {
            id: "ou_1".to_owned(),
            name: Some("李雷".to_owned()),
            admin: true,
            aliases: vec!["u1".to_owned(), "u2".to_owned()],
        },
        text: "部署 eu? ✓".to_owned(),
        reply_to: Some("om_1".to_owned()),
        received_at_ms: 1_780_000_000_123,
        attachments: vec![
            AttachmentRef {
                name: "a.log".to_owned(),
                media_type: Some("text/plain".to_owned()),
                size: Some(7),
                source: AttachmentSource::Platform {
                    id: "file_1".to_owned(),
                },
            },
            AttachmentRef {
                name: "b.png".to_owned(),
                media_type: None,
                size: None,
                source: AttachmentSource::Url {
                    url: "https://x.example/b.png".to_owned(),
                },
            },
            AttachmentRef {
                name: "c.txt".to_owned(),
                media_type: None,
                size: Some(2),
                source: AttachmentSource::Inline {
                    data_base64: "aGk=".to_owned(),
                },
            },
        ],
        group: true,
        chat: Some("oc_1".to_owned()),
        refused: true,
        follow_up: true,
        unsupported: Some("a sticker".to_owned()),
        interactive: true,
        reply_context: Some(ReplyContext::new("token-SECRET")),
        media_group: Some("13594835521566473".to_owned()),
    }
}

fn inbox_item() -> InboxItem {
    InboxItem {
        seq: 300,
        event: event(),
        thread_id: "0193a1b2c3d4e5f6a7b8c9d0e1f2a3b4".to_owned(),
        fresh_thread: true,
        status: InboxStatus::Running,
        attempts: 2,
        accepted_at_ms: 1_780_000_000_124,
        trace: crate::telemetry::TraceContext::fresh(),
        draft: Some(receipt("om_9")),
    }
}

fn outbox_item(status: OutboxStatus) -> OutboxItem {
    OutboxItem {
        seq: 300 * 65_536 + 1,
        trace: crate::telemetry::TraceContext::fresh(),
        message: OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: "t:300:1".to_owned(),
            conversation: ConversationKey::new("feishu", ["t1", "oc_1", "om_1"]),
            thread_id: "t".to_owned(),
            text: "**done** ✓".to_owned(),
            reply_to: Some("om_1".to_owned()),
            files: vec![OutboundFile {
                name: "charts/cpu.png".to_owned(),
                media_type: "image/png".to_owned(),
                size: 12_345,
            }],
            reply_context: Some(ReplyContext::new("token-SECRET")),
        },
        status,
        attempts: 3,
        last_error: Some("feishu: 99991400 rate limited".to_owned()),
        receipt: Some(receipt("om_2")),
        parts: vec![receipt("om_2"), receipt("om_3")],
        draft: Some(receipt("om_9")),
        created_at_ms: 1,
        finished_at_ms: Some(2),
    }
}

fn messages() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("be brief"),
        ChatMessage::user("plain"),
        ChatMessage::User {
            content: "look".to_owned(),
            parts: vec![
                ContentPart::Text {
                    text: "more".to_owned(),
                },
                ContentPart::Image {
                    url: "data:image/png;base64,AAAA".to_owned(),
                },
            ],
            authored: None,
        },
        ChatMessage::User {
            content: "mine\n\n<uploaded_files>a.txt</uploaded_files>".to_owned(),
            parts: Vec::new(),
            authored: Some(Authored { trusted_tail: 35 }),
        },
        ChatMessage::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".to_owned(),
                name: "bash".to_owned(),
                arguments: "{\"command\":\"ls\"}".to_owned(),
            }],
            reasoning: Some("think".to_owned()),
        },
        ChatMessage::tool("call_1", "a b c"),
        ChatMessage::assistant("answer"),
    ]
}

fn round_trip<T: Record + PartialEq + std::fmt::Debug>(value: &T) -> Vec<u8> {
    let bytes = value.to_record().unwrap();
    assert_eq!(bytes[0], T::FORMAT, "a record starts with its format");
    assert!(is_current::<T>(&bytes));
    assert_eq!(&T::from_record(&bytes).unwrap(), value);
    bytes
}

#[test]
fn every_field_of_every_record_comes_back() {
    round_trip(&inbox_item());
    let mut pending = inbox_item();
    pending.status = InboxStatus::Pending;
    pending.draft = None;
    pending.event.attachments.clear();
    pending.event.reply_context = None;
    round_trip(&pending);
    for status in [
        OutboxStatus::Pending,
        OutboxStatus::Sent,
        OutboxStatus::Failed,
    ] {
        round_trip(&outbox_item(status));
    }
    for message in messages() {
        round_trip(&message);
    }
    round_trip(&DedupeEntry {
        expires_at_ms: 9,
        thread_id: "t".to_owned(),
        seq: Some(300),
    });
    round_trip(&DedupeEntry {
        expires_at_ms: 9,
        thread_id: "t".to_owned(),
        seq: None,
    });
}

/// A format never changes once written: these bytes were written by format 1 and must read
/// back as the same values in every later build.
#[test]
fn format_1_bytes_read_back_forever() {
    let dedupe = [1, 0x80, 0x01, 2, b't', b'1', 1, 5];
    assert_eq!(
        DedupeEntry::from_record(&dedupe).unwrap(),
        DedupeEntry {
            expires_at_ms: 128,
            thread_id: "t1".to_owned(),
            seq: Some(5),
        }
    );
    let tool = [1, 3, 1, b'c', 2, b'o', b'k'];
    assert_eq!(
        ChatMessage::from_record(&tool).unwrap(),
        ChatMessage::tool("c", "ok")
    );
    let user = [1, 1, 2, b'h', b'i', 0];
    assert_eq!(
        ChatMessage::from_record(&user).unwrap(),
        ChatMessage::user("hi"),
        "a message stored before format 2 has no author"
    );
}

/// Format 2 of messages is format 1 and then who wrote a user message.
#[test]
fn format_2_messages_are_format_1_and_the_author() {
    let tool = [2, 3, 1, b'c', 2, b'o', b'k', 0];
    assert_eq!(ChatMessage::tool("c", "ok").to_record().unwrap(), tool);
    assert_eq!(
        ChatMessage::from_record(&tool).unwrap(),
        ChatMessage::tool("c", "ok")
    );
    let user = [2, 1, 2, b'h', b'i', 0, 1, 4];
    let authored = ChatMessage::User {
        content: "hi".to_owned(),
        parts: Vec::new(),
        authored: Some(Authored { trusted_tail: 4 }),
    };
    assert_eq!(authored.to_record().unwrap(), user);
    assert_eq!(ChatMessage::from_record(&user).unwrap(), authored);
}

/// Inbox items written before format 2 (by an antler that stopped with messages waiting) are
/// read as they were, with nothing of an album.
#[test]
fn format_1_inbox_items_are_still_read() {
    let mut item = inbox_item();
    item.event.media_group = None;
    let v1 = InboxV1 {
        seq: item.seq,
        event: EventV1::of(&item.event),
        thread_id: text(&item.thread_id),
        fresh_thread: item.fresh_thread,
        running: true,
        attempts: item.attempts,
        accepted_at_ms: item.accepted_at_ms,
        draft: receipt_id(&item.draft),
    };
    let bytes = write(InboxItem::WHAT, INBOX_V1, &v1).unwrap();
    assert_eq!(bytes[0], 1);
    let read = InboxItem::from_record(&bytes).unwrap();
    // Format 1 had no trace: the item gets a fresh one.
    assert_eq!(
        read,
        InboxItem {
            trace: read.trace,
            ..item
        }
    );
    assert!(
        !is_current::<InboxItem>(&bytes),
        "format 1 is read, no longer written"
    );
}

/// Inbox items of format 2 (before traces) are read with a fresh trace, everything else as
/// it was.
#[test]
fn format_2_inbox_items_are_read_with_a_fresh_trace() {
    let item = inbox_item();
    let v2 = InboxV2 {
        v1: InboxV1 {
            seq: item.seq,
            event: EventV1::of(&item.event),
            thread_id: text(&item.thread_id),
            fresh_thread: item.fresh_thread,
            running: true,
            attempts: item.attempts,
            accepted_at_ms: item.accepted_at_ms,
            draft: receipt_id(&item.draft),
        },
        media_group: opt_text(&item.event.media_group),
    };
    let bytes = write(InboxItem::WHAT, INBOX_V2, &v2).unwrap();
    let read = InboxItem::from_record(&bytes).unwrap();
    assert_ne!(read.trace, item.trace);
    assert_eq!(read.trace.trace_hex().len(), 32);
    assert_eq!(
        read,
        InboxItem {
            trace: read.trace,
            ..item.clone()
        }
    );
    assert!(
        !is_current::<InboxItem>(&bytes),
        "format 2 is read, no longer written"
    );
    // Format 3 is format 2 and the 24 bytes of the trace, nothing more.
    let current = item.to_record().unwrap();
    assert_eq!(current.len(), bytes.len() + 24);
    assert_eq!(InboxItem::from_record(&current).unwrap().trace, item.trace);
}

/// Outbox items of format 1 (before traces) are read with a fresh trace.
#[test]
fn format_1_outbox_items_are_read_with_a_fresh_trace() {
    let item = outbox_item(OutboxStatus::Pending);
    let current = item.to_record().unwrap();
    assert_eq!(current[0], 2);
    let OutboxV2 { v1, trace } = read(OutboxItem::WHAT, OutboxItem::FORMAT, &current).unwrap();
    assert_eq!(trace.into_context(), item.trace);
    let old = write(OutboxItem::WHAT, OUTBOX_V1, &v1).unwrap();
    assert_eq!(old.len() + 24, current.len());
    let read = OutboxItem::from_record(&old).unwrap();
    assert_ne!(read.trace, item.trace);
    assert_eq!(
        read,
        OutboxItem {
            trace: read.trace,
            ..item
        }
    );
}

#[test]
fn what_is_not_a_current_record_is_refused_with_what_it_is() {
    let json = serde_json::to_vec(&inbox_item()).unwrap();
    let err = InboxItem::from_record(&json).unwrap_err().to_string();
    assert!(
        err.contains("inbox item") && err.contains("not migrated"),
        "{err}"
    );
    assert!(!is_current::<InboxItem>(&json));

    let mut unknown = inbox_item().to_record().unwrap();
    unknown[0] = 9;
    let err = InboxItem::from_record(&unknown).unwrap_err().to_string();
    assert!(err.contains("unknown record format 9"), "{err}");

    let mut longer = outbox_item(OutboxStatus::Sent).to_record().unwrap();
    longer.push(0);
    let err = OutboxItem::from_record(&longer).unwrap_err().to_string();
    assert!(err.contains("1 bytes after the record"), "{err}");

    let whole = ChatMessage::assistant("answer").to_record().unwrap();
    assert!(ChatMessage::from_record(&whole[..whole.len() - 1]).is_err());
    assert!(ChatMessage::from_record(&[]).is_err());
}

#[test]
fn no_format_can_be_mistaken_for_json() {
    for format in [
        InboxItem::FORMAT,
        OutboxItem::FORMAT,
        ChatMessage::FORMAT,
        DedupeEntry::FORMAT,
    ] {
        assert_ne!(format, JSON_RECORD);
    }
}

/// The point of the records: the bytes written with every message shrink, the plain ones
/// (a short message, its reply, the answer in the thread) included.
#[test]
fn records_are_smaller_than_the_json_they_replace() {
    fn percent<T: Record + serde::Serialize>(value: &T) -> usize {
        value.to_record().unwrap().len() * 100 / serde_json::to_vec(value).unwrap().len()
    }
    let mut plain = inbox_item();
    plain.event = crate::test_support::event("c1", "m1", "what is the status of eu?");
    plain.status = InboxStatus::Pending;
    plain.attempts = 0;
    plain.draft = None;
    let mut reply = outbox_item(OutboxStatus::Pending);
    reply.message.files.clear();
    reply.message.reply_context = None;
    reply.message.text = "All three pods in eu run the new build.".to_owned();
    reply.last_error = None;
    reply.receipt = None;
    reply.parts.clear();
    reply.draft = None;
    reply.finished_at_ms = None;
    let answer = ChatMessage::assistant("All three pods in eu run the new build.");
    let sizes = [
        percent(&inbox_item()),
        percent(&plain),
        percent(&outbox_item(OutboxStatus::Sent)),
        percent(&reply),
        percent(&answer),
    ];
    // Measured: [30, 36, 29, 40, 61].
    let at_most = [40, 45, 40, 50, 70];
    assert!(
        sizes
            .iter()
            .zip(at_most)
            .all(|(&size, bound)| size <= bound),
        "record sizes in % of the JSON: {sizes:?}"
    );
}
