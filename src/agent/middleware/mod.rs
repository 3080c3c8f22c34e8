//! The middleware chain around model calls and tool calls.
//!
//! A run is `before_run → loop { before_model → MODEL → after_model → for each tool call
//! { before_tool → TOOL → after_tool } } → after_run`. `before_*` hooks run in chain order,
//! `after_*` hooks in reverse, so the first middleware is the outermost layer.
//!
//! The order is data: [`CHAIN_ORDER`] names every middleware antler knows, where it sits and
//! why; [`MiddlewareChain::new`] refuses a chain that breaks it. Observers fail open (an error
//! is logged and the run goes on); guards fail closed (an error stops what they guard).

pub(crate) mod approval;
pub(crate) mod clarification;
mod context;
pub(crate) mod dangling_tool_call;
pub(crate) mod deferred_tools;
pub(crate) mod guardrail;
pub(crate) mod input_sanitization;
pub(crate) mod loop_detection;
pub(crate) mod memory;
pub(crate) mod pending_title;
pub(crate) mod sandbox_audit;
pub(crate) mod skills;
pub(crate) mod subagent_limit;
pub(crate) mod summarization;
pub(crate) mod thread_data;
pub(crate) mod title;
pub(crate) mod todo;
pub(crate) mod token_usage;
pub(crate) mod tool_output_budget;
pub(crate) mod uploads;
pub(crate) mod view_image;

use std::sync::Arc;

pub(crate) use context::{RunContext, RunControl, RunEnding, RunOutputs};

use super::message::ToolCall;
use super::model::{ModelRequest, ModelResponse};
#[cfg(test)]
use super::thread::ThreadState;
use super::tools::{Tool, ToolOutput};

/// Every middleware antler knows, in chain order, with the reason for its place
/// (docs/architecture.md, "Agent runtime").
pub(crate) const CHAIN_ORDER: &[(&str, &str)] = &[
    (
        "thread_data",
        "sets up the per-thread workspace every later middleware may use",
    ),
    (
        "uploads",
        "needs the workspace to store attachments before the model sees them",
    ),
    (
        "input_sanitization",
        "neutralises user text before anything injects trusted blocks",
    ),
    (
        "dangling_tool_call",
        "repairs unanswered tool calls before any later hook reads or extends the request",
    ),
    (
        "guardrail",
        "authorizes tool calls before anything else inspects or runs them",
    ),
    (
        "sandbox_audit",
        "audits shell commands that the guardrail allowed",
    ),
    (
        "tool_output_budget",
        "cuts tool output before it is stored or summarized",
    ),
    (
        "summarization",
        "compacts history before per-request context is added",
    ),
    (
        "skills",
        "lists skills after compaction and narrows tools after the guardrail decided by role",
    ),
    ("todo", "plan reminders are added to the compacted history"),
    (
        "token_usage",
        "its after_model runs late (reverse order), after other hooks rewrote the response",
    ),
    (
        "title",
        "titles the final answer, after loop detection may have rewritten it",
    ),
    (
        "memory",
        "injects memory close to the model call and queues updates after the run",
    ),
    (
        "view_image",
        "adds images to the request after memory and context are in place",
    ),
    (
        "deferred_tools",
        "filters the tool list just before the model sees it",
    ),
    (
        "subagent_limit",
        "caps task calls in the raw model response, before other after_model hooks",
    ),
    (
        "loop_detection",
        "must see the raw tool calls first (its after_model runs early) and inject warnings last",
    ),
    (
        "approval",
        "asks a person only about calls every other guard let through; before clarification",
    ),
    (
        "clarification",
        "interrupts the run at the tool call; always last",
    ),
];

/// What `before_tool` decides about one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolDecision {
    /// Run the tool.
    Run,
    /// Do not run it; answer the model with this result instead.
    Skip(ToolOutput),
    /// Do not run it and do not answer it: it waits for a person (`approval`). The
    /// response's other calls run, then the run ends with this call unanswered in the
    /// thread; a later run resumes it.
    Hold,
}

