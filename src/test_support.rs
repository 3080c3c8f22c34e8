//! What several modules' unit tests share: an inbound event builder, the testkit's channel
//! that records what it was asked to send, failing first as scripted, and log capture.

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

/// The log lines written on this thread while the [`CapturedLogs`] lives, at `level` and
/// above, as plain text: for tests on a current-thread runtime, where everything the code
/// under test spawns logs on the test's thread.
///
/// tracing caches per call site whether anyone listens, across threads; a thread-local
/// subscriber racing with other tests that hit the same call sites unheard (another test's
/// `serve`) could find a site cached as unheard and miss its line. A global subscriber that
/// listens to everything and keeps nothing, installed once, means no site is ever cached as
/// unheard, so the thread-local one sees every line.
pub(crate) fn capture_logs(level: tracing::Level) -> CapturedLogs {
    static EVERYTHING_HEARD: std::sync::Once = std::sync::Once::new();
    EVERYTHING_HEARD.call_once(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
    let lines = LogBuffer::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(level)
        .with_ansi(false)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    CapturedLogs {
        lines,
        _guard: guard,
    }
}

/// Logs captured by [`capture_logs`].
pub(crate) struct CapturedLogs {
    lines: LogBuffer,
    _guard: tracing::subscriber::DefaultGuard,
}

impl CapturedLogs {
    /// What was written so far.
    pub(crate) fn text(&self) -> String {
        let bytes = self.lines.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The bytes the capturing subscriber writes.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut bytes) = self.0.lock() {
            bytes.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
