//! Live replies: while an agent turn runs on a channel that can edit messages
//! ([`Limits::edits`]), its streamed text is shown in one draft message, edited at the
//! channel's pace.
//!
//! The draft is best effort and never holds the answer: deltas are not stored, a failed edit
//! only costs the preview, and the final answer always arrives in full through the outbox,
//! which edits the draft into the answer's first part. What is stored is the draft's platform
//! id, as soon as the platform created it, so a turn re-run after a crash writes into the same
//! draft (and its answer replaces it) instead of leaving a half answer in the chat.
//!
//! While no text is being written, the draft shows what runs: the tool that started last, or,
//! when tool calls report progress (a subagent task's "⏳ check the logs" … "✅ check the logs ·
//! 12 s"), one line per call, each edited in place as its call reports again.
//!
//! An answer that is complete within the first interval gets no draft at all: it is sent once,
//! whole. Only the first part of the text is shown (the rest arrives with the answer), so the
//! text kept is capped at [`KEPT_BYTES`].

use crate::store::{InboxItem, InboxStore};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use antler_channel::{Channel, ChannelError, Limits, OutboundMessage, Part, Receipt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The most streamed text kept for the draft: far more Markdown than one message shows.
const KEPT_BYTES: usize = 32 * 1024;

/// Progress lines shown at most (the newest calls'), and the longest line kept.
const MAX_NOTE_LINES: usize = 8;
const MAX_NOTE_CHARS: usize = 200;

/// How long the end of a turn waits for a draft request already on its way.
const FINISH_WAIT: Duration = Duration::from_secs(10);

/// What the draft should show now.
#[derive(Debug, Default)]
struct Preview {
    /// The current model call's text so far (at most [`KEPT_BYTES`]).
    text: String,
    /// What the turn is doing when there is no text (a tool running).
    status: Option<String>,
    /// The latest progress line of each call that reported one, by call id, oldest first.
    notes: Vec<(String, String)>,
}

impl Preview {
    fn markdown(&self) -> Option<String> {
        if !self.text.trim().is_empty() {
            return Some(self.text.clone());
        }
        if self.notes.is_empty() {
            return self.status.clone();
        }
        let lines: Vec<&str> = self.notes.iter().map(|(_, line)| line.as_str()).collect();
        Some(lines.join("\n"))
    }
}

#[derive(Debug, Default)]
struct Shared {
    preview: Mutex<Preview>,
    changed: Notify,
}

/// The draft of one running turn. [`Draft::finish`] ends it.
#[derive(Debug)]
pub(crate) struct Draft {
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: JoinHandle<Option<Receipt>>,
}

impl Draft {
    /// Starts the draft of `item`'s turn when `channel` can edit messages and shows this reply
    /// live ([`Channel::live_reply`]); `None` otherwise.
    pub(crate) fn start(
        store: Arc<dyn InboxStore>,
        channel: Arc<dyn Channel>,
        item: &InboxItem,
    ) -> Option<Self> {
        let Limits {
            edits: Some(rate), ..
        } = channel.limits()
        else {
            return None;
        };
        let message = OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: format!("{}:{}:draft", item.thread_id, item.seq),
            conversation: item.event.conversation.clone(),
            thread_id: item.thread_id.clone(),
            text: String::new(),
            reply_to: item.event.reply_to.clone(),
            files: Vec::new(),
            reply_context: item.event.reply_context.clone(),
        };
        if !channel.live_reply(&message) {
            return None;
        }
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        let writer = Writer {
            store,
            channel,
            seq: item.seq,
            message,
            draft: item.draft.clone(),
            interval: rate.interval(item.event.group),
        };
        let task = tokio::spawn(writer.run(Arc::clone(&shared), stop.clone()));
        Some(Self { shared, stop, task })
    }

    /// A piece of the answer being written.
    pub(crate) fn delta(&self, text: &str) {
        self.update(|preview| {
            let room = KEPT_BYTES.saturating_sub(preview.text.len());
            let mut end = room.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            preview.text.push_str(&text[..end]);
        });
    }

    /// A tool call started: the text so far led up to it, and the next model call writes anew.
    pub(crate) fn tool_started(&self, name: &str) {
        self.update(|preview| {
            preview.text.clear();
            preview.status = Some(format!("⏳ _{name}_ …"));
        });
    }

    /// A running call reported progress: its line, replacing the call's earlier one.
    pub(crate) fn note(&self, call_id: &str, line: &str) {
        let line: String = line
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(MAX_NOTE_CHARS)
            .collect();
        self.update(|preview| {
            preview.text.clear();
            match preview.notes.iter_mut().find(|(id, _)| id == call_id) {
                Some((_, shown)) => *shown = line,
                None => {
                    if preview.notes.len() == MAX_NOTE_LINES {
                        preview.notes.remove(0);
                    }
                    preview.notes.push((call_id.to_owned(), line));
                }
            }
        });
    }

    fn update(&self, change: impl FnOnce(&mut Preview)) {
        if let Ok(mut preview) = self.shared.preview.lock() {
            change(&mut preview);
        }
        self.shared.changed.notify_one();
    }

    /// Stops writing (a request on its way is waited for, so no edit lands after the answer)
    /// and returns the draft message, if there is one.
    pub(crate) async fn finish(self) -> Option<Receipt> {
        self.stop.cancel();
        let mut task = self.task;
        match tokio::time::timeout(FINISH_WAIT, &mut task).await {
            Ok(Ok(draft)) => draft,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the draft writer failed");
                None
            }
            Err(_) => {
                task.abort();
                None
            }
        }
    }
}

