//! Long-term memory per user (DESIGN.md section 6; docs/architecture.md, "Memory").
//!
//! The pipeline: the `memory` middleware renders the author's `<memory>` block into each
//! model request (`injection`) and, after an answered run, hands the filtered conversation
//! (`conversation`) to the turn runner, which queues it in the store with the turn's end;
//! the queue worker (`queue`) runs the updater (`updater`) on each due item and stores the
//! new document (`schema`). `identity` says whose memory a message is.

pub(crate) mod config;
pub(crate) mod conversation;
pub(crate) mod identity;
pub(crate) mod injection;
pub(crate) mod queue;
pub(crate) mod schema;
pub(crate) mod updater;

pub(crate) use config::MemoryConfig;
pub(crate) use schema::{MemoryDocument, MemoryUpdate};
