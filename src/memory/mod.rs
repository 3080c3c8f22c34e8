//! Long-term memory (docs/architecture.md, "Store layout"): the per-user document and the
//! debounced update queue's entries. The store persists both; the updater and injection come
//! with a later issue.

#![cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the store persists these now; the updater comes with a later issue"
    )
)]

mod config;
pub(crate) mod edit;
pub(crate) mod identity;
pub(crate) mod schema;

pub(crate) use config::MemoryConfig;
pub(crate) use schema::{MemoryDocument, MemoryUpdate};
