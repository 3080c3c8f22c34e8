//! Subagents (DESIGN.md section 7): the `task` tool lets the lead agent delegate work to a
//! subagent, a run of its own with its own context, tools and limits.
//!
//! - [`registry`]: the record every task is in the store, and its state machine.
//! - [`config`]: `[subagents]` and the subagent types (`general-purpose`, `bash`, custom).
//! - [`executor`]: runs tasks, at most `max_concurrent` at once, each with a timeout,
//!   cancelled with their parent.
//! - [`task_tool`]: the `task` tool, which waits for its task's result itself.

/// The middlewares of a subagent's chain (those of the lead's chain that are enabled and
/// named here): the ground (thread_data), the guards (guardrail, sandbox_audit: a subagent
/// runs with its parent's rights), what keeps a long run within its context
/// (dangling_tool_call, tool_output_budget, summarization, deferred_tools), its token count
/// (token_usage), loop_detection (its `loop_capped` stop) and approval (a task cannot wait
/// for a person, so a tool listed in `[approvals]` is refused in it). Left out: what concerns the
/// user's side of a conversation (uploads, input_sanitization, todo, title, memory,
/// view_image, clarification) and subagent_limit (a subagent has no `task`).
pub(crate) const SUBAGENT_CHAIN: &[&str] = &[
    "thread_data",
    "dangling_tool_call",
    "guardrail",
    "sandbox_audit",
    "tool_output_budget",
    "summarization",
    "token_usage",
    "deferred_tools",
    "loop_detection",
    "approval",
];

pub(crate) mod config;
pub(crate) mod executor;
mod registry;
pub(crate) mod task_tool;

pub(crate) use registry::{
    RegistryError, SubagentChange, SubagentRecord, SubagentRegistry, SubagentStatus, Transition,
};
