//! guardrail (chain position 5): which tools a user may have run, by role.
//!
//! The policy, from `[agent.middleware.guardrail]`:
//! - `denied` (empty by default): tools nobody may use, operators included;
//! - `admin_only` (`bash`, `write_file`, `str_replace`, `mcp__*`): tools only operators
//!   ([`Role::Admin`]) may use; MCP servers' tools are the operator's until they open them,
//!   since what such a tool can do is only known to whoever configured its server;
//! - `user_allowed` (empty by default): when not empty, the only tools the `user` role may
//!   use. `admin_only` still wins: a tool in both lists stays with the operators.
//!
//! A name ending in `*` names every tool starting with what comes before it (`mcp__github__*`).
//!
//! In `before_tool` a call the author may not make is not run: the model gets an error result
//! saying the tool needs an operator (or is disabled), and the run goes on. It fails closed: a
//! guardrail that cannot decide refuses the call (the chain turns its error into a refusal).
//!
//! Where it improves on DeerFlow (whose guardrail only answers calls, off by default): it is
//! on by default, and in `before_model` it also takes the tools the author may not use out of
//! the request, so the model does not plan with a tool it will be refused. The `before_tool`
//! check stays the one that counts: a model may call a tool it was never offered.
//!
//! Placement: after `dangling_tool_call` (the request is repaired first), before
//! `sandbox_audit` and every other tool hook: a call is authorized before anything inspects
//! or runs it, and its `before_model` runs before the tool list is filtered further.

use serde::{Deserialize, Serialize};

use super::{FailurePolicy, Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::input::Role;
use crate::agent::message::ToolCall;
use crate::agent::model::ModelRequest;

/// `[agent.middleware.guardrail]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct GuardrailConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// Tools only operators may use.
    pub(crate) admin_only: Vec<String>,
    /// Tools nobody may use.
    pub(crate) denied: Vec<String>,
    /// When not empty, the only tools the `user` role may use.
    pub(crate) user_allowed: Vec<String>,
}

impl Default for GuardrailConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            admin_only: ["bash", "write_file", "str_replace", "mcp__*"]
                .map(str::to_owned)
                .to_vec(),
            denied: Vec::new(),
            user_allowed: Vec::new(),
        }
    }
}

/// Why a tool is refused to someone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Nobody may use it.
    Denied,
    /// Only an operator may.
    NeedsOperator,
    /// Not on the users' allowlist.
    NotAllowed,
}

/// Authorizes tool calls by the author's role.
#[derive(Debug, Clone)]
pub(crate) struct GuardrailMiddleware {
    admin_only: Vec<String>,
    denied: Vec<String>,
    user_allowed: Vec<String>,
}

impl GuardrailMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &GuardrailConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            admin_only: cfg.admin_only.clone(),
            denied: cfg.denied.clone(),
            user_allowed: cfg.user_allowed.clone(),
        })
    }

    /// Whether someone of `role` may call `tool`.
    pub(crate) fn allows(&self, role: Role, tool: &str) -> bool {
        self.check(role, tool).is_none()
    }

    fn check(&self, role: Role, tool: &str) -> Option<Refusal> {
        let listed = |list: &[String]| list.iter().any(|name| names(name, tool));
        if listed(&self.denied) {
            return Some(Refusal::Denied);
        }
        match role {
            Role::Admin => None,
            Role::User if listed(&self.admin_only) => Some(Refusal::NeedsOperator),
            Role::User if !self.user_allowed.is_empty() && !listed(&self.user_allowed) => {
                Some(Refusal::NotAllowed)
            }
            Role::User => None,
        }
    }
}

/// Whether a policy entry names `tool`: the same name, or a prefix followed by `*`.
fn names(entry: &str, tool: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => entry == tool,
    }
}

