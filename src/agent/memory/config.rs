//! `[memory]`: long-term memory per user (DESIGN.md section 6).

use serde::Deserialize;

/// `[memory]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct MemoryConfig {
    /// Whether antler learns and injects memory at all.
    pub(crate) enabled: bool,
    /// How long after a run its conversation waits before the updater reads it; a newer run
    /// of the same thread and user within the window replaces it.
    pub(crate) debounce_seconds: u64,
    /// Facts kept per user at most (the least confident go first).
    pub(crate) max_facts: usize,
    /// Facts below this confidence are not kept.
    pub(crate) fact_confidence_threshold: f64,
    /// Whether the `<memory>` block is added to model requests.
    pub(crate) injection_enabled: bool,
    /// The `<memory>` block's size at most, in tokens.
    pub(crate) max_injection_tokens: usize,
    /// How long shutdown waits for queued updates, in seconds.
    pub(crate) shutdown_flush_secs: u64,
    /// Which facts of the author go into a group chat's run (and `/memory` there).
    pub(crate) group_facts: GroupFacts,
    /// Whether the `personalContext` summary goes into a group chat's run.
    pub(crate) group_personal_context: bool,
    /// `[[memory.identities]]`: ids on several platforms that are one person.
    pub(crate) identities: Vec<IdentityLink>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            debounce_seconds: 30,
            max_facts: 100,
            fact_confidence_threshold: 0.7,
            injection_enabled: true,
            max_injection_tokens: 2000,
            shutdown_flush_secs: 10,
            group_facts: GroupFacts::Work,
            group_personal_context: false,
            identities: Vec::new(),
        }
    }
}

/// `memory.group_facts`: which of the author's facts a group chat's run gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum GroupFacts {
    /// Only those the author shared (`/memory share <n>`).
    Shareable,
    /// Those about the author's work, and those they shared.
    #[default]
    Work,
    /// Every fact, personal ones too.
    All,
}

/// One `[[memory.identities]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdentityLink {
    /// The person's name (letters, digits, `_`, `-`, `.`); their memory is `person:<name>`.
    pub(crate) name: String,
    /// Their ids, each `<channel>:<platform user id>` (`telegram:42`, `slack:T1:U9`).
    pub(crate) ids: Vec<String>,
}
