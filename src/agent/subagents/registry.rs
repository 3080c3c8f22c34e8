//! The subagent registry record and its state machine:
//! PENDING → RUNNING → COMPLETED | FAILED | CANCELLED | TIMED_OUT, where the first terminal
//! write wins. The records live in the store; the agent reaches them through
//! [`SubagentRegistry`], so it never names the store itself.

use serde::{Deserialize, Serialize};

use crate::agent::message::TokenUsage;

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

    /// The status as stored and shown (`TIMED_OUT`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Running => "RUNNING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::TimedOut => "TIMED_OUT",
        }
    }
}

/// One delegated task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SubagentRecord {
    /// `task_<creation time, hex ms><random>`: ids sort in creation order.
    pub(crate) id: String,
    pub(crate) parent_thread_id: String,
    /// The inbox item of the parent's turn: with the call id, what a re-run of that turn
    /// finds its earlier task by (call ids alone repeat across turns with some providers).
    #[serde(default)]
    pub(crate) parent_turn: u64,
    /// The parent's `task` tool call.
    #[serde(default)]
    pub(crate) parent_call_id: String,
    pub(crate) subagent_type: String,
    pub(crate) description: String,
    pub(crate) prompt: String,
    pub(crate) status: SubagentStatus,
    /// Why it stopped early (`turn_capped`, `loop_capped`), even when it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Tokens its model calls used.
    #[serde(default)]
    pub(crate) usage: TokenUsage,
    /// The parent's trace id, carried into the child's logs.
    pub(crate) trace_id: String,
    pub(crate) created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) finished_at_ms: Option<u64>,
}

impl SubagentRecord {
    /// How long it ran (or has been running, at `now_ms`), in milliseconds.
    pub(crate) fn duration_ms(&self, now_ms: u64) -> Option<u64> {
        let started = self.started_at_ms?;
        Some(
            self.finished_at_ms
                .unwrap_or(now_ms)
                .saturating_sub(started),
        )
    }
}

/// A change of status, with what a terminal status records.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SubagentChange {
    pub(crate) status: SubagentStatus,
    pub(crate) result: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) stop_reason: Option<String>,
    pub(crate) usage: TokenUsage,
    pub(crate) now_ms: u64,
}

impl SubagentChange {
    /// To `status` with nothing else recorded.
    pub(crate) fn to(status: SubagentStatus, now_ms: u64) -> Self {
        Self {
            status,
            result: None,
            error: None,
            stop_reason: None,
            usage: TokenUsage::default(),
            now_ms,
        }
    }

    /// To a failure status with its reason.
    pub(crate) fn failed(status: SubagentStatus, error: impl Into<String>, now_ms: u64) -> Self {
        Self {
            error: Some(error.into()),
            ..Self::to(status, now_ms)
        }
    }

    /// Applies the change to `record` if the machine allows it; says whether it did.
    pub(crate) fn apply(&self, record: &mut SubagentRecord) -> bool {
        if !record.status.can_become(self.status) {
            return false;
        }
        record.status = self.status;
        if self.status == SubagentStatus::Running {
            record.started_at_ms = Some(self.now_ms);
        }
        if self.status.is_terminal() {
            record.result.clone_from(&self.result);
            record.error.clone_from(&self.error);
            record.stop_reason.clone_from(&self.stop_reason);
            record.usage = self.usage;
            record.finished_at_ms = Some(self.now_ms);
        }
        true
    }
}

/// The result of a subagent status change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Transition {
    /// Applied; the record as stored now.
    Applied(SubagentRecord),
    /// Refused (e.g. a terminal status was already written); the record as it is.
    Refused(SubagentRecord),
}

impl Transition {
    /// The record as it is now, either way.
    pub(crate) fn into_record(self) -> SubagentRecord {
        match self {
            Self::Applied(record) | Self::Refused(record) => record,
        }
    }
}

/// A registry operation that failed (the store's error, as text).
#[derive(Debug, Clone, thiserror::Error)]
#[error("subagent registry: {0}")]
pub(crate) struct RegistryError(pub(crate) String);

/// Where subagent records are kept (the store). Every write is durable when it returns.
#[async_trait::async_trait]
pub(crate) trait SubagentRegistry: Send + Sync + std::fmt::Debug {
    async fn create(&self, record: &SubagentRecord) -> Result<(), RegistryError>;

    async fn get(&self, id: &str) -> Result<Option<SubagentRecord>, RegistryError>;

    /// The task a turn's tool call started, if any.
    async fn for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, RegistryError>;

    /// Moves a record along its state machine; the first terminal write wins.
    async fn transition(
        &self,
        id: &str,
        change: &SubagentChange,
    ) -> Result<Transition, RegistryError>;
}

#[cfg(test)]
mod tests {
    use super::SubagentStatus::*;
    use super::*;

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
        assert!(!Running.can_become(Running));
    }

    #[test]
    fn a_change_records_start_and_end_and_the_first_end_wins() {
        let mut record = SubagentRecord {
            id: "task_1".into(),
            parent_thread_id: "t1".into(),
            parent_turn: 7,
            parent_call_id: "call_1".into(),
            subagent_type: "general-purpose".into(),
            description: "d".into(),
            prompt: "p".into(),
            status: Pending,
            stop_reason: None,
            result: None,
            error: None,
            usage: TokenUsage::default(),
            trace_id: "tr".into(),
            created_at_ms: 1,
            started_at_ms: None,
            finished_at_ms: None,
        };
        assert!(SubagentChange::to(Running, 10).apply(&mut record));
        assert_eq!(record.started_at_ms, Some(10));
        assert_eq!(record.duration_ms(25), Some(15));
        let done = SubagentChange {
            result: Some("42".into()),
            stop_reason: Some("turn_capped".into()),
            usage: TokenUsage {
                prompt_tokens: 3,
                completion_tokens: 2,
                total_tokens: 5,
            },
            ..SubagentChange::to(Completed, 40)
        };
        assert!(done.apply(&mut record));
        assert!(!SubagentChange::failed(TimedOut, "late", 50).apply(&mut record));
        assert_eq!(record.status, Completed);
        assert_eq!(record.result.as_deref(), Some("42"));
        assert_eq!(record.error, None);
        assert_eq!(record.usage.total_tokens, 5);
        assert_eq!(record.duration_ms(99), Some(30));
        assert_eq!(TimedOut.as_str(), "TIMED_OUT");
        assert_eq!(
            serde_json::to_value(TimedOut).unwrap(),
            serde_json::json!("TIMED_OUT")
        );
    }
}
