//! Long-term memory (DESIGN.md section 6): the per-user document and the debounced update
//! queue's entries. The store persists both; the updater and injection come with a later issue.

mod schema;

pub(crate) use schema::{Fact, MemoryDocument, MemoryUpdate};
