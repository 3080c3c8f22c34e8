//! The durable state of one conversation thread.
//!
//! The store keeps a thread's metadata apart from its messages and writes messages append-only
//! (one record each), so a turn writes what it added, not the whole history. A failed turn's
//! messages stay in the thread, marked as failed: people can still read them, the model never
//! sees them again, and a resend of the same question reads naturally.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::message::{ChatMessage, TokenUsage};

/// The turn a thread is in the middle of, recorded with mid-turn checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunningTurn {
    /// The inbox item the turn is for. A re-run of that item after a crash continues from the
    /// checkpoint instead of adding its user message again.
    pub(crate) inbox_seq: u64,
    /// The index of the turn's first message (its user message).
    pub(crate) start: usize,
}

/// Everything the runtime knows about one thread. Its serialized form is the thread's
/// metadata: the messages are stored one record each, apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ThreadState {
    /// The thread id (opaque, unique).
    pub(crate) id: String,
    /// The conversation this thread belongs to.
    pub(crate) conversation: String,
    /// The conversation's generation this thread was started in (`/new` increments it).
    pub(crate) generation: u64,
    /// A short title, set after the first answered exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) title: Option<String>,
    /// The history, including tool calls and tool results.
    #[serde(skip)]
    pub(crate) messages: Vec<ChatMessage>,
    /// Index ranges of `messages` that belong to failed turns: kept for people, never sent to
    /// the model. Sorted and disjoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) failed: Vec<Range<usize>>,
    /// Tokens used by all turns of this thread.
    #[serde(default)]
    pub(crate) usage: TokenUsage,
    /// Turns answered on this thread.
    #[serde(default)]
    pub(crate) turns: u64,
    /// Set while a turn runs (so only in mid-turn checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) running: Option<RunningTurn>,
    /// Creation time, milliseconds since the Unix epoch.
    pub(crate) created_at_ms: u64,
    /// Last update, milliseconds since the Unix epoch.
    pub(crate) updated_at_ms: u64,
    /// How many of `messages` the store already holds; a save writes the rest. Messages are
    /// only ever appended, so the stored prefix never changes.
    #[serde(skip)]
    pub(crate) saved_messages: usize,
}

impl ThreadState {
    /// An empty thread.
    #[must_use]
    pub(crate) fn new(id: String, conversation: String, generation: u64, now_ms: u64) -> Self {
        Self {
            id,
            conversation,
            generation,
            title: None,
            messages: Vec::new(),
            failed: Vec::new(),
            usage: TokenUsage::default(),
            turns: 0,
            running: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            saved_messages: 0,
        }
    }

    /// Whether the message at `index` belongs to a failed turn.
    #[must_use]
    pub(crate) fn is_failed(&self, index: usize) -> bool {
        self.failed.iter().any(|span| span.contains(&index))
    }

    /// The messages the model sees: every message outside the failed turns, in order.
    pub(crate) fn context(&self) -> impl Iterator<Item = &ChatMessage> {
        self.messages
            .iter()
            .enumerate()
            .filter(|(index, _)| !self.is_failed(*index))
            .map(|(_, message)| message)
    }

    /// Marks every message from `start` to the end as part of a failed turn.
    pub(crate) fn fail_from(&mut self, start: usize) {
        let end = self.messages.len();
        if start >= end {
            return;
        }
        // Spans only ever cover the newest messages, so a new span either extends the last
        // one or comes after it.
        match self.failed.last_mut() {
            Some(last) if last.end >= start => last.end = last.end.max(end),
            _ => self.failed.push(start..end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_turns_are_kept_but_left_out_of_the_context() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages.push(ChatMessage::user("one"));
        thread.messages.push(ChatMessage::assistant("answer one"));
        thread.messages.push(ChatMessage::user("two"));
        thread.messages.push(ChatMessage::assistant("⚠️ failed"));
        thread.fail_from(2);
        thread.messages.push(ChatMessage::user("two again"));
        let context: Vec<&ChatMessage> = thread.context().collect();
        assert_eq!(
            context,
            [
                &ChatMessage::user("one"),
                &ChatMessage::assistant("answer one"),
                &ChatMessage::user("two again"),
            ]
        );
        assert!(thread.is_failed(3) && !thread.is_failed(4));
        assert_eq!(thread.failed, [2..4]);
        thread.fail_from(4);
        assert_eq!(thread.failed, [2..5], "adjacent spans merge");
        thread.fail_from(5);
        assert_eq!(thread.failed, [2..5], "an empty span adds nothing");
    }
}
