//! What the schema-2 store in `tests/fixtures/store-schema2/` holds (tests): a real store
//! written by antler's schema-2 build (commit `532a9a9`, JSON records) from these values, so
//! the migration to the current records is tested on the bytes an older antler left, not on
//! bytes this build imitates. It was made at that commit by a test that opened a `SledStore`
//! there, accepted [`events`] (each through [`accept_of`]), started the first, finished it with
//! the thread titled "Deploy eu", one turn, [`turn_messages`] and [`replies`], delivered the
//! first reply's two [`receipts`] (the second completing it), failed the second reply once with
//! [`DELIVERY_ERROR`], then started the second message and saved its [`draft`].
//!
//! It holds every field the hot records carry: a finished turn (its thread's messages of every
//! kind, one reply delivered in two parts, one failing with files and a reply context), a
//! message waiting with attachments of every source, and one running with its draft saved.

use antler_channel::{
    AttachmentRef, AttachmentSource, ConversationKey, InboundEvent, OutboundFile, OutboundMessage,
    Receipt, ReplyContext, UserRef,
};

use crate::agent::message::{ChatMessage, ContentPart, ToolCall};
use crate::store::{Accept, ThreadChoice};

/// When everything in the fixture happened.
pub(super) const NOW_MS: u64 = 1_780_000_000_000;
/// The TTL the fixture's messages were accepted with: their dedupe keys are still live when
/// the test runs at [`NOW_MS`].
pub(super) const TTL_MS: u64 = 86_400_000;

fn user() -> UserRef {
    UserRef {
        id: "U42".to_owned(),
        name: Some("Ada".to_owned()),
        admin: true,
        aliases: vec!["ou_42".to_owned()],
    }
}

/// The three messages the fixture accepted, in order: the one whose turn finished, the one
/// left running (with a draft) and the one left waiting.
pub(super) fn events() -> [InboundEvent; 3] {
    let base = InboundEvent {
        channel: "slack".to_owned(),
        event_id: "Ev1".to_owned(),
        conversation: ConversationKey::new("slack", ["T1", "C1", "1700.1"]),
        user: user(),
        text: "deploy the *eu* cluster?".to_owned(),
        reply_to: Some("1700.1".to_owned()),
        received_at_ms: NOW_MS,
        attachments: Vec::new(),
        group: true,
        chat: Some("C1".to_owned()),
        refused: false,
        follow_up: false,
        unsupported: None,
        interactive: false,
        reply_context: None,
        media_group: None,
    };
    let running = InboundEvent {
        event_id: "Ev2".to_owned(),
        text: "and the us one".to_owned(),
        follow_up: true,
        interactive: true,
        reply_context: Some(ReplyContext::new("interaction-token-SECRET")),
        ..base.clone()
    };
    let waiting = InboundEvent {
        event_id: "Ev3".to_owned(),
        text: "here are the logs ✓".to_owned(),
        attachments: vec![
            AttachmentRef {
                name: "app.log".to_owned(),
                media_type: Some("text/plain".to_owned()),
                size: Some(2048),
                source: AttachmentSource::Platform {
                    id: "F123".to_owned(),
                },
            },
            AttachmentRef {
                name: "chart.png".to_owned(),
                media_type: None,
                size: None,
                source: AttachmentSource::Url {
                    url: "https://files.example/chart.png".to_owned(),
                },
            },
            AttachmentRef {
                name: "note.txt".to_owned(),
                media_type: Some("text/plain".to_owned()),
                size: Some(5),
                source: AttachmentSource::Inline {
                    data_base64: "aGVsbG8=".to_owned(),
                },
            },
        ],
        refused: true,
        unsupported: Some("a voice note".to_owned()),
        reply_to: None,
        ..base.clone()
    };
    [base, running, waiting]
}

/// The accept of `event`, as the fixture made it.
pub(super) fn accept_of(event: InboundEvent) -> Accept {
    Accept {
        dedupe_ttl_ms: TTL_MS,
        trace: crate::telemetry::TraceContext::fresh(),
        event,
        thread: ThreadChoice::Current,
        now_ms: NOW_MS,
    }
}

/// The messages the finished turn added to its thread: one of every kind.
pub(super) fn turn_messages() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("You are antler."),
        ChatMessage::User {
            content: "deploy the *eu* cluster?".to_owned(),
            parts: vec![
                ContentPart::Text {
                    text: "see the chart".to_owned(),
                },
                ContentPart::Image {
                    url: "data:image/png;base64,iVBORw0KGgo=".to_owned(),
                },
            ],
            authored: None,
        },
        ChatMessage::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".to_owned(),
                name: "bash".to_owned(),
                arguments: r#"{"command":"kubectl get pods"}"#.to_owned(),
            }],
            reasoning: Some("check the pods first".to_owned()),
        },
        ChatMessage::tool("call_1", "pod/web-1 Running"),
        ChatMessage::assistant("Deployed. All pods run."),
    ]
}

/// The finished turn's replies: the first is delivered in two parts, the second fails.
pub(super) fn replies(thread_id: &str, inbox_seq: u64) -> Vec<OutboundMessage> {
    let reply = |index: u64, text: &str| OutboundMessage {
        prompts: Vec::new(),
        idempotency_key: format!("{thread_id}:{inbox_seq}:{index}"),
        conversation: ConversationKey::new("slack", ["T1", "C1", "1700.1"]),
        thread_id: thread_id.to_owned(),
        text: text.to_owned(),
        reply_to: Some("1700.1".to_owned()),
        files: Vec::new(),
        reply_context: None,
    };
    vec![
        reply(0, "Deployed. All pods run."),
        OutboundMessage {
            prompts: Vec::new(),
            files: vec![OutboundFile {
                name: "charts/cpu.png".to_owned(),
                media_type: "image/png".to_owned(),
                size: 12_345,
            }],
            reply_context: Some(ReplyContext::new("interaction-token-SECRET")),
            ..reply(1, "The chart.")
        },
    ]
}

/// The receipts of the first reply's two parts.
pub(super) fn receipts() -> [Receipt; 2] {
    ["1700.2", "1700.3"].map(|id| Receipt {
        platform_message_id: id.to_owned(),
    })
}

/// The running message's draft.
pub(super) fn draft() -> Receipt {
    Receipt {
        platform_message_id: "1700.9".to_owned(),
    }
}

/// The failing reply's error.
pub(super) const DELIVERY_ERROR: &str = "slack: ratelimited (retry after 30 s)";
