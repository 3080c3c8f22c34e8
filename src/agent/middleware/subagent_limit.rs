//! subagent_limit (chain position 15): at most 3 `task` calls per model response, 6 per run.
//!
//! Each `task` call starts a subagent, which is expensive; a model asked to "research ten
//! things" may fan out far too wide. In `before_tool` this middleware refuses the calls over
//! either cap: the first `max_per_response` (3) `task` calls of a response may run, and the
//! run as a whole may start `max_per_run` (6). A refused call is answered, not run ("Not run:
//! at most 3 task calls per response ..."), so every tool call id keeps exactly one result
//! and the conversation stays valid for OpenAI-compatible providers; the model learns why and
//! can call again after it has the first results.
//!
//! The count needs no state of its own: it is read from the thread. The current response is
//! the last assistant message (the runtime stores it before running its calls); the run's
//! earlier `task` calls are those of the assistant messages since the turn's user message,
//! less the ones this middleware answered as not run. So a turn re-run after a crash counts
//! the same way, and concurrent runs on other threads never share a counter.
//!
//! Placement: late in the chain, next to loop_detection, as in DeerFlow; it only looks at
//! `task` calls (`tool_name`), so every other tool is unaffected, and a refusal by an earlier
//! guard (guardrail) stands. It fails open.
//!
//! Deviation from DeerFlow: DeerFlow strips the extra calls from the response in
//! `after_model` (and, when the run cap is exhausted, strips all task calls and ends with
//! "[SUBAGENT LIMIT REACHED]"); here they stay in the history and are answered as not run, so
//! the model sees what happened to each call and the run goes on.

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::message::{ChatMessage, ToolCall};
use crate::agent::thread::ThreadState;

/// How a refusal starts; refused calls are recognised by it when the run's calls are counted.
const NOT_RUN: &str = "Not run: at most";

/// `[agent.middleware.subagent_limit]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SubagentLimitConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// `task` calls of one model response that may run, `1..=4`.
    pub(crate) max_per_response: usize,
    /// `task` calls of one run that may run, `1..=50`.
    pub(crate) max_per_run: usize,
    /// The tool that starts a subagent.
    pub(crate) tool_name: String,
}

impl Default for SubagentLimitConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_per_response: 3,
            max_per_run: 6,
            tool_name: "task".to_owned(),
        }
    }
}

/// The caps [`SubagentLimitMiddleware`] enforces, as the `task` tool states them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SubagentLimits {
    /// Calls of one response that may start a task.
    pub(crate) per_response: usize,
    /// Calls of one run that may start a task.
    pub(crate) per_run: usize,
}

/// Caps the subagent calls of a response and of a run.
#[derive(Debug, Clone)]
pub(crate) struct SubagentLimitMiddleware {
    max_per_response: usize,
    max_per_run: usize,
    tool_name: String,
}

impl SubagentLimitMiddleware {
    /// The middleware, or `None` when it is disabled. Limits below 1 are raised to 1.
    pub(crate) fn from_config(cfg: &SubagentLimitConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            max_per_response: cfg.max_per_response.max(1),
            max_per_run: cfg.max_per_run.max(1),
            tool_name: cfg.tool_name.clone(),
        })
    }

    /// The caps, when they apply to the calls of `tool` (the configured `tool_name`).
    pub(crate) fn limits_of(&self, tool: &str) -> Option<SubagentLimits> {
        (self.tool_name == tool).then_some(SubagentLimits {
            per_response: self.max_per_response,
            per_run: self.max_per_run,
        })
    }

    /// Why `call` must not run, or `None` when it may.
    fn refusal(&self, thread: &ThreadState, call: &ToolCall) -> Option<String> {
        let start = thread.turn_start().unwrap_or(0);
        let messages = thread.messages.get(start..).unwrap_or_default();
        let current = messages
            .iter()
            .rposition(|m| matches!(m, ChatMessage::Assistant { .. }))?;
        let refused = |id: &str| {
            messages.iter().any(|m| {
                matches!(m, ChatMessage::Tool { tool_call_id, content }
                    if tool_call_id == id && content.starts_with(NOT_RUN))
            })
        };
        let earlier_run = messages
            .get(..current)
            .unwrap_or_default()
            .iter()
            .filter_map(|m| match m {
                ChatMessage::Assistant { tool_calls, .. } => Some(tool_calls),
                _ => None,
            })
            .flatten()
            .filter(|c| c.name == self.tool_name && !refused(&c.id))
            .count();
        let Some(ChatMessage::Assistant { tool_calls, .. }) = messages.get(current) else {
            return None;
        };
        // Walk the response's task calls in order, as the runtime asks about them.
        let mut allowed = 0;
        for (index, task) in tool_calls
            .iter()
            .filter(|c| c.name == self.tool_name)
            .enumerate()
        {
            let verdict = if index >= self.max_per_response {
                Some(format!(
                    "{NOT_RUN} {} {} calls per response; this was call {} of this response. \
                     Wait for the results of the others, then call `{}` again if it is still \
                     needed.",
                    self.max_per_response,
                    self.tool_name,
                    index + 1,
                    self.tool_name
                ))
            } else if earlier_run + allowed >= self.max_per_run {
                Some(format!(
                    "{NOT_RUN} {} {} calls per run, and this run has used them all. Continue \
                     with the results you have.",
                    self.max_per_run, self.tool_name
                ))
            } else {
                allowed += 1;
                None
            };
            if task.id == call.id {
                return verdict;
            }
        }
        None
    }
}