/// How a middleware's own failure is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailurePolicy {
    /// Observers: log the error, carry on as if the hook had done nothing.
    FailOpen,
    /// Guards: the error stops the guarded step (a tool call is refused, a run fails).
    FailClosed,
}

/// A middleware's own failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct MiddlewareError(pub(crate) String);

/// A chain that breaks [`CHAIN_ORDER`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ChainError {
    /// A name that is not in [`CHAIN_ORDER`].
    #[error("unknown middleware `{0}`")]
    Unknown(String),
    /// The same middleware twice.
    #[error("middleware `{0}` appears twice")]
    Duplicate(String),
    /// Two middlewares in the wrong order.
    #[error("middleware `{later}` must come after `{earlier}`: {reason}")]
    OutOfOrder {
        /// The one that must come first.
        earlier: String,
        /// The one that must come later.
        later: String,
        /// Why the later one sits where it does.
        reason: String,
    },
}

/// One middleware: hooks with no-op defaults.
#[async_trait::async_trait]
pub(crate) trait Middleware: Send + Sync {
    /// Its name in [`CHAIN_ORDER`] and in config.
    fn name(&self) -> &'static str;

    /// How its failures are treated.
    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::FailOpen
    }

    /// Tools this middleware offers the model (a todo list, `ask_clarification`); they join
    /// the runtime's registry when the runtime is built.
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        Vec::new()
    }

    /// Once, before the first model call of a run.
    async fn before_run(&self, _cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        Ok(())
    }

    /// Before each model call; may change the request (not the stored history).
    async fn before_model(
        &self,
        _cx: &mut RunContext<'_>,
        _request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        Ok(())
    }

    /// After each model call, in reverse chain order; may rewrite the response before it is
    /// stored (strip tool calls, append a note).
    async fn after_model(
        &self,
        _cx: &mut RunContext<'_>,
        _response: &mut ModelResponse,
    ) -> Result<(), MiddlewareError> {
        Ok(())
    }

    /// Before each tool call; may refuse it. Every hook sees every call: `refused` is the
    /// answer of an earlier hook that already refused it (the first refusal stands).
    async fn before_tool(
        &self,
        _cx: &mut RunContext<'_>,
        _call: &ToolCall,
        _refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        Ok(ToolDecision::Run)
    }

    /// After each tool call, in reverse chain order; may rewrite the result.
    async fn after_tool(
        &self,
        _cx: &mut RunContext<'_>,
        _call: &ToolCall,
        _output: &mut ToolOutput,
    ) -> Result<(), MiddlewareError> {
        Ok(())
    }

    /// Once, after the run ended, however it ended (`cx.ending` says how: answered,
    /// interrupted, stopped, failed or timed out), in reverse chain order.
    async fn after_run(&self, _cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        Ok(())
    }
}

/// A validated, ordered list of middlewares and the hook runner.
#[derive(Clone, Default)]
pub(crate) struct MiddlewareChain {
    items: Vec<Arc<dyn Middleware>>,
}

impl std::fmt::Debug for MiddlewareChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.items.iter().map(|m| m.name()))
            .finish()
    }
}

/// A fail-closed middleware refused to let the run go on.
#[derive(Debug, thiserror::Error)]
#[error("middleware `{name}` failed: {source}")]
pub(crate) struct ChainAbort {
    pub(crate) name: &'static str,
    #[source]
    pub(crate) source: MiddlewareError,
}

impl MiddlewareChain {
    /// Builds a chain, checking it against [`CHAIN_ORDER`].
    pub(crate) fn new(items: Vec<Arc<dyn Middleware>>) -> Result<Self, ChainError> {
        let mut last: Option<(usize, &str)> = None;
        for item in &items {
            let name = item.name();
            let Some(position) = CHAIN_ORDER.iter().position(|(n, _)| *n == name) else {
                return Err(ChainError::Unknown(name.to_owned()));
            };
            if let Some((last_position, last_name)) = last {
                if position == last_position {
                    return Err(ChainError::Duplicate(name.to_owned()));
                }
                if position < last_position {
                    let reason = CHAIN_ORDER
                        .get(last_position)
                        .map(|(_, why)| *why)
                        .unwrap_or_default();
                    return Err(ChainError::OutOfOrder {
                        earlier: name.to_owned(),
                        later: last_name.to_owned(),
                        reason: reason.to_owned(),
                    });
                }
            }
            last = Some((position, name));
        }
        Ok(Self { items })
    }