/// The task that sends and edits the draft.
struct Writer {
    store: Arc<dyn InboxStore>,
    channel: Arc<dyn Channel>,
    seq: u64,
    message: OutboundMessage,
    draft: Option<Receipt>,
    interval: Duration,
}

impl Writer {
    async fn run(mut self, shared: Arc<Shared>, stop: CancellationToken) -> Option<Receipt> {
        let label = self.channel.name();
        // No draft before one interval has passed: a quick answer is sent once, whole.
        let mut next_at = Instant::now() + self.interval;
        let mut shown: Option<String> = None;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = shared.changed.notified() => {}
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = tokio::time::sleep_until(next_at) => {}
            }
            let markdown = match shared.preview.lock() {
                Ok(preview) => preview.markdown(),
                Err(_) => None,
            };
            let Some(body) = markdown
                .and_then(|markdown| self.channel.render(&markdown).ok())
                .and_then(|parts| parts.into_iter().next())
            else {
                continue;
            };
            if shown.as_ref() == Some(&body) {
                continue;
            }
            match self.write(&body).await {
                Ok(()) => {
                    metrics::counter!("antler_draft_updates_total", "channel" => label)
                        .increment(1);
                    shown = Some(body);
                    next_at = Instant::now() + self.interval;
                }
                Err(ChannelError::RateLimited { retry_after }) => {
                    next_at = Instant::now() + retry_after.max(self.interval);
                    // Try again then even if nothing new arrives.
                    shared.changed.notify_one();
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(seq = self.seq, error = %e, "draft update failed");
                    next_at = Instant::now() + self.interval * 2;
                    shared.changed.notify_one();
                }
                Err(e) => {
                    // The answer still arrives whole; only the preview stops.
                    tracing::warn!(seq = self.seq, error = %e, "draft update failed; no more previews for this turn");
                    metrics::counter!("antler_draft_failures_total", "channel" => label)
                        .increment(1);
                    break;
                }
            }
        }
        self.draft
    }

    /// Creates the draft (and saves its id at once) or edits it to `body`.
    async fn write(&mut self, body: &str) -> Result<(), ChannelError> {
        let part = Part {
            index: 0,
            body,
            buttons: &[],
        };
        if let Some(draft) = &self.draft {
            return self.channel.edit(&self.message, draft, part).await;
        }
        let draft = self.channel.send(&self.message, part).await?;
        if let Err(e) = self.store.save_draft(self.seq, &draft).await {
            // Still used by this run; only a crash before the answer would leave it behind.
            tracing::warn!(seq = self.seq, error = %e, "cannot save the draft's id");
        }
        self.draft = Some(draft);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
