//! The run loop: one user message in, one answer out.
//!
//! `before_run → loop { before_model → model → after_model → tool calls } → after_run`, with a
//! cap on model calls. The thread is changed in place; the caller persists it. After each round
//! of tool results the observer may checkpoint it, so a crash re-runs as little as possible.

use std::sync::Arc;

use super::message::ChatMessage;
use super::middleware::{ChainAbort, MiddlewareChain, RunContext, ToolDecision};
use super::model::{ChatModel, ModelError, ModelRequest};
use super::thread::ThreadState;
use super::tools::ToolRegistry;

/// What the runtime tells its caller while a run is going on.
#[async_trait::async_trait]
pub(crate) trait RunObserver: Send + Sync {
    /// A fragment of streamed answer text.
    fn delta(&self, text: &str);

    /// The thread after a round of tool results; a good moment to save it (the observer
    /// records what it saved in `thread.saved_messages`).
    async fn checkpoint(&self, thread: &mut ThreadState);
}

/// An observer that ignores everything.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Unobserved;

#[cfg(test)]
#[async_trait::async_trait]
impl RunObserver for Unobserved {
    fn delta(&self, _text: &str) {}

    async fn checkpoint(&self, _thread: &mut ThreadState) {}
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunOutcome {
    /// The text to send to the user.
    pub(crate) answer: String,
    /// Model calls made.
    pub(crate) model_calls: u32,
    /// Why the run stopped early (`loop_capped`, `iteration_limit`), if it did.
    pub(crate) stop_reason: Option<String>,
}

/// Why a run failed. Tool failures are not here: they are results for the model.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Middleware(#[from] ChainAbort),
}

impl RunError {
    /// What to tell the person who sent the message: what went wrong and what helps, without
    /// the provider's raw text (that goes to the log).
    pub(crate) fn user_message(&self) -> String {
        match self {
            Self::Model(e) => e.user_message(),
            Self::Middleware(abort) => format!(
                "⚠️ Sorry, this turn was stopped by antler's `{}` check. The details are in \
                 antler's log.",
                abort.name
            ),
        }
    }
}

/// The agent: a model, tools, a middleware chain and a system prompt.
#[derive(Clone)]
pub(crate) struct Runtime {
    model: Arc<dyn ChatModel>,
    tools: ToolRegistry,
    chain: MiddlewareChain,
    system_prompt: String,
    max_model_calls: u32,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("model", &self.model.name())
            .field("tools", &self.tools)
            .field("chain", &self.chain)
            .field("max_model_calls", &self.max_model_calls)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    pub(crate) fn new(
        model: Arc<dyn ChatModel>,
        tools: ToolRegistry,
        chain: MiddlewareChain,
        system_prompt: String,
        max_model_calls: u32,
    ) -> Self {
        Self {
            model,
            tools,
            chain,
            system_prompt,
            max_model_calls: max_model_calls.max(1),
        }
    }

    /// The model's name.
    pub(crate) fn model_name(&self) -> &str {
        self.model.name()
    }

    /// The middleware names in chain order.
    pub(crate) fn middleware_names(&self) -> Vec<&'static str> {
        self.chain.names()
    }

    /// Runs one turn for `user_text` on `thread`.
    pub(crate) async fn run(
        &self,
        thread: &mut ThreadState,
        user_id: &str,
        user_text: &str,
        observer: &dyn RunObserver,
    ) -> Result<RunOutcome, RunError> {
        thread.messages.push(ChatMessage::user(user_text));
        self.resume(thread, user_id, observer).await
    }

    /// Continues a turn whose user message (and maybe some rounds of tool results) is already
    /// at the end of `thread`: the re-run of a turn interrupted after a checkpoint.
    pub(crate) async fn resume(
        &self,
        thread: &mut ThreadState,
        user_id: &str,
        observer: &dyn RunObserver,
    ) -> Result<RunOutcome, RunError> {
        let mut cx = RunContext {
            thread,
            user_id,
            model_calls: 0,
            run_usage: Default::default(),
            stop_reason: None,
        };
        tracing::debug!(thread = %cx.thread.id, user = cx.user_id, "run starts");
        let result = self.run_loop(&mut cx, observer).await;
        // after_run hooks see every run, also failed ones (usage, memory, cleanup).
        let after = self.chain.after_run(&mut cx).await;
        let answer = result?;
        after?;
        cx.thread.turns += 1;
        Ok(RunOutcome {
            answer,
            model_calls: cx.model_calls,
            stop_reason: cx.stop_reason,
        })
    }

    async fn run_loop(
        &self,
        cx: &mut RunContext<'_>,
        observer: &dyn RunObserver,
    ) -> Result<String, RunError> {
        self.chain.before_run(cx).await?;
        let tools = self.tools.specs();
        let sink = |text: &str| observer.delta(text);
        loop {
            let mut request = ModelRequest {
                // Failed turns stay in the thread for people, not for the model.
                messages: std::iter::once(ChatMessage::system(&self.system_prompt))
                    .chain(cx.thread.context().cloned())
                    .collect(),
                tools: tools.clone(),
            };
            self.chain.before_model(cx, &mut request).await?;
            let mut response = self.model.complete(&request, Some(&sink)).await?;
            cx.model_calls += 1;
            self.chain.after_model(cx, &mut response).await?;

            let last_allowed = cx.model_calls >= self.max_model_calls;
            if last_allowed && !response.tool_calls.is_empty() {
                // Out of model calls: keep the text, drop calls that would need another round.
                response.tool_calls.clear();
                cx.stop_reason
                    .get_or_insert_with(|| "iteration_limit".to_owned());
                if response.content.trim().is_empty() {
                    response.content = format!(
                        "I stopped after {} steps without reaching a final answer.",
                        cx.model_calls
                    );
                }
            }
            let calls = std::mem::take(&mut response.tool_calls);
            cx.thread.messages.push(ChatMessage::Assistant {
                content: response.content.clone(),
                tool_calls: calls.clone(),
                reasoning: response.reasoning.take(),
            });
            if calls.is_empty() {
                return Ok(response.content);
            }
            for call in &calls {
                let mut output = match self.chain.before_tool(cx, call).await {
                    ToolDecision::Run => self.tools.call(call).await,
                    ToolDecision::Skip(output) => output,
                };
                self.chain.after_tool(cx, call, &mut output).await?;
                if output.is_error {
                    tracing::debug!(tool = %call.name, "tool call answered with an error");
                }
                cx.thread
                    .messages
                    .push(ChatMessage::tool(call.id.clone(), output.content));
            }
            observer.checkpoint(cx.thread).await;
        }
    }
}

#[cfg(test)]
mod tests;
