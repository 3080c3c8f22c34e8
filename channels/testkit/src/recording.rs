//! A channel that records what it was asked to send and edit, failing first as scripted: the
//! channel the gateway's delivery, draft and ingress tests deliver through.

use std::sync::Mutex;

use antler_channel::{
    Channel, ChannelError, EditRate, FileContent, Limits, OutboundFile, OutboundMessage, Parsed,
    Part, Receipt, WebhookRequest,
};

/// The `api` channel as a recorder: each send or edit takes the next scripted failure, if any,
/// else succeeds and is recorded. With a `separator`, a reply's parts are its pieces between
/// separators.
#[derive(Debug, Default)]
pub struct RecordingChannel {
    /// The failures the next sends, edits and file sends meet, first first.
    pub failures: Mutex<Vec<ChannelError>>,
    /// The parts (and `file:<name>=<content>` of files) sent, in order.
    pub sent: Mutex<Vec<String>>,
    /// (message id, new text) of each edit.
    pub edits: Mutex<Vec<(String, String)>>,
    /// Where its rendering cuts a reply into parts (`None`: one part).
    pub separator: Option<&'static str>,
    /// Its edit pace; `Some` turns live drafts on.
    pub edit_rate: Option<EditRate>,
    /// It sends files itself: each is recorded in `sent` as `file:<name>`.
    pub sends_files: bool,
    /// It shows buttons ([`antler_channel::Capabilities::buttons`]); a part's buttons are
    /// recorded after its body (`body [approve:x|deny:x]`).
    pub shows_buttons: bool,
}

impl RecordingChannel {
    /// The texts sent so far, in order.
    pub fn sent(&self) -> Vec<String> {
        self.sent.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The edits so far, in order.
    pub fn edits(&self) -> Vec<(String, String)> {
        self.edits.lock().map(|e| e.clone()).unwrap_or_default()
    }

    fn next_failure(&self) -> Option<ChannelError> {
        let mut failures = self.failures.lock().unwrap();
        (!failures.is_empty()).then(|| failures.remove(0))
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

    fn limits(&self) -> Limits {
        Limits {
            message: None,
            edits: self.edit_rate,
        }
    }

    fn render(&self, markdown: &str) -> Result<Vec<String>, ChannelError> {
        Ok(match self.separator {
            Some(separator) => markdown.split(separator).map(str::to_owned).collect(),
            None => vec![markdown.to_owned()],
        })
    }

    async fn send(&self, _: &OutboundMessage, part: Part<'_>) -> Result<Receipt, ChannelError> {
        if let Some(failure) = self.next_failure() {
            return Err(failure);
        }
        let mut sent = part.body.to_owned();
        if !part.buttons.is_empty() {
            let actions: Vec<&str> = part.buttons.iter().map(|b| b.action.as_str()).collect();
            sent.push_str(&format!(" [{}]", actions.join("|")));
        }
        self.sent.lock().unwrap().push(sent);
        Ok(Receipt {
            platform_message_id: format!("pm-{}", part.body),
        })
    }

    fn capabilities(&self) -> antler_channel::Capabilities {
        antler_channel::Capabilities {
            files: self.sends_files,
            buttons: self.shows_buttons,
            ..antler_channel::Capabilities::default()
        }
    }

    async fn send_file(
        &self,
        _: &OutboundMessage,
        file: &OutboundFile,
        content: FileContent,
    ) -> Result<Receipt, ChannelError> {
        if let Some(failure) = self.next_failure() {
            return Err(failure);
        }
        let mut bytes = String::new();
        std::io::Read::read_to_string(&mut { content.file }, &mut bytes).unwrap();
        self.sent
            .lock()
            .unwrap()
            .push(format!("file:{}={bytes}", file.name));
        Ok(Receipt {
            platform_message_id: format!("pm-file-{}", file.name),
        })
    }

    async fn edit(
        &self,
        _: &OutboundMessage,
        sent: &Receipt,
        part: Part<'_>,
    ) -> Result<(), ChannelError> {
        if let Some(failure) = self.next_failure() {
            return Err(failure);
        }
        self.edits
            .lock()
            .unwrap()
            .push((sent.platform_message_id.clone(), part.body.to_owned()));
        Ok(())
    }
}
