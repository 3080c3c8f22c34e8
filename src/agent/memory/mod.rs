//! The memory domain of the agent (DESIGN.md section 6; docs/architecture.md, "Memory"): what a
//! user's memory document is (`schema`), whose memory a message is (`identity`), which part of
//! a conversation may be remembered (`conversation`), what of it a group chat may hear
//! (`sharing`), and how a document goes into a model request (`injection`). The `memory`
//! middleware uses it; the worker that updates documents is `crate::memory`, and the store
//! keeps them behind [`MemoryDocuments`].

pub(crate) mod config;
pub(crate) mod conversation;
pub(crate) mod identity;
pub(crate) mod injection;
pub(crate) mod schema;
pub(crate) mod sharing;

pub(crate) use config::MemoryConfig;
pub(crate) use schema::{MemoryDocument, MemoryUpdate};

/// Where the `memory` middleware reads documents from: the store in the app. A trait so that
/// the agent runtime does not reach the store itself.
#[async_trait::async_trait]
pub(crate) trait MemoryDocuments: Send + Sync {
    /// The document of memory key `key`, if there is one.
    async fn document(&self, key: &str) -> Result<Option<MemoryDocument>, String>;
}
