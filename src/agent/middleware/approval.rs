//! approval (chain position 17, just before clarification): tool calls listed in
//! `[approvals] tools` wait for a person before they run.
//!
//! In `before_tool` a matching call is looked up in the approval ledger (the store) by its
//! thread and call id:
//! - no record yet: one is opened (pending, durable before the run goes on) and the call is
//!   **held** ([`ToolDecision::Hold`]): it gets no result, the response's other calls run, and
//!   the run ends there (`awaiting_approval`) with the call unanswered in the checkpointed
//!   thread. The opened record goes out with the run ([`RunOutputs::approvals`]) so the turn
//!   shows the chat what waits and how to decide;
//! - pending (a turn re-run after a crash): held again, shown again;
//! - approved: the call runs;
//! - denied, expired or withdrawn: the call is answered, not run, with who refused and why
//!   ("Denied by alice: not on a Friday"), so the model can say so.
//!
//! A decision resumes the run through the inbox (`ingress::approvals`): the runtime's resume
//! first runs the calls left unanswered, so this hook sees the call again, now decided.
//!
//! Placement: after every other guard that refuses calls (guardrail, sandbox_audit,
//! subagent_limit, loop_detection), so a person is asked only about a call that would
//! otherwise run, and a call one of them refused stays refused and asks nobody; before
//! clarification, which is always last and never matches a listed tool. It fails closed: a
//! ledger that cannot be read or written refuses the call. A run with no inbox turn (a
//! subagent's task) cannot wait for a person, so a listed call there is refused.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{FailurePolicy, Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::message::ToolCall;

/// The stop reason of a run that waits for an approval.
pub(crate) const AWAITING_APPROVAL: &str = "awaiting_approval";

/// Pending approvals one conversation may hold; a call past it is refused, not held.
pub(crate) const MAX_PENDING_PER_CONVERSATION: usize = 20;

/// The most characters of a call's arguments kept and shown.
pub(crate) const MAX_ARGUMENT_CHARS: usize = 1500;

/// The most characters of a decision's reason kept.
pub(crate) const MAX_REASON_CHARS: usize = 300;

/// `approvals.approvers`: who may decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Approvers {
    /// `"admins"`: the channel's admins (and the admin API).
    Named(String),
    /// Users by `<channel>:<user id>` (`telegram:42`, `slack:T1:U9`).
    Users(Vec<String>),
}

impl Default for Approvers {
    fn default() -> Self {
        Self::Named("admins".to_owned())
    }
}

/// `[approvals]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ApprovalsConfig {
    /// Tool names (`*` matches any run of characters) whose calls wait for a person.
    pub(crate) tools: Vec<String>,
    /// Who may decide.
    pub(crate) approvers: Approvers,
    /// Unanswered this long, a call is denied by antler (expired).
    pub(crate) timeout_secs: u64,
    /// Whether the person whose message led to the call may approve it.
    pub(crate) self_approval: bool,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        Self {
            tools: Vec::new(),
            approvers: Approvers::default(),
            timeout_secs: 900,
            self_approval: true,
        }
    }
}

impl ApprovalsConfig {
    /// Whether calls of `tool` wait for a person.
    pub(crate) fn requires(&self, tool: &str) -> bool {
        self.tools.iter().any(|pattern| glob(pattern, tool))
    }

    /// Whether the user `key` (`<channel>:<user id>`, an admin there or not) may decide.
    pub(crate) fn may_decide(&self, key: &str, admin: bool) -> bool {
        match &self.approvers {
            Approvers::Named(_) => admin,
            Approvers::Users(users) => users.iter().any(|user| user == key),
        }
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters (none too).
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return false;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole name must be the pattern.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

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
    pub(crate) call_id: String,
    pub(crate) tool: String,
    /// The arguments, pretty JSON, cut to [`MAX_ARGUMENT_CHARS`].
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

impl ApprovalRecord {
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
    /// The conversation holds [`MAX_PENDING_PER_CONVERSATION`] pending approvals.
    Full,
}

/// Where approvals are kept (the store), as the middleware sees it.
#[async_trait::async_trait]
pub(crate) trait ApprovalLedger: Send + Sync {
    /// The approval of a thread's tool call, if one was opened.
    async fn for_call(
        &self,
        thread_id: &str,
        call_id: &str,
    ) -> Result<Option<ApprovalRecord>, String>;
    /// Stores `record` unless its call has one (durable when it returns).
    async fn open(&self, record: ApprovalRecord) -> Result<Opened, String>;
}

/// `text` cut to `max` characters, with `…` when cut.
pub(crate) fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((byte, _)) => format!("{}…", &text[..byte]),
        None => text.to_owned(),
    }
}

/// A new approval id: 8 characters no one misreads.
fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyz23456789";
    (0..8)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect()
}

