//! title (chain position 11). HELPER: implement.

use serde::{Deserialize, Serialize};

/// `[agent.middleware.title]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TitleConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// At most this many words.
    pub(crate) max_words: usize,
    /// At most this many characters.
    pub(crate) max_chars: usize,
}

impl Default for TitleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_words: 6,
            max_chars: 60,
        }
    }
}
