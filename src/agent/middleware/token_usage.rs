//! token_usage (chain position 10): counts the tokens of every model call.
//!
//! In `after_model` it adds the provider's `usage` (when reported) to the run's total
//! (`RunContext::run_usage`) and the thread's total (`ThreadState::usage`, persisted with the
//! thread), and counts them in the `antler_tokens_total{kind="prompt"|"completion"}` metric.
//! A response without usage changes nothing. In `after_tool` it adds the usage a tool call
//! reports (a subagent's model calls, through the `task` tool) the same way, so a thread's
//! total includes the work it delegated.
//!
//! Placement: `after_model` hooks run in reverse chain order, so at position 10 it runs after
//! the later middlewares (loop_detection, subagent_limit, ...) have rewritten the response.
//! Those rewrites never touch `usage`, so the count is the same either way; sitting late keeps
//! it next to `title` among the bookkeeping observers. It fails open: losing a count must
//! never stop a run.

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext, ToolOutput};
use crate::agent::message::{TokenUsage, ToolCall};
use crate::agent::model::ModelResponse;

/// `[agent.middleware.token_usage]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TokenUsageConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
}

impl Default for TokenUsageConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Adds each model call's token usage to the run and the thread.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenUsageMiddleware;

impl TokenUsageMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &TokenUsageConfig) -> Option<Self> {
        cfg.enabled.then_some(Self)
    }
}

#[async_trait::async_trait]
impl Middleware for TokenUsageMiddleware {
    fn name(&self) -> &'static str {
        "token_usage"
    }

    async fn after_model(
        &self,
        cx: &mut RunContext<'_>,
        response: &mut ModelResponse,
    ) -> Result<(), MiddlewareError> {
        if let Some(usage) = response.usage {
            count(cx, &usage, false);
        }
        Ok(())
    }

    async fn after_tool(
        &self,
        cx: &mut RunContext<'_>,
        _call: &ToolCall,
        output: &mut ToolOutput,
    ) -> Result<(), MiddlewareError> {
        if let Some(usage) = output.usage {
            count(cx, &usage, true);
        }
        Ok(())
    }
}

/// Adds `usage` to the run's and the thread's totals and to the metrics; `delegated` usage
/// (a subagent's) was counted in the metrics by the subagent's own run already.
fn count(cx: &mut RunContext<'_>, usage: &TokenUsage, delegated: bool) {
    cx.run_usage.add(usage);
    cx.thread.usage.add(usage);
    if !delegated {
        metrics::counter!("antler_tokens_total", "kind" => "prompt").increment(usage.prompt_tokens);
        metrics::counter!("antler_tokens_total", "kind" => "completion")
            .increment(usage.completion_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::model::FinishReason;
    use crate::agent::thread::ThreadState;

    fn response(usage: Option<TokenUsage>) -> ModelResponse {
        ModelResponse {
            content: "ok".into(),
            tool_calls: Vec::new(),
            usage,
            finish_reason: FinishReason::Stop,
            reasoning: None,
        }
    }

    fn usage(prompt: u64, completion: u64) -> TokenUsage {
        TokenUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }

    #[tokio::test]
    async fn sums_usage_across_model_calls_into_run_and_thread() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        // Usage from earlier turns stays in the thread total.
        thread.usage = usage(1000, 100);
        let middleware = TokenUsageMiddleware;
        let mut cx = test_context(&mut thread);
        middleware
            .after_model(&mut cx, &mut response(Some(usage(10, 5))))
            .await
            .unwrap();
        middleware
            .after_model(&mut cx, &mut response(Some(usage(20, 7))))
            .await
            .unwrap();
        assert_eq!(cx.run_usage, usage(30, 12));
        assert_eq!(cx.run_usage.total_tokens, 42);
        assert_eq!(thread.usage, usage(1030, 112));
    }

    #[tokio::test]
    async fn a_subagents_usage_reported_by_its_tool_call_is_added() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let middleware = TokenUsageMiddleware;
        let mut cx = test_context(&mut thread);
        let call = ToolCall {
            id: "c1".into(),
            name: "task".into(),
            arguments: "{}".into(),
        };
        let mut output = ToolOutput {
            usage: Some(usage(300, 40)),
            ..ToolOutput::ok("Task succeeded. Result: 42")
        };
        middleware
            .after_tool(&mut cx, &call, &mut output)
            .await
            .unwrap();
        middleware
            .after_tool(&mut cx, &call, &mut ToolOutput::ok("plain"))
            .await
            .unwrap();
        assert_eq!(cx.run_usage, usage(300, 40));
        assert_eq!(thread.usage, usage(300, 40));
    }

    #[tokio::test]
    async fn missing_usage_is_a_no_op() {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let middleware = TokenUsageMiddleware;
        let mut cx = test_context(&mut thread);
        let mut r = response(None);
        middleware.after_model(&mut cx, &mut r).await.unwrap();
        assert_eq!(cx.run_usage, TokenUsage::default());
        assert_eq!(r, response(None));
        assert_eq!(thread.usage, TokenUsage::default());
    }

    #[test]
    fn disabled_config_gives_none() {
        assert!(TokenUsageMiddleware::from_config(&TokenUsageConfig { enabled: false }).is_none());
        assert!(TokenUsageMiddleware::from_config(&TokenUsageConfig::default()).is_some());
    }
}