#[async_trait::async_trait]
impl Middleware for GuardrailMiddleware {
    fn name(&self) -> &'static str {
        "guardrail"
    }

    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::FailClosed
    }

    async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        let role = cx.input.author.role;
        request
            .tools
            .retain(|tool| self.check(role, &tool.name).is_none());
        Ok(())
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        _refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        if call.name.trim().is_empty() {
            return Err(MiddlewareError("a tool call without a name".to_owned()));
        }
        let Some(refusal) = self.check(cx.input.author.role, &call.name) else {
            return Ok(ToolDecision::Run);
        };
        tracing::info!(
            thread = %cx.thread.id,
            user = %cx.user_id,
            tool = %call.name,
            ?refusal,
            "guardrail refused a tool call"
        );
        metrics::counter!("antler_guardrail_refusals_total", "tool" => call.name.clone())
            .increment(1);
        let why = match refusal {
            Refusal::Denied => "is disabled on this server".to_owned(),
            Refusal::NeedsOperator => {
                "needs an operator: only admins may use it, and this user is not one".to_owned()
            }
            Refusal::NotAllowed => "is not available to this user".to_owned(),
        };
        Ok(ToolDecision::Skip(ToolOutput::error(format!(
            "Refused: the tool `{}` {why}. It was not run. Do without it, or tell the user \
             what you would need it for.",
            call.name
        ))))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agent::input::RunInput;
    use crate::agent::middleware::MiddlewareChain;
    use crate::agent::model::ToolSpec;
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::thread::ThreadState;

    fn input(role: Role) -> RunInput {
        let mut input = RunInput::text("test", "u1", "hi");
        input.author.role = role;
        input
    }

    fn call(name: &str) -> ToolCall {
        ToolCall {
            id: "c1".to_owned(),
            name: name.to_owned(),
            arguments: r#"{"command":"rm -rf /"}"#.to_owned(),
        }
    }

    async fn decide(cfg: &GuardrailConfig, role: Role, tool: &str) -> ToolDecision {
        let chain = MiddlewareChain::new(vec![Arc::new(
            GuardrailMiddleware::from_config(cfg).unwrap(),
        )])
        .unwrap();
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let input = input(role);
        let model = Arc::new(ScriptedModel::new(Vec::new()));
        let mut cx = RunContext::new(&mut thread, &input, model.clone());
        chain.before_tool(&mut cx, &call(tool)).await
    }

    fn refusal_text(decision: ToolDecision) -> String {
        match decision {
            ToolDecision::Skip(output) => {
                assert!(output.is_error);
                output.content
            }
            ToolDecision::Run | ToolDecision::Hold => panic!("expected a refusal"),
        }
    }

    #[tokio::test]
    async fn a_users_admin_only_calls_are_refused_with_a_clear_message() {
        let cfg = GuardrailConfig::default();
        for tool in [
            "bash",
            "write_file",
            "str_replace",
            "mcp__github__create_issue",
        ] {
            let text = refusal_text(decide(&cfg, Role::User, tool).await);
            assert!(
                text.contains(&format!("the tool `{tool}` needs an operator"))
                    && text.contains("not run"),
                "{text}"
            );
        }
        assert_eq!(
            decide(&cfg, Role::User, "read_file").await,
            ToolDecision::Run
        );
    }

    #[tokio::test]
    async fn a_trailing_star_names_a_family_of_tools() {
        let cfg = GuardrailConfig {
            admin_only: vec!["bash".to_owned()],
            user_allowed: vec!["read_file".to_owned(), "mcp__docs__*".to_owned()],
            denied: vec!["mcp__prod__*".to_owned()],
            ..GuardrailConfig::default()
        };
        assert_eq!(
            decide(&cfg, Role::User, "mcp__docs__search").await,
            ToolDecision::Run
        );
        let text = refusal_text(decide(&cfg, Role::User, "mcp__github__search").await);
        assert!(text.contains("is not available to this user"), "{text}");
        let text = refusal_text(decide(&cfg, Role::Admin, "mcp__prod__drop").await);
        assert!(text.contains("is disabled on this server"), "{text}");
        // The star is only a wildcard at the end, and `mcp__docs_` is not `mcp__docs__`.
        assert!(!names("mcp__docs__*", "mcp__docs_x"));
        assert!(!names("a*b", "axb"));
        // Default: MCP tools are the operators'.
        let default = GuardrailConfig::default();
        assert_eq!(
            decide(&default, Role::Admin, "mcp__github__create_issue").await,
            ToolDecision::Run
        );
    }

    #[tokio::test]
    async fn an_admins_calls_run() {
        let cfg = GuardrailConfig::default();
        for tool in ["bash", "write_file", "read_file"] {
            assert_eq!(decide(&cfg, Role::Admin, tool).await, ToolDecision::Run);
        }
    }

    #[tokio::test]
    async fn denied_applies_to_admins_too() {
        let cfg = GuardrailConfig {
            denied: vec!["bash".to_owned()],
            ..GuardrailConfig::default()
        };
        for role in [Role::Admin, Role::User] {
            let text = refusal_text(decide(&cfg, role, "bash").await);
            assert!(text.contains("disabled on this server"), "{text}");
        }
    }

    #[tokio::test]
    async fn user_allowed_is_an_allowlist_for_users_only() {
        let cfg = GuardrailConfig {
            user_allowed: vec!["read_file".to_owned(), "bash".to_owned()],
            ..GuardrailConfig::default()
        };
        assert_eq!(
            decide(&cfg, Role::User, "read_file").await,
            ToolDecision::Run
        );
        let text = refusal_text(decide(&cfg, Role::User, "ls").await);
        assert!(text.contains("not available to this user"), "{text}");
        // admin_only wins over the allowlist.
        let text = refusal_text(decide(&cfg, Role::User, "bash").await);
        assert!(text.contains("needs an operator"), "{text}");
        assert_eq!(decide(&cfg, Role::Admin, "ls").await, ToolDecision::Run);
    }

    #[tokio::test]
    async fn it_fails_closed() {
        let middleware = GuardrailMiddleware::from_config(&GuardrailConfig::default()).unwrap();
        assert_eq!(middleware.failure_policy(), FailurePolicy::FailClosed);
        // A call it cannot judge is refused by the chain.
        let text = refusal_text(decide(&GuardrailConfig::default(), Role::Admin, " ").await);
        assert!(text.contains("refused"), "{text}");
    }

    #[tokio::test]
    async fn refused_tools_are_not_offered() {
        let middleware = GuardrailMiddleware::from_config(&GuardrailConfig::default()).unwrap();
        let spec = |name: &str| {
            Arc::new(ToolSpec {
                name: name.to_owned(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            })
        };
        for (role, expected) in [
            (Role::User, vec!["read_file"]),
            (Role::Admin, vec!["bash", "read_file"]),
        ] {
            let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
            let input = input(role);
            let model = Arc::new(ScriptedModel::new(Vec::new()));
            let mut cx = RunContext::new(&mut thread, &input, model.clone());
            let mut request = ModelRequest {
                messages: Vec::new(),
                tools: vec![spec("bash"), spec("read_file")],
            };
            middleware
                .before_model(&mut cx, &mut request)
                .await
                .unwrap();
            let names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, expected);
        }
    }
}
