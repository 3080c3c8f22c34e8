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
    /// What the fact is about, as the updater labelled it; documents written before the
    /// label existed (and facts the model did not label) leave it out, which reads as
    /// personal (`sharing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) about: Option<About>,
    /// Whether its author let it into group chats (`/memory share <n>`); left out when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) shareable: bool,
}

/// What a fact is about: the user's work (their team may hear it) or their own life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum About {
    Work,
    Personal,
}

impl About {
    /// The label as written in documents and replies.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Work => "work",
            Self::Personal => "personal",
        }
    }
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
/// newer entry for the same pair replaces the older one, taking over the older one's
/// messages the updater has not read yet ([`MemoryUpdate::take_unseen`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemoryUpdate {
    /// Whose memory (`<channel>:<user id>` or `person:<name>`, see `identity`).
    pub(crate) user_id: String,
    /// The thread the conversation comes from.
    pub(crate) thread_id: String,
    /// Human messages and final answers only: first `seen` of them the updater already read
    /// (context for the rest), then the new ones.
    pub(crate) messages: Vec<ChatMessage>,
    /// How many of `messages`, from the start, the updater already read (items queued before
    /// the watermark existed read as 0: all new).
    #[serde(default)]
    pub(crate) seen: usize,
    /// The thread index of the first new message: where the conversation's watermark stood
    /// when it was queued (0: the thread from its start).
    #[serde(default)]
    pub(crate) from: usize,
    /// When it was queued (ms since the epoch); also its version for removal.
    pub(crate) enqueued_at_ms: u64,
    /// When the debounce window ends and it may be processed.
    pub(crate) due_at_ms: u64,
}

impl MemoryUpdate {
    /// `self` (the newer update of the same user and thread) replacing `older`, which the
    /// updater has not read: `older`'s messages (its context and its new ones) come first,
    /// then `self`'s new ones, so nothing unread is lost. `self`'s own context is dropped, as
    /// it repeats `older`'s tail. An update that starts at the thread's start (`from` 0)
    /// already holds everything and replaces `older` as it is. At most
    /// `conversation::MAX_MESSAGES` are kept, the newest.
    pub(crate) fn take_unseen(&mut self, older: &MemoryUpdate) {
        if self.from == 0 || older.user_id != self.user_id || older.thread_id != self.thread_id {
            return;
        }
        let new = self.messages.split_off(self.seen.min(self.messages.len()));
        let mut messages = older.messages.clone();
        messages.extend(new);
        let excess = messages
            .len()
            .saturating_sub(super::conversation::MAX_MESSAGES);
        messages.drain(..excess);
        self.seen = older.seen.saturating_sub(excess);
        self.messages = messages;
        self.from = older.from;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(from: usize, seen: usize, texts: &[&str], at: u64) -> MemoryUpdate {
        MemoryUpdate {
            user_id: "api:ada".to_owned(),
            thread_id: "t1".to_owned(),
            messages: texts.iter().map(|t| ChatMessage::user(*t)).collect(),
            seen,
            from,
            enqueued_at_ms: at,
            due_at_ms: at,
        }
    }

    fn texts(update: &MemoryUpdate) -> Vec<&str> {
        update.messages.iter().map(ChatMessage::text).collect()
    }

    #[test]
    fn a_newer_update_keeps_what_the_older_one_had_not_shown_the_updater() {
        let older = update(4, 2, &["old a", "old b", "new 1", "answer 1"], 1);
        let mut newer = update(8, 2, &["new 1", "answer 1", "new 2", "answer 2"], 2);
        newer.take_unseen(&older);
        assert_eq!(
            texts(&newer),
            ["old a", "old b", "new 1", "answer 1", "new 2", "answer 2"]
        );
        assert_eq!((newer.seen, newer.from, newer.enqueued_at_ms), (2, 4, 2));

        // One that covers the thread from its start replaces the older one as it is.
        let mut whole = update(0, 0, &["everything"], 3);
        whole.take_unseen(&older);
        assert_eq!(texts(&whole), ["everything"]);

        // Bounded: the oldest go, context first.
        let many: Vec<String> = (0..super::super::conversation::MAX_MESSAGES)
            .map(|i| format!("m{i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let older = update(2, 2, &many, 1);
        let mut newer = update(50, 1, &["tail", "latest"], 2);
        newer.take_unseen(&older);
        assert_eq!(
            newer.messages.len(),
            super::super::conversation::MAX_MESSAGES
        );
        assert_eq!(newer.seen, 1);
        assert_eq!(newer.messages.last().map(ChatMessage::text), Some("latest"));
    }

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
