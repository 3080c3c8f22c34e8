//! Subagents (DESIGN.md section 7). This issue defines the registry record the store keeps;
//! the executor and the `task` tool come with a later issue.

mod registry;

pub(crate) use registry::{SubagentRecord, SubagentStatus};
