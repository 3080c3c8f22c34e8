//! The memory worker (DESIGN.md section 6; docs/architecture.md, "Memory"): after an answered
//! run the turn runner queues the filtered conversation in the store with the turn's end; the
//! queue worker (`queue`) runs the updater (`updater`) on each due item and stores the new
//! document. `edit` renders and edits documents for `/memory` and the API. What a document is,
//! and how it reaches the model, is the agent's (`crate::agent::memory`).

pub(crate) mod edit;
pub(crate) mod queue;
pub(crate) mod updater;
