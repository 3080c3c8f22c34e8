//! Subagents (docs/architecture.md, "Store layout"). The registry record the store keeps is
//! defined here; the executor and the `task` tool come with a later issue.

#![cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the store persists these now; the executor comes with a later issue"
    )
)]

mod registry;

pub(crate) use registry::{SubagentRecord, SubagentStatus};
