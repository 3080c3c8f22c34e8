//! The agent runtime: a thread, a model, tools and the middleware chain, with no knowledge of
//! HTTP, ingress, delivery or any platform (a test enforces the boundary).

pub(crate) mod approvals;
pub(crate) mod input;
pub(crate) mod memory;
pub(crate) mod message;
pub(crate) mod middleware;
pub(crate) mod model;
pub(crate) mod runtime;
pub(crate) mod skills;
pub(crate) mod subagents;
pub(crate) mod thread;
pub(crate) mod tokens;
pub(crate) mod tools;
