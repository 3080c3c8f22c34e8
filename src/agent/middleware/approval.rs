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
use crate::agent::approvals::{
    ApprovalLedger, ApprovalRecord, ApprovalState, Opened, Requester, call_key,
};
use crate::agent::message::{ChatMessage, ToolCall};

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
    /// Users by `<channel>:<user id>` (`telegram:42`, `slack:U0123ABCD`).
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

    fn record(&self, cx: &RunContext<'_>, call: &ToolCall, message: usize) -> ApprovalRecord {
        let now = crate::now_ms();
        let author = &cx.input.author;
        ApprovalRecord {
            id: new_id(),
            conversation: cx.thread.conversation.clone(),
            channel: author.channel.clone(),
            thread_id: cx.thread.id.clone(),
            message,
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
        // The response holding the call is in the thread before its calls are decided.
        let Some(message) = cx.thread.messages.iter().rposition(|m| {
            matches!(m, ChatMessage::Assistant { tool_calls, .. } if tool_calls.iter().any(|c| c.id == call.id))
        }) else {
            return Err(MiddlewareError(format!(
                "the call {} is not in the thread",
                call.id
            )));
        };
        let found = self
            .ledger
            .for_call(&cx.thread.id, &call_key(message, &call.id))
            .await
            .map_err(MiddlewareError)?;
        let record = match found {
            Some(record) => record,
            None => match self
                .ledger
                .open(self.record(cx, call, message))
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
            call_key: &str,
        ) -> Result<Option<ApprovalRecord>, String> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .get(&(thread_id.to_owned(), call_key.to_owned()))
                .cloned())
        }
        async fn open(&self, record: ApprovalRecord) -> Result<Opened, String> {
            let mut map = self.0.lock().unwrap();
            let key = (record.thread_id.clone(), record.call_key());
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
        thread.messages.push(ChatMessage::user("go"));
        thread.messages.push(ChatMessage::Assistant {
            content: String::new(),
            tool_calls: ["bash", "read_file", "mcp__github__merge"]
                .into_iter()
                .map(call)
                .collect(),
            reasoning: None,
        });
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
    async fn a_call_id_used_again_in_a_later_round_asks_again() {
        let ledger = Arc::new(Ledger::default());
        let m = middleware(&ledger);
        let mut thread = running_thread();
        {
            let mut cx = test_context(&mut thread);
            m.before_tool(&mut cx, &call("bash"), None).await.unwrap();
        }
        ledger.0.lock().unwrap().values_mut().for_each(|r| {
            r.state = ApprovalState::Approved;
        });
        // The model uses `call_1` again in a new round: a new call, a new question.
        thread.messages.push(ChatMessage::tool("call_1", "done"));
        thread.messages.push(ChatMessage::Assistant {
            content: String::new(),
            tool_calls: vec![call("bash")],
            reasoning: None,
        });
        let mut cx = test_context(&mut thread);
        assert_eq!(
            m.before_tool(&mut cx, &call("bash"), None).await.unwrap(),
            ToolDecision::Hold
        );
        assert_eq!(ledger.0.lock().unwrap().len(), 2);
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
        let mut child = running_thread();
        child.running = None;
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
