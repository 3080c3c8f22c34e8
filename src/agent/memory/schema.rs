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
    /// `preference`, `knowledge`, `context`, `behavior`, `goal` or `correction`.
    pub(crate) category: String,
    pub(crate) confidence: f32,
    /// RFC 3339.
    pub(crate) created_at: String,
    /// RFC 3339; documents written before it existed read as "".
    #[serde(default)]
    pub(crate) updated_at: String,
    /// Where it was learned.
    #[serde(default, deserialize_with = "source_compat")]
    pub(crate) source: FactSource,
}

/// Where a fact was learned.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FactSource {
    /// The thread whose conversation taught it (empty for facts added by hand).
    #[serde(default)]
    pub(crate) thread_id: String,
}

/// Reads `source` as the object it is now or as the plain thread id older documents hold.
fn source_compat<'de, D>(deserializer: D) -> Result<FactSource, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Object(FactSource),
        Plain(String),
    }
    Ok(match Either::deserialize(deserializer)? {
        Either::Object(source) => source,
        Either::Plain(thread_id) => FactSource { thread_id },
    })
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

/// A conversation waiting for the memory updater. The queue keeps one per (user, thread): a
/// newer entry for the same pair replaces the older one (newest wins).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemoryUpdate {
    /// Whose memory (`<channel>:<user id>` or `person:<name>`, see `identity`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_of_older_documents_still_read() {
        let old = r#"{"version":1,"facts":[{"id":"f1","content":"likes tea","category":"preference",
            "confidence":0.9,"createdAt":"2026-01-01T00:00:00Z","source":"t1"}]}"#;
        let doc: MemoryDocument = serde_json::from_str(old).unwrap();
        assert_eq!(doc.facts[0].source.thread_id, "t1");
        assert_eq!(doc.facts[0].updated_at, "");
        let json = serde_json::to_value(&doc).unwrap();
        assert_eq!(json["facts"][0]["source"]["threadId"], "t1");
        let again: MemoryDocument = serde_json::from_value(json).unwrap();
        assert_eq!(again, doc);
    }
}