/// A call's arguments as people read them: pretty JSON (the model's text when it is not
/// JSON), bounded.
fn readable_arguments(arguments: &str) -> String {
    let pretty = serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| arguments.to_owned());
    bounded(&pretty, MAX_ARGUMENT_CHARS)
}

/// Holds listed tool calls until a person decides.
pub(crate) struct ApprovalMiddleware {
    config: ApprovalsConfig,
    ledger: Arc<dyn ApprovalLedger>,
}

impl std::fmt::Debug for ApprovalMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalMiddleware")
            .field("tools", &self.config.tools)
            .finish_non_exhaustive()
    }
}

impl ApprovalMiddleware {
    /// The middleware, or `None` when no tool needs approval.
    pub(crate) fn from_config(
        config: &ApprovalsConfig,
        ledger: Arc<dyn ApprovalLedger>,
    ) -> Option<Self> {
        (!config.tools.is_empty()).then(|| Self {
            config: config.clone(),
            ledger,
        })
    }

    fn record(&self, cx: &RunContext<'_>, call: &ToolCall) -> ApprovalRecord {
        let now = crate::now_ms();
        let author = &cx.input.author;
        ApprovalRecord {
            id: new_id(),
            conversation: cx.thread.conversation.clone(),
            channel: author.channel.clone(),
            thread_id: cx.thread.id.clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: readable_arguments(&call.arguments),
            requester: Requester {
                user_id: author.user_id.clone(),
                name: author.name.clone(),
                admin: author.role == crate::agent::input::Role::Admin,
                group: cx.input.flags.group,
            },
            created_at_ms: now,
            expires_at_ms: now.saturating_add(self.config.timeout_secs.saturating_mul(1000)),
            state: ApprovalState::Pending,
            decided_by: None,
            reason: None,
            decided_at_ms: None,
            queued: false,
        }
    }
}

