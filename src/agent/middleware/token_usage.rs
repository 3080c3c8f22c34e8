//! token_usage (chain position 10). HELPER: implement.

use serde::{Deserialize, Serialize};

/// `[agent.middleware.token_usage]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TokenUsageConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
}

impl Default for TokenUsageConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}
