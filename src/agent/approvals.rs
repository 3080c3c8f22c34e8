//! Tool calls waiting for a person (`[approvals]`): the record the `approval` middleware
//! opens and a decision settles, and the ledger it is kept in (the store, through a port the
//! agent defines, as for subagents).

use serde::{Deserialize, Serialize};

/// Where an approval stands. Only `Pending` changes, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ApprovalState {
    Pending,
    Approved,
    Denied,
    /// Nobody decided within `timeout_secs`: denied by antler.
    Expired,
    /// A new message in the conversation came first; the call was answered as not run.
    Withdrawn,
}

impl ApprovalState {
    /// Its name in lists and the API.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Withdrawn => "withdrawn",
        }
    }
}

/// Who asked: the author of the message whose run made the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Requester {
    pub(crate) user_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    /// An admin where they wrote (the resumed run keeps their role).
    pub(crate) admin: bool,
    /// They wrote in a group chat.
    #[serde(default)]
    pub(crate) group: bool,
}

/// One call waiting for (or past) a person's decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ApprovalRecord {
    /// Short and typeable: `/approve k3x9p2ab`.
    pub(crate) id: String,
    /// Where the call was made and where the decision resumes it.
    pub(crate) conversation: String,
    pub(crate) channel: String,
    pub(crate) thread_id: String,
    /// Where the call is: the thread's message holding it, and its id there (a model may
    /// use one id in several rounds, so the id alone names no call).
    pub(crate) message: usize,
    pub(crate) call_id: String,
    pub(crate) tool: String,
    /// The arguments, pretty JSON, cut to `approval::MAX_ARGUMENT_CHARS`.
    pub(crate) arguments: String,
    pub(crate) requester: Requester,
    pub(crate) created_at_ms: u64,
    pub(crate) expires_at_ms: u64,
    pub(crate) state: ApprovalState,
    /// Who decided, as shown (`alice (telegram:42)`, `antler`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) decided_at_ms: Option<u64>,
    /// The decision's resume item is in the inbox (set after it was accepted).
    #[serde(default)]
    pub(crate) queued: bool,
}

/// How the store finds a thread's call: its message and its id.
pub(crate) fn call_key(message: usize, call_id: &str) -> String {
    format!("{message}:{call_id}")
}

impl ApprovalRecord {
    /// [`call_key`] of its call.
    pub(crate) fn call_key(&self) -> String {
        call_key(self.message, &self.call_id)
    }

    /// The requester as `<channel>:<user id>`.
    pub(crate) fn requester_key(&self) -> String {
        format!("{}:{}", self.channel, self.requester.user_id)
    }

    /// What the model is told about a call that was decided and is not run; `None` when it
    /// runs (approved) or nobody decided yet.
    pub(crate) fn refusal(&self) -> Option<String> {
        let by = self.decided_by.as_deref().unwrap_or("someone");
        let reason = self.reason.as_deref().filter(|r| !r.trim().is_empty());
        match self.state {
            ApprovalState::Pending | ApprovalState::Approved => None,
            ApprovalState::Denied => Some(match reason {
                Some(reason) => format!("Denied by {by}: {reason}"),
                None => format!("Denied by {by}."),
            }),
            ApprovalState::Expired => Some(format!(
                "Denied by antler: nobody approved `{}` in time (the approval expired). Not run.",
                self.tool
            )),
            ApprovalState::Withdrawn => Some(format!(
                "Not run: a new message arrived before anyone approved `{}`.",
                self.tool
            )),
        }
    }
}

/// What opening an approval found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Opened {
    /// Stored now.
    New(ApprovalRecord),
    /// The call had one already (a re-run); it is returned as stored.
    Existing(ApprovalRecord),
    /// The conversation holds `approval::MAX_PENDING_PER_CONVERSATION` pending approvals.
    Full,
}

/// Where approvals are kept (the store), as the middleware sees it.
#[async_trait::async_trait]
pub(crate) trait ApprovalLedger: Send + Sync {
    /// The approval of a thread's tool call (by [`call_key`]), if one was opened.
    async fn for_call(
        &self,
        thread_id: &str,
        call_key: &str,
    ) -> Result<Option<ApprovalRecord>, String>;
    /// Stores `record` unless its call has one (durable when it returns).
    async fn open(&self, record: ApprovalRecord) -> Result<Opened, String>;
}