#[async_trait::async_trait]
impl Middleware for ApprovalMiddleware {
    fn name(&self) -> &'static str {
        "approval"
    }

    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::FailClosed
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        if refused.is_some() || !self.config.requires(&call.name) {
            return Ok(ToolDecision::Run);
        }
        if cx.thread.running.is_none() {
            return Ok(ToolDecision::Skip(ToolOutput::error(format!(
                "Not run: `{}` needs a person's approval, which cannot be asked for here.",
                call.name
            ))));
        }
        let found = self
            .ledger
            .for_call(&cx.thread.id, &call.id)
            .await
            .map_err(MiddlewareError)?;
        let record = match found {
            Some(record) => record,
            None => match self
                .ledger
                .open(self.record(cx, call))
                .await
                .map_err(MiddlewareError)?
            {
                Opened::New(record) => {
                    tracing::info!(approval = %record.id, tool = %record.tool, "a tool call waits for approval");
                    metrics::counter!("antler_approvals_total", "state" => "requested")
                        .increment(1);
                    record
                }
                Opened::Existing(record) => record,
                Opened::Full => {
                    return Ok(ToolDecision::Skip(ToolOutput::error(format!(
                        "Not run: too many calls in this conversation already wait for \
                         approval (at most {MAX_PENDING_PER_CONVERSATION})."
                    ))));
                }
            },
        };
        match record.state {
            ApprovalState::Approved => Ok(ToolDecision::Run),
            ApprovalState::Pending => {
                cx.outputs.approvals.push(record);
                Ok(ToolDecision::Hold)
            }
            _ => Ok(ToolDecision::Skip(ToolOutput::error(
                record.refusal().unwrap_or_default(),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::thread::{RunningTurn, ThreadState};

    #[derive(Default)]
    struct Ledger(Mutex<HashMap<(String, String), ApprovalRecord>>);

    #[async_trait::async_trait]
    impl ApprovalLedger for Ledger {
        async fn for_call(
            &self,
            thread_id: &str,
            call_id: &str,
        ) -> Result<Option<ApprovalRecord>, String> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .get(&(thread_id.to_owned(), call_id.to_owned()))
                .cloned())
        }
        async fn open(&self, record: ApprovalRecord) -> Result<Opened, String> {
            let mut map = self.0.lock().unwrap();
            let key = (record.thread_id.clone(), record.call_id.clone());
            if let Some(existing) = map.get(&key) {
                return Ok(Opened::Existing(existing.clone()));
            }
            map.insert(key, record.clone());
            Ok(Opened::New(record))
        }
    }

    fn middleware(ledger: &Arc<Ledger>) -> ApprovalMiddleware {
        let config = ApprovalsConfig {
            tools: vec!["bash".into(), "mcp__github__*".into()],
            ..ApprovalsConfig::default()
        };
        ApprovalMiddleware::from_config(&config, Arc::clone(ledger) as Arc<dyn ApprovalLedger>)
            .unwrap()
    }

    fn call(name: &str) -> ToolCall {
        ToolCall {
            id: "call_1".into(),
            name: name.into(),
            arguments: r#"{"command":"rm -rf /tmp/x"}"#.into(),
        }
    }

    fn running_thread() -> ThreadState {
        let mut thread = ThreadState::new("t1".into(), "api:ops".into(), 0, 0);
        thread.running = Some(RunningTurn {
            inbox_seq: 7,
            start: 0,
        });
        thread
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob("bash", "bash"));
        assert!(!glob("bash", "bash2"));
        assert!(!glob("bash", "xbash"));
        assert!(glob("mcp__github__*", "mcp__github__create_issue"));
        assert!(!glob("mcp__github__*", "mcp__gitlab__x"));
        assert!(glob("*_file", "write_file"));
        assert!(glob("cmd_*_prod", "cmd_deploy_prod"));
        assert!(!glob("cmd_*_prod", "cmd_deploy_prod2"));
        assert!(glob("*", "anything"));
    }

    #[tokio::test]
    async fn a_listed_call_is_held_once_and_runs_only_when_approved() {
        let ledger = Arc::new(Ledger::default());
        let m = middleware(&ledger);
        let mut thread = running_thread();
        let mut cx = test_context(&mut thread);
        // Not listed: runs.
        assert_eq!(
            m.before_tool(&mut cx, &call("read_file"), None)
                .await
                .unwrap(),
            ToolDecision::Run
        );
        // Listed: held, one record, shown with the run.
        assert_eq!(
            m.before_tool(&mut cx, &call("bash"), None).await.unwrap(),
            ToolDecision::Hold
        );
        let record = cx.outputs.approvals[0].clone();
        assert_eq!(record.tool, "bash");
        assert_eq!(record.state, ApprovalState::Pending);
        assert!(record.arguments.contains("\"command\": \"rm -rf /tmp/x\""));
        assert_eq!(record.expires_at_ms - record.created_at_ms, 900_000);
        // Asked again while pending (a re-run): the same record, held again.
        assert_eq!(
            m.before_tool(&mut cx, &call("bash"), None).await.unwrap(),
            ToolDecision::Hold
        );
        assert_eq!(cx.outputs.approvals[1].id, record.id);
        assert_eq!(ledger.0.lock().unwrap().len(), 1);
        // Approved: runs.
        ledger.0.lock().unwrap().values_mut().for_each(|r| {
            r.state = ApprovalState::Approved;
        });
        assert_eq!(
            m.before_tool(&mut cx, &call("bash"), None).await.unwrap(),
            ToolDecision::Run
        );
    }

    #[tokio::test]
    async fn a_denied_call_is_answered_with_who_and_why() {
        let ledger = Arc::new(Ledger::default());
        let m = middleware(&ledger);
        let mut thread = running_thread();
        let mut cx = test_context(&mut thread);
        m.before_tool(&mut cx, &call("mcp__github__merge"), None)
            .await
            .unwrap();
        ledger.0.lock().unwrap().values_mut().for_each(|r| {
            r.state = ApprovalState::Denied;
            r.decided_by = Some("alice".into());
            r.reason = Some("not on a Friday".into());
        });
        match m
            .before_tool(&mut cx, &call("mcp__github__merge"), None)
            .await
            .unwrap()
        {
            ToolDecision::Skip(output) => {
                assert!(output.is_error);
                assert_eq!(output.content, "Denied by alice: not on a Friday");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn refused_calls_and_runs_without_a_turn_ask_nobody() {
        let ledger = Arc::new(Ledger::default());
        let m = middleware(&ledger);
        let mut thread = running_thread();
        let mut cx = test_context(&mut thread);
        let refusal = ToolOutput::error("no");
        assert_eq!(
            m.before_tool(&mut cx, &call("bash"), Some(&refusal))
                .await
                .unwrap(),
            ToolDecision::Run
        );
        // A subagent's run has no inbox turn: it cannot wait.
        let mut child = ThreadState::new("t1".into(), "api:ops".into(), 0, 0);
        let mut cx = test_context(&mut child);
        assert!(matches!(
            m.before_tool(&mut cx, &call("bash"), None).await.unwrap(),
            ToolDecision::Skip(_)
        ));
        assert!(ledger.0.lock().unwrap().is_empty());
    }

    #[test]
    fn approvers_are_admins_or_listed_users() {
        let admins = ApprovalsConfig::default();
        assert!(admins.may_decide("telegram:42", true));
        assert!(!admins.may_decide("telegram:42", false));
        let listed = ApprovalsConfig {
            approvers: Approvers::Users(vec!["slack:T1:U9".into()]),
            ..ApprovalsConfig::default()
        };
        assert!(listed.may_decide("slack:T1:U9", false));
        assert!(!listed.may_decide("telegram:42", true));
    }
}
