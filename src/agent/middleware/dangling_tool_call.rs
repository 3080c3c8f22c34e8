//! dangling_tool_call (chain position 4). HELPER: implement.

use serde::{Deserialize, Serialize};

/// `[agent.middleware.dangling_tool_call]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct DanglingToolCallConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
}

impl Default for DanglingToolCallConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}
