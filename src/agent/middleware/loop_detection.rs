//! loop_detection (chain position 16). HELPER: implement.

use serde::{Deserialize, Serialize};

/// `[agent.middleware.loop_detection]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LoopDetectionConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// Repeats of the same tool-call set (within the window) that trigger a warning.
    pub(crate) warn_threshold: usize,
    /// Repeats that strip the tool calls and force a text answer.
    pub(crate) hard_limit: usize,
    /// How many recent tool-call sets per thread are remembered.
    pub(crate) window: usize,
    /// How many threads are tracked at once (least recently used are forgotten).
    pub(crate) max_threads: usize,
}

impl Default for LoopDetectionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            warn_threshold: 3,
            hard_limit: 5,
            window: 20,
            max_threads: 100,
        }
    }
}
