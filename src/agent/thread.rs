//! The durable state of one conversation thread.

use serde::{Deserialize, Serialize};

use super::message::{ChatMessage, TokenUsage};

/// Everything the runtime knows about one thread; persisted whole after every turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ThreadState {
    /// The thread id (opaque, unique).
    pub(crate) id: String,
    /// The conversation this thread belongs to.
    pub(crate) conversation: String,
    /// The conversation's generation this thread was started in (`/new` increments it).
    pub(crate) generation: u64,
    /// A short title, set after the first exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) title: Option<String>,
    /// The history, including tool calls and tool results.
    #[serde(default)]
    pub(crate) messages: Vec<ChatMessage>,
    /// Tokens used by all turns of this thread.
    #[serde(default)]
    pub(crate) usage: TokenUsage,
    /// Turns completed on this thread.
    #[serde(default)]
    pub(crate) turns: u64,
    /// Set while a turn runs (so only in mid-turn checkpoints): the inbox item the turn is
    /// for. A re-run of that item after a crash continues from the checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) checkpoint_of: Option<u64>,
    /// Creation time, milliseconds since the Unix epoch.
    pub(crate) created_at_ms: u64,
    /// Last update, milliseconds since the Unix epoch.
    pub(crate) updated_at_ms: u64,
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
            usage: TokenUsage::default(),
            turns: 0,
            checkpoint_of: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        }
    }
}
