//! Long-term memory per user (DESIGN.md section 6; docs/architecture.md, "Memory").
//!
//! The pipeline: the `memory` middleware renders the author's `<memory>` block into each
//! model request (`injection`) and, after an answered run, hands the filtered conversation
//! (`conversation`) to the turn runner, which queues it in the store with the turn's end;
//! the queue worker (`queue`) runs the updater (`updater`) on each due item and stores the
//! new document (`schema`). `identity` says whose memory a message is.

pub(crate) mod config;
pub(crate) mod conversation;
pub(crate) mod edit;
pub(crate) mod identity;
pub(crate) mod injection;
pub(crate) mod queue;
pub(crate) mod schema;
pub(crate) mod updater;

pub(crate) use config::MemoryConfig;
pub(crate) use schema::{MemoryDocument, MemoryUpdate};

use std::sync::Arc;

use crate::store::Store;

/// Where the `memory` middleware reads documents from: the store in the app. A trait so that
/// the agent runtime does not reach the store itself.
#[async_trait::async_trait]
pub(crate) trait MemoryDocuments: Send + Sync {
    /// The document of memory key `key`, if there is one.
    async fn document(&self, key: &str) -> Result<Option<MemoryDocument>, String>;
}

/// [`MemoryDocuments`] read from the store.
pub(crate) struct StoreDocuments(pub(crate) Arc<dyn Store>);

#[async_trait::async_trait]
impl MemoryDocuments for StoreDocuments {
    async fn document(&self, key: &str) -> Result<Option<MemoryDocument>, String> {
        self.0.memory(key).await.map_err(|e| e.to_string())
    }
}