    /// The same chain with only the middlewares named in `names` (order kept).
    #[must_use]
    pub(crate) fn only(&self, names: &[&str]) -> Self {
        Self {
            items: self
                .items
                .iter()
                .filter(|m| names.contains(&m.name()))
                .cloned()
                .collect(),
        }
    }

    /// The middleware names in chain order.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.items.iter().map(|m| m.name()).collect()
    }

    fn settle(
        item: &Arc<dyn Middleware>,
        hook: &'static str,
        result: Result<(), MiddlewareError>,
    ) -> Result<(), ChainAbort> {
        match result {
            Ok(()) => Ok(()),
            Err(source) => match item.failure_policy() {
                FailurePolicy::FailOpen => {
                    tracing::warn!(middleware = item.name(), hook, error = %source, "middleware failed open");
                    metrics::counter!("antler_middleware_errors_total", "middleware" => item.name()).increment(1);
                    Ok(())
                }
                FailurePolicy::FailClosed => Err(ChainAbort {
                    name: item.name(),
                    source,
                }),
            },
        }
    }

    pub(crate) async fn before_run(&self, cx: &mut RunContext<'_>) -> Result<(), ChainAbort> {
        for item in &self.items {
            let result = item.before_run(cx).await;
            Self::settle(item, "before_run", result)?;
        }
        Ok(())
    }

    pub(crate) async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), ChainAbort> {
        for item in &self.items {
            let result = item.before_model(cx, request).await;
            Self::settle(item, "before_model", result)?;
        }
        Ok(())
    }

    pub(crate) async fn after_model(
        &self,
        cx: &mut RunContext<'_>,
        response: &mut ModelResponse,
    ) -> Result<(), ChainAbort> {
        for item in self.items.iter().rev() {
            let result = item.after_model(cx, response).await;
            Self::settle(item, "after_model", result)?;
        }
        Ok(())
    }

    /// Asks every middleware in order; the first `Skip` wins, and later hooks still see the
    /// call (with that refusal); a `Hold` stands unless a hook refuses. A failing guard
    /// refuses the call.
    pub(crate) async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
    ) -> ToolDecision {
        let mut refusal: Option<ToolOutput> = None;
        let mut held = false;
        for item in &self.items {
            match item.before_tool(cx, call, refusal.as_ref()).await {
                Ok(ToolDecision::Run) => {}
                Ok(ToolDecision::Hold) => held = true,
                Ok(ToolDecision::Skip(output)) => {
                    refusal.get_or_insert(output);
                }
                Err(error) => {
                    if Self::settle(item, "before_tool", Err(error)).is_err() {
                        refusal.get_or_insert_with(|| {
                            ToolOutput::error(format!(
                                "Tool call `{}` was refused: the {} check failed.",
                                call.name,
                                item.name()
                            ))
                        });
                    }
                }
            }
        }
        match refusal {
            Some(output) => ToolDecision::Skip(output),
            None if held => ToolDecision::Hold,
            None => ToolDecision::Run,
        }
    }

    /// The tools the middlewares contribute, in chain order.
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.items.iter().flat_map(|m| m.tools()).collect()
    }

    pub(crate) async fn after_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        output: &mut ToolOutput,
    ) -> Result<(), ChainAbort> {
        for item in self.items.iter().rev() {
            let result = item.after_tool(cx, call, output).await;
            Self::settle(item, "after_tool", result)?;
        }
        Ok(())
    }

    pub(crate) async fn after_run(&self, cx: &mut RunContext<'_>) -> Result<(), ChainAbort> {
        for item in self.items.iter().rev() {
            let result = item.after_run(cx).await;
            Self::settle(item, "after_run", result)?;
        }
        Ok(())
    }
}

