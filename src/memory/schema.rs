//! The memory document, in DeerFlow's JSON shape (camelCase keys), and a queued update.

use serde::{Deserialize, Serialize};

use crate::agent::message::ChatMessage;

/// One summary slot: text and when it was last rewritten.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct Summary {
    pub(crate) summary: String,
    pub(crate) updated_at: String,
}

/// What the agent knows about the user now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct UserContext {
    pub(crate) work_context: Summary,
    pub(crate) personal_context: Summary,
    pub(crate) top_of_mind: Summary,
}

/// What happened over time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct History {
    pub(crate) recent_months: Summary,
    pub(crate) earlier_context: Summary,
    pub(crate) long_term_background: Summary,
}

/// One remembered fact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Fact {
    pub(crate) id: String,
    pub(crate) content: String,
    pub(crate) category: String,
    pub(crate) confidence: f32,
    pub(crate) created_at: String,
    pub(crate) source: String,
}

/// One user's memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemoryDocument {
    pub(crate) version: u32,
    #[serde(default)]
    pub(crate) user: UserContext,
    #[serde(default)]
    pub(crate) history: History,
    #[serde(default)]
    pub(crate) facts: Vec<Fact>,
}

impl Default for MemoryDocument {
    fn default() -> Self {
        Self {
            version: 1,
            user: UserContext::default(),
            history: History::default(),
            facts: Vec::new(),
        }
    }
}

/// A conversation waiting for the memory updater. The queue keeps one per thread: a newer
/// entry for the same thread replaces the older one (newest wins).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemoryUpdate {
    /// Whose memory (`<channel>:<user id>`).
    pub(crate) user_id: String,
    /// The thread the conversation comes from.
    pub(crate) thread_id: String,
    /// Human messages and final answers only.
    pub(crate) messages: Vec<ChatMessage>,
    /// When it was queued (ms since the epoch); also its version for removal.
    pub(crate) enqueued_at_ms: u64,
    /// When the debounce window ends and it may be processed.
    pub(crate) due_at_ms: u64,
}
