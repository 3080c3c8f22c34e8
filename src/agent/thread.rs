//! The durable state of one conversation thread.
//!
//! The store keeps a thread's metadata apart from its messages and writes messages append-only
//! (one record each), so a turn writes what it added, not the whole history. A failed turn's
//! messages stay in the thread, marked as failed: people can still read them, the model never
//! sees them again, and a resend of the same question reads naturally.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::de::DeserializeOwned;
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

/// A question the agent asked the user; the user's next message answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PendingQuestion {
    /// What was asked.
    pub(crate) question: String,
    /// Suggested answers; a reply that is just a number picks one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) options: Vec<String>,
}

impl PendingQuestion {
    /// The question as the user sees it: the text, then the options numbered.
    pub(crate) fn render(&self) -> String {
        let mut text = self.question.trim().to_owned();
        for (index, option) in self.options.iter().enumerate() {
            text.push_str(if index == 0 { "\n\n" } else { "\n" });
            text.push_str(&format!("{}. {}", index + 1, option.trim()));
        }
        text
    }

    /// The answer `reply` gives: the option it names by number, else the reply itself.
    pub(crate) fn answer(&self, reply: &str) -> String {
        reply
            .trim()
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|index| self.options.get(index))
            .map_or_else(|| reply.to_owned(), Clone::clone)
    }
}

/// A middleware's own state, kept in the thread under its key.
pub(crate) trait Extension: Serialize + DeserializeOwned {
    /// The key, unique among middlewares (`todo`, `summary`).
    const KEY: &'static str;
}

/// Middleware state by key, persisted with the thread as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Extensions(BTreeMap<String, serde_json::Value>);

impl Extensions {
    /// The value of `T`, if the thread has one that still reads as a `T`. One that does not
    /// (written by another version) is treated as absent, and logged.
    pub(crate) fn get<T: Extension>(&self) -> Option<T> {
        let value = self.0.get(T::KEY)?;
        match T::deserialize(value) {
            Ok(value) => Some(value),
            Err(e) => {
                tracing::warn!(key = T::KEY, error = %e, "unreadable thread extension ignored");
                None
            }
        }
    }

    /// Sets the value of `T`.
    pub(crate) fn set<T: Extension>(&mut self, value: &T) {
        match serde_json::to_value(value) {
            Ok(value) => {
                self.0.insert(T::KEY.to_owned(), value);
            }
            Err(e) => tracing::warn!(key = T::KEY, error = %e, "thread extension not saved"),
        }
    }

    /// Removes the value of `T`.
    pub(crate) fn remove<T: Extension>(&mut self) {
        self.0.remove(T::KEY);
    }

    /// Whether no middleware keeps state here.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
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
    /// The question the last run asked the user, until the user answers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pending_question: Option<PendingQuestion>,
    /// State the middlewares keep (a todo list, a summary, promoted tools).
    #[serde(default, skip_serializing_if = "Extensions::is_empty")]
    pub(crate) extensions: Extensions,
    /// The trace id (32 hex) of the last turn run on this thread, for `/status` and the admin
    /// page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_trace: Option<String>,
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
            pending_question: None,
            extensions: Extensions::default(),
            last_trace: None,
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

    /// The index of the current turn's user message: where the running turn started, else
    /// (a thread run outside the turn runner, as in tests) the last user message.
    #[must_use]
    pub(crate) fn turn_start(&self) -> Option<usize> {
        match self.running {
            Some(running)
                if matches!(
                    self.messages.get(running.start),
                    Some(ChatMessage::User { .. })
                ) =>
            {
                Some(running.start)
            }
            _ => self
                .messages
                .iter()
                .rposition(|m| matches!(m, ChatMessage::User { .. })),
        }
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

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Todos {
        items: Vec<String>,
    }

    impl Extension for Todos {
        const KEY: &'static str = "todo";
    }

    #[test]
    fn extensions_are_typed_and_persist_with_the_thread() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        assert_eq!(thread.extensions.get::<Todos>(), None);
        let todos = Todos {
            items: vec!["deploy".into()],
        };
        thread.extensions.set(&todos);
        thread.pending_question = Some(PendingQuestion {
            question: "Which cluster?".into(),
            options: vec!["prod".into(), "staging".into()],
        });
        let stored = serde_json::to_string(&thread).unwrap();
        let loaded: ThreadState = serde_json::from_str(&stored).unwrap();
        assert_eq!(loaded.extensions.get::<Todos>(), Some(todos));
        assert_eq!(loaded.pending_question, thread.pending_question);
        // A value that no longer reads as the type is absent, not an error.
        let mut broken = loaded.clone();
        broken
            .extensions
            .0
            .insert("todo".into(), serde_json::json!({"items": 3}));
        assert_eq!(broken.extensions.get::<Todos>(), None);
        broken.extensions.remove::<Todos>();
        assert!(broken.extensions.is_empty());
        // A thread stored before extensions existed still loads.
        let old: ThreadState = serde_json::from_str(
            r#"{"id":"t","conversation":"c","generation":0,"created_at_ms":0,"updated_at_ms":0}"#,
        )
        .unwrap();
        assert!(old.extensions.is_empty() && old.pending_question.is_none());
    }

    #[test]
    fn a_numbered_reply_picks_an_option() {
        let question = PendingQuestion {
            question: "Which cluster?".into(),
            options: vec!["prod".into(), "staging".into()],
        };
        assert_eq!(question.render(), "Which cluster?\n\n1. prod\n2. staging");
        assert_eq!(question.answer(" 2 "), "staging");
        assert_eq!(question.answer("3"), "3");
        assert_eq!(question.answer("the big one"), "the big one");
    }

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
