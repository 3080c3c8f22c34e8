//! Subagents (DESIGN.md section 7). This issue defines the registry record the store keeps;
//! the executor and the `task` tool come with a later issue.

#![cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the store persists these now; the executor comes with a later issue"
    )
)]

mod registry;

pub(crate) use registry::{SubagentRecord, SubagentStatus};
