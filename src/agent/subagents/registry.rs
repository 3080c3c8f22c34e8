//! The subagent registry record and its state machine:
//! PENDING → RUNNING → COMPLETED | FAILED | CANCELLED | TIMED_OUT, where the first terminal
//! write wins.

use serde::{Deserialize, Serialize};

/// Where a subagent task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum SubagentStatus {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
}

impl SubagentStatus {
    /// Whether nothing may follow this status.
    pub(crate) fn is_terminal(self) -> bool {
        !matches!(self, Self::Pending | Self::Running)
    }

    /// Whether the machine allows going from `self` to `next`.
    pub(crate) fn can_become(self, next: Self) -> bool {
        match self {
            Self::Pending => next != Self::Pending,
            Self::Running => next.is_terminal(),
            _ => false,
        }
    }
}

/// One delegated task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SubagentRecord {
    pub(crate) id: String,
    pub(crate) parent_thread_id: String,
    pub(crate) subagent_type: String,
    pub(crate) description: String,
    pub(crate) prompt: String,
    pub(crate) status: SubagentStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// The parent's trace id, carried into the child's logs.
    pub(crate) trace_id: String,
    pub(crate) created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) finished_at_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::SubagentStatus::*;

    #[test]
    fn terminal_states_are_final() {
        for terminal in [Completed, Failed, Cancelled, TimedOut] {
            assert!(terminal.is_terminal());
            for next in [Pending, Running, Completed, Failed, Cancelled, TimedOut] {
                assert!(!terminal.can_become(next), "{terminal:?} -> {next:?}");
            }
        }
        assert!(Pending.can_become(Running));
        assert!(Pending.can_become(Cancelled));
        assert!(Running.can_become(TimedOut));
        assert!(!Running.can_become(Pending));
    }
}