/// A run context for tests: user `test:user`, no model calls yet, no usage, not stopped;
/// helper model calls fail as unreachable.
#[cfg(test)]
pub(crate) fn test_context(thread: &mut ThreadState) -> RunContext<'_> {
    use std::sync::LazyLock;

    use crate::agent::input::RunInput;
    use crate::agent::model::ChatModel;
    use crate::agent::model::scripted::ScriptedModel;

    static INPUT: LazyLock<RunInput> = LazyLock::new(|| RunInput::text("test", "user", "hi"));
    static MODEL: LazyLock<Arc<dyn ChatModel>> =
        LazyLock::new(|| Arc::new(ScriptedModel::new(Vec::new())));
    RunContext::new(thread, &INPUT, Arc::clone(&MODEL))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::agent::model::FinishReason;

    /// Records every hook call as `<name>.<hook>`; may fail every hook.
    struct Recorder {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
        fail: Option<FailurePolicy>,
    }

    impl Recorder {
        fn ok(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Arc<dyn Middleware> {
            Arc::new(Self {
                name,
                log: Arc::clone(log),
                fail: None,
            })
        }

        fn failing(
            name: &'static str,
            log: &Arc<Mutex<Vec<String>>>,
            policy: FailurePolicy,
        ) -> Arc<dyn Middleware> {
            Arc::new(Self {
                name,
                log: Arc::clone(log),
                fail: Some(policy),
            })
        }

        fn record(&self, hook: &str) -> Result<(), MiddlewareError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("{}.{hook}", self.name));
            match self.fail {
                Some(_) => Err(MiddlewareError(format!("{} broke", self.name))),
                None => Ok(()),
            }
        }
    }

    #[async_trait::async_trait]
    impl Middleware for Recorder {
        fn name(&self) -> &'static str {
            self.name
        }

        fn failure_policy(&self) -> FailurePolicy {
            self.fail.unwrap_or(FailurePolicy::FailOpen)
        }

        async fn before_run(&self, _cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
            self.record("before_run")
        }

        async fn before_model(
            &self,
            _cx: &mut RunContext<'_>,
            request: &mut ModelRequest,
        ) -> Result<(), MiddlewareError> {
            request
                .messages
                .push(crate::agent::message::ChatMessage::user(self.name));
            self.record("before_model")
        }

        async fn after_model(
            &self,
            _cx: &mut RunContext<'_>,
            response: &mut ModelResponse,
        ) -> Result<(), MiddlewareError> {
            response.content.push_str(self.name);
            response.content.push(' ');
            self.record("after_model")
        }

        async fn before_tool(
            &self,
            _cx: &mut RunContext<'_>,
            _call: &ToolCall,
            refused: Option<&ToolOutput>,
        ) -> Result<ToolDecision, MiddlewareError> {
            let hook = if refused.is_some() {
                "before_tool(refused)"
            } else {
                "before_tool"
            };
            self.record(hook).map(|()| ToolDecision::Run)
        }

        async fn after_tool(
            &self,
            _cx: &mut RunContext<'_>,
            _call: &ToolCall,
            _output: &mut ToolOutput,
        ) -> Result<(), MiddlewareError> {
            self.record("after_tool")
        }

        async fn after_run(&self, _cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
            self.record("after_run")
        }
    }

    /// A guard that refuses one tool by name.
    struct Refuser;

    #[async_trait::async_trait]
    impl Middleware for Refuser {
        fn name(&self) -> &'static str {
            "guardrail"
        }

        async fn before_tool(
            &self,
            _cx: &mut RunContext<'_>,
            call: &ToolCall,
            _refused: Option<&ToolOutput>,
        ) -> Result<ToolDecision, MiddlewareError> {
            Ok(if call.name == "forbidden" {
                ToolDecision::Skip(ToolOutput::error("not allowed"))
            } else {
                ToolDecision::Run
            })
        }
    }

    fn log() -> Arc<Mutex<Vec<String>>> {
        Arc::new(Mutex::new(Vec::new()))
    }

    fn thread() -> ThreadState {
        ThreadState::new("t".into(), "c".into(), 0, 0)
    }

    fn tool_call(name: &str) -> ToolCall {
        ToolCall {
            id: "1".into(),
            name: name.into(),
            arguments: "{}".into(),
        }
    }

    fn empty_response() -> ModelResponse {
        ModelResponse {
            content: String::new(),
            tool_calls: Vec::new(),
            usage: None,
            finish_reason: FinishReason::Stop,
            reasoning: None,
        }
    }

    #[test]
    fn chain_order_names_are_unique_and_have_reasons() {
        for (index, (name, reason)) in CHAIN_ORDER.iter().enumerate() {
            assert!(!reason.is_empty(), "{name} has no reason");
            assert_eq!(
                CHAIN_ORDER.iter().position(|(n, _)| n == name),
                Some(index),
                "{name} appears twice"
            );
        }
        assert_eq!(CHAIN_ORDER.last().map(|(n, _)| *n), Some("clarification"));
    }

    #[test]
    fn valid_order_is_accepted() {
        let log = log();
        let chain = MiddlewareChain::new(vec![
            Recorder::ok("dangling_tool_call", &log),
            Recorder::ok("token_usage", &log),
            Recorder::ok("title", &log),
            Recorder::ok("loop_detection", &log),
        ])
        .unwrap();
        assert_eq!(
            chain.names(),
            vec![
                "dangling_tool_call",
                "token_usage",
                "title",
                "loop_detection"
            ]
        );
        assert!(MiddlewareChain::new(Vec::new()).unwrap().names().is_empty());
    }

    #[test]
    fn reversed_order_is_rejected_with_the_reason() {
        let log = log();
        let err = MiddlewareChain::new(vec![
            Recorder::ok("title", &log),
            Recorder::ok("token_usage", &log),
        ])
        .unwrap_err();
        let ChainError::OutOfOrder {
            earlier,
            later,
            reason,
        } = &err
        else {
            panic!("expected OutOfOrder, got {err:?}");
        };
        assert_eq!(earlier, "token_usage");
        assert_eq!(later, "title");
        let expected = CHAIN_ORDER
            .iter()
            .find(|(n, _)| *n == "title")
            .map(|(_, why)| *why)
            .unwrap();
        assert_eq!(reason, expected);
        assert!(err.to_string().contains(expected), "{err}");
        assert!(
            err.to_string()
                .starts_with("middleware `title` must come after `token_usage`"),
            "{err}"
        );
    }

    #[test]
    fn unknown_and_duplicate_names_are_rejected() {
        let log = log();
        assert_eq!(
            MiddlewareChain::new(vec![
                Recorder::ok("title", &log),
                Recorder::ok("no_such_middleware", &log),
            ])
            .unwrap_err(),
            ChainError::Unknown("no_such_middleware".into())
        );
        assert_eq!(
            MiddlewareChain::new(vec![
                Recorder::ok("token_usage", &log),
                Recorder::ok("token_usage", &log),
            ])
            .unwrap_err(),
            ChainError::Duplicate("token_usage".into())
        );
    }

    #[tokio::test]
    async fn before_hooks_run_in_order_and_after_hooks_in_reverse() {
        let log = log();
        let chain = MiddlewareChain::new(vec![
            Recorder::ok("token_usage", &log),
            Recorder::ok("title", &log),
        ])
        .unwrap();
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        let mut request = ModelRequest {
            messages: Vec::new(),
            tools: Vec::new(),
        };
        let mut response = empty_response();
        let call = tool_call("shell");
        let mut output = ToolOutput::ok("out");

        chain.before_run(&mut cx).await.unwrap();
        chain.before_model(&mut cx, &mut request).await.unwrap();
        chain.after_model(&mut cx, &mut response).await.unwrap();
        assert_eq!(chain.before_tool(&mut cx, &call).await, ToolDecision::Run);
        chain.after_tool(&mut cx, &call, &mut output).await.unwrap();
        chain.after_run(&mut cx).await.unwrap();

        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "token_usage.before_run",
                "title.before_run",
                "token_usage.before_model",
                "title.before_model",
                "title.after_model",
                "token_usage.after_model",
                "token_usage.before_tool",
                "title.before_tool",
                "title.after_tool",
                "token_usage.after_tool",
                "title.after_run",
                "token_usage.after_run",
            ]
        );
        // The hooks' edits compose in the same order.
        assert_eq!(
            request.messages,
            vec![
                crate::agent::message::ChatMessage::user("token_usage"),
                crate::agent::message::ChatMessage::user("title"),
            ]
        );
        assert_eq!(response.content, "title token_usage ");
    }

    #[tokio::test]
    async fn fail_open_error_does_not_abort() {
        let log = log();
        let chain = MiddlewareChain::new(vec![
            Recorder::failing("token_usage", &log, FailurePolicy::FailOpen),
            Recorder::ok("title", &log),
        ])
        .unwrap();
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        let mut request = ModelRequest {
            messages: Vec::new(),
            tools: Vec::new(),
        };
        chain.before_model(&mut cx, &mut request).await.unwrap();
        chain
            .after_model(&mut cx, &mut empty_response())
            .await
            .unwrap();
        assert_eq!(
            chain.before_tool(&mut cx, &tool_call("shell")).await,
            ToolDecision::Run
        );
        chain.after_run(&mut cx).await.unwrap();
        // The later middleware still ran every time.
        let log = log.lock().unwrap();
        assert!(log.contains(&"title.before_model".to_owned()));
        assert!(log.contains(&"title.before_tool".to_owned()));
        assert!(log.contains(&"title.after_run".to_owned()));
    }

    #[tokio::test]
    async fn fail_closed_error_aborts_hooks() {
        let log = log();
        let chain = MiddlewareChain::new(vec![
            Recorder::failing("guardrail", &log, FailurePolicy::FailClosed),
            Recorder::ok("title", &log),
        ])
        .unwrap();
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        let mut request = ModelRequest {
            messages: Vec::new(),
            tools: Vec::new(),
        };
        let abort = chain.before_model(&mut cx, &mut request).await.unwrap_err();
        assert_eq!(abort.name, "guardrail");
        assert_eq!(abort.source.0, "guardrail broke");
        assert!(
            !log.lock()
                .unwrap()
                .contains(&"title.before_model".to_owned())
        );
    }

    #[tokio::test]
    async fn fail_closed_error_in_before_tool_skips_with_an_error_output() {
        let log = log();
        let chain = MiddlewareChain::new(vec![
            Recorder::failing("guardrail", &log, FailurePolicy::FailClosed),
            Recorder::ok("title", &log),
        ])
        .unwrap();
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        let decision = chain.before_tool(&mut cx, &tool_call("shell")).await;
        let ToolDecision::Skip(output) = decision else {
            panic!("expected Skip, got {decision:?}");
        };
        assert!(output.is_error);
        assert!(output.content.contains("`shell`"), "{}", output.content);
        assert!(output.content.contains("guardrail"), "{}", output.content);
        // Later middlewares still see the call, knowing it was refused, and cannot undo that.
        assert!(
            log.lock()
                .unwrap()
                .contains(&"title.before_tool(refused)".to_owned())
        );
    }

    #[tokio::test]
    async fn first_skip_wins_in_before_tool() {
        let log = log();
        let chain = MiddlewareChain::new(vec![
            Arc::new(Refuser) as Arc<dyn Middleware>,
            Recorder::ok("title", &log),
        ])
        .unwrap();
        let mut thread = thread();
        let mut cx = test_context(&mut thread);
        assert_eq!(
            chain.before_tool(&mut cx, &tool_call("forbidden")).await,
            ToolDecision::Skip(ToolOutput::error("not allowed"))
        );
        assert_eq!(*log.lock().unwrap(), vec!["title.before_tool(refused)"]);
        assert_eq!(
            chain.before_tool(&mut cx, &tool_call("fine")).await,
            ToolDecision::Run
        );
        assert_eq!(
            *log.lock().unwrap(),
            vec!["title.before_tool(refused)", "title.before_tool"]
        );
    }
}