#[async_trait::async_trait]
impl Middleware for SubagentLimitMiddleware {
    fn name(&self) -> &'static str {
        "subagent_limit"
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        _refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        if call.name != self.tool_name {
            return Ok(ToolDecision::Run);
        }
        Ok(match self.refusal(cx.thread, call) {
            Some(reason) => {
                tracing::info!(thread = %cx.thread.id, call = %call.id, "subagent call over the limit answered as not run");
                metrics::counter!("antler_subagent_calls_refused_total").increment(1);
                ToolDecision::Skip(ToolOutput::error(reason))
            }
            None => ToolDecision::Run,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::agent::input::RunInput;
    use crate::agent::middleware::{Middleware, MiddlewareChain};
    use crate::agent::model::ToolSpec;
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::runtime::{RunLimits, Runtime, RuntimeSettings, Unobserved};
    use crate::agent::tools::{Tool, ToolContext, ToolError, ToolRegistry};

    /// A stand-in for the subagent tool: counts its runs.
    struct StubTask(Arc<AtomicUsize>);

    #[async_trait::async_trait]
    impl Tool for StubTask {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: "task".into(),
                description: "delegates".into(),
                parameters: serde_json::json!({"type": "object"}),
            }
        }

        async fn call(
            &self,
            _arguments: serde_json::Value,
            _cx: &ToolContext,
        ) -> Result<String, ToolError> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(format!("task {n} done"))
        }
    }

    fn task_calls(prefix: &str, n: usize) -> Vec<(String, String, String)> {
        (0..n)
            .map(|i| (format!("{prefix}{i}"), "task".to_owned(), "{}".to_owned()))
            .collect()
    }

    fn response(calls: &[(String, String, String)]) -> ScriptedResponse {
        let refs: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
            .collect();
        ScriptedModel::calls(&refs)
    }

    type ScriptedResponse =
        Result<crate::agent::model::ModelResponse, crate::agent::model::ModelError>;

    /// Runs one turn with the stub `task` tool and the middleware; returns the stub's runs
    /// and the thread.
    async fn run(script: Vec<ScriptedResponse>, cfg: &SubagentLimitConfig) -> (usize, ThreadState) {
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tools = ToolRegistry::builtin();
        tools.register(Arc::new(StubTask(Arc::clone(&runs))));
        let middleware: Arc<dyn Middleware> =
            Arc::new(SubagentLimitMiddleware::from_config(cfg).unwrap());
        let runtime = Runtime::new(
            Arc::new(ScriptedModel::new(script)),
            tools,
            MiddlewareChain::new(vec![middleware]).unwrap(),
            RuntimeSettings {
                system_prompt: crate::live::Live::text("be brief"),
                max_model_calls: 10,
                max_parallel_tools: 4,
                context_tokens: 0,
                data_root: std::env::temp_dir().join("antler-subagent-limit-tests"),
                timezone: jiff::tz::TimeZone::UTC,
                token_budget: None,
            },
        );
        let mut thread = ThreadState::new("t1".into(), "api:c".into(), 0, 0);
        let limits = RunLimits {
            timeout: Duration::from_secs(600),
            cancel: CancellationToken::new(),
        };
        runtime
            .run(
                &mut thread,
                &RunInput::text("api", "u", "fan out"),
                &Unobserved,
                &limits,
            )
            .await;
        (runs.load(Ordering::SeqCst), thread)
    }

    fn result_of<'a>(thread: &'a ThreadState, id: &str) -> &'a str {
        thread
            .messages
            .iter()
            .find_map(|m| match m {
                ChatMessage::Tool {
                    tool_call_id,
                    content,
                } if tool_call_id == id => Some(content.as_str()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no result for {id}"))
    }

    #[tokio::test]
    async fn five_task_calls_in_one_response_run_three() {
        let (runs, thread) = run(
            vec![response(&task_calls("a", 5)), ScriptedModel::text("done")],
            &SubagentLimitConfig::default(),
        )
        .await;
        assert_eq!(runs, 3);
        for id in ["a0", "a1", "a2"] {
            assert!(result_of(&thread, id).starts_with("task "), "{id}");
        }
        for (id, n) in [("a3", 4), ("a4", 5)] {
            let text = result_of(&thread, id);
            assert!(
                text.starts_with("Not run: at most 3 task calls per response"),
                "{text}"
            );
            assert!(
                text.contains(&format!("call {n} of this response")),
                "{text}"
            );
        }
        // Every call has exactly one result.
        let results = thread
            .messages
            .iter()
            .filter(|m| matches!(m, ChatMessage::Tool { .. }))
            .count();
        assert_eq!(results, 5);
    }

    #[tokio::test]
    async fn the_run_cap_holds_across_responses() {
        let (runs, thread) = run(
            vec![
                response(&task_calls("a", 3)),
                response(&task_calls("b", 3)),
                response(&task_calls("c", 2)),
                ScriptedModel::text("done"),
            ],
            &SubagentLimitConfig::default(),
        )
        .await;
        assert_eq!(runs, 6);
        for id in ["c0", "c1"] {
            let text = result_of(&thread, id);
            assert!(
                text.starts_with("Not run: at most 6 task calls per run"),
                "{text}"
            );
        }
        assert_eq!(
            thread.messages.last(),
            Some(&ChatMessage::assistant("done"))
        );
    }

    #[tokio::test]
    async fn refused_calls_do_not_use_up_the_run_cap_and_other_tools_run() {
        let cfg = SubagentLimitConfig {
            max_per_response: 2,
            max_per_run: 4,
            ..SubagentLimitConfig::default()
        };
        let mut first = task_calls("a", 3);
        first.push(("t0".into(), "current_time".into(), "{}".into()));
        let (runs, thread) = run(
            vec![
                response(&first),
                response(&task_calls("b", 3)),
                ScriptedModel::text("done"),
            ],
            &cfg,
        )
        .await;
        // a0, a1 ran, a2 refused (per response); b0, b1 ran (2 + 2 = 4), b2 refused.
        assert_eq!(runs, 4);
        assert!(result_of(&thread, "a2").contains("per response"));
        assert!(result_of(&thread, "b2").starts_with("Not run: at most 2 task calls per response"));
        assert!(!result_of(&thread, "t0").starts_with("Not run"));
    }

    #[tokio::test]
    async fn the_count_starts_again_with_each_turn() {
        let cfg = SubagentLimitConfig {
            max_per_run: 2,
            ..SubagentLimitConfig::default()
        };
        let middleware = SubagentLimitMiddleware::from_config(&cfg).unwrap();
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages.push(ChatMessage::user("first turn"));
        let earlier: Vec<ToolCall> = (0..2)
            .map(|i| ToolCall {
                id: format!("old{i}"),
                name: "task".into(),
                arguments: "{}".into(),
            })
            .collect();
        thread
            .messages
            .push(ChatMessage::assistant_calls("", earlier.clone()));
        for call in &earlier {
            thread.messages.push(ChatMessage::tool(&call.id, "ok"));
        }
        thread.messages.push(ChatMessage::assistant("answered"));
        thread.messages.push(ChatMessage::user("second turn"));
        let call = ToolCall {
            id: "new".into(),
            name: "task".into(),
            arguments: "{}".into(),
        };
        thread
            .messages
            .push(ChatMessage::assistant_calls("", vec![call.clone()]));
        assert_eq!(middleware.refusal(&thread, &call), None);
    }
}
