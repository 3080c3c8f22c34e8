//! What several modules' unit tests share: an inbound event builder and a channel that records
//! what it was asked to send, failing first as scripted.

use std::sync::Mutex;

use antler_channel::{
    Channel, ChannelError, ConversationKey, InboundEvent, OutboundMessage, Parsed, Receipt,
    UserRef, WebhookRequest,
};

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
        },
        text: text.to_owned(),
        reply_to: None,
        received_at_ms: 1,
        attachments: Vec::new(),
        group: false,
        chat: None,
        refused: false,
        interactive: false,
    }
}

/// The `api` channel as a recorder: each send takes the next scripted failure, if any, else
/// succeeds and is recorded.
#[derive(Debug, Default)]
pub(crate) struct RecordingChannel {
    pub(crate) failures: Mutex<Vec<ChannelError>>,
    pub(crate) sent: Mutex<Vec<String>>,
}

impl RecordingChannel {
    /// The texts sent so far, in order.
    pub(crate) fn sent(&self) -> Vec<String> {
        self.sent.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl Channel for RecordingChannel {
    fn name(&self) -> &'static str {
        "api"
    }

    fn verify(&self, _: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        Ok(())
    }

    fn parse(&self, _: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        Ok(Parsed::Ignore)
    }

    async fn send(&self, message: &OutboundMessage) -> Result<Receipt, ChannelError> {
        let failure = {
            let mut failures = self.failures.lock().unwrap();
            (!failures.is_empty()).then(|| failures.remove(0))
        };
        if let Some(failure) = failure {
            return Err(failure);
        }
        self.sent.lock().unwrap().push(message.text.clone());
        Ok(Receipt {
            platform_message_id: format!("pm-{}", message.text),
        })
    }
}
