//! What several modules' unit tests share: an inbound event builder, and the testkit's channel
//! that records what it was asked to send, failing first as scripted.

use antler_channel::{ConversationKey, InboundEvent, UserRef};
pub(crate) use antler_testkit::RecordingChannel;

/// An API-channel message from user `u1` in `conversation`.
pub(crate) fn event(conversation: &str, event_id: &str, text: &str) -> InboundEvent {
    InboundEvent {
        channel: "api".to_owned(),
        event_id: event_id.to_owned(),
        conversation: ConversationKey::new("api", [conversation]),
        user: UserRef {
            id: "u1".to_owned(),
            name: None,
            admin: false,
            aliases: Vec::new(),
        },
        text: text.to_owned(),
        reply_to: None,
        received_at_ms: 1,
        attachments: Vec::new(),
        group: false,
        chat: None,
        refused: false,
        follow_up: false,
        unsupported: None,
        interactive: false,
        reply_context: None,
        media_group: None,
    }
}
