//! The run loop: one user message in, one outcome out.
//!
//! `before_run → loop { before_model → finalize → model → after_model → tool calls } →
//! after_run`. The thread is changed in place; the caller persists it.
//!
//! - **Finalization** runs after every `before_model` hook: it repairs tool-call pairing
//!   (whatever the hooks did to the history), leaves the oldest whole exchanges out when the
//!   request would exceed `model.context_tokens`, and takes the tools away from the last model
//!   call a run may make, so a run ends with an answer rather than with a dangling call.
//! - **Tools** of one response run concurrently, at most `max_parallel_tools` at a time, each
//!   in its own task with its time limit; results are appended in call order, and the thread
//!   is checkpointed after each one. A call's limit ends at the turn's deadline too, except for
//!   a call that starts lasting work (a subagent task: `Tool::checkpoint_first`): it gets its
//!   whole limit (`Tool::call_limit`: a task's type decides), and the turn's deadline moves
//!   to after it, with [`ANSWER_TIME`] to answer. A checkpoint that fails fails the run:
//!   going on would risk running the same tools twice after a crash.
//! - **Control**: hooks may send the model back (`Continue`, capped per run), end the run
//!   with a question (`Interrupt`; the user's next message answers it) or `Stop` it. A call
//!   a hook holds for a person (`ToolDecision::Hold`) gets no result: the round's other calls
//!   run, the thread is checkpointed and the run stops (`awaiting_approval`); a later
//!   `resume` runs the held call first, as it does the calls a crash left unanswered.
//! - **Endings**: the run ends answered, interrupted, stopped, failed or timed out, and
//!   `after_run` hooks see every ending. The answer is all the text the user was shown,
//!   across rounds, not only the last round's.
//! - **Context**: every run is told the current date and time (`agent.timezone`), fixed when
//!   it starts, as the first block of its hidden context (see `finalize`), so every request
//!   of a run sends the same bytes and the cacheable prefix stays the same across runs.
//! - **Answers that are not**: a final response with no text and no tool calls is sent back
//!   once with a reminder, then ends with a note; the tool calls of a response the
//!   provider's content filter stopped are not run. A run with a token budget (a subagent
//!   task's) that used it up ends before its next round (`token_budget`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::input::{RunInput, ThreadFolders};
use super::message::{ChatMessage, TokenUsage, ToolCall};
use super::middleware::approval::AWAITING_APPROVAL;
use super::middleware::dangling_tool_call;
use super::middleware::{
    ChainAbort, MiddlewareChain, RunContext, RunControl, RunEnding, RunOutputs, ToolDecision,
};
use super::model::{ChatModel, FinishReason, ModelError, ModelRequest, ModelResponse};
use super::thread::{PendingQuestion, ThreadState};
use super::tools::{ToolContext, ToolOutput, ToolRegistry};
use crate::live::Live;

/// How often hooks may send the model back (`Continue`) in one run.
pub(crate) const MAX_CONTINUES: u32 = 3;

/// How the answer of a run that hit its model-call cap without one begins.
pub(crate) const NO_ANSWER_PREFIX: &str = "I stopped after";

/// How long `after_run` hooks may take after the run itself ended.
const AFTER_RUN_LIMIT: Duration = Duration::from_secs(30);

/// What a turn keeps after a lasting tool call's limit (a subagent task's) for the model to
/// answer from its result.
pub(crate) const ANSWER_TIME: Duration = Duration::from_secs(120);

/// The stop reason of a run that used up its token budget.
pub(crate) const TOKEN_BUDGET: &str = "token_budget";

/// The stop reason of a run whose model gave no answer, even when reminded.
pub(crate) const EMPTY_ANSWER: &str = "empty_answer";

/// The reminder that sends a model back once after an empty final response.
const EMPTY_ANSWER_REMINDER: &str = "<system-reminder>\nYour last response had no text and \
no tool calls, so the user saw nothing. Write your final answer to the user now.\n\
</system-reminder>";

/// What the user is told when the model gave no answer twice.
const EMPTY_ANSWER_NOTE: &str = "⚠️ The model finished without writing an answer. Send your \
message again, perhaps worded differently.";

/// Something a tool did, for channels that show it ("running `bash`…").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolProgress {
    /// A tool call started.
    Started {
        /// The call's id.
        call_id: String,
        /// The tool's name.
        name: String,
    },
    /// A running tool reported progress.
    Note {
        /// The call's id.
        call_id: String,
        /// The tool's name.
        name: String,
        /// What it said.
        text: String,
    },
    /// A tool call ended.
    Finished {
        /// The call's id.
        call_id: String,
        /// The tool's name.
        name: String,
        /// Whether its result is an error.
        is_error: bool,
    },
}

/// A checkpoint that could not be saved.
#[derive(Debug, Clone, thiserror::Error)]
#[error("could not save the thread: {0}")]
pub(crate) struct CheckpointError(pub(crate) String);

/// What the runtime tells its caller while a run is going on.
#[async_trait::async_trait]
pub(crate) trait RunObserver: Send + Sync {
    /// A fragment of streamed answer text (never reasoning).
    fn delta(&self, text: &str);

    /// A tool started, reported progress or ended.
    fn progress(&self, _event: &ToolProgress) {}

    /// The thread after a tool result; it must be saved before the run goes on (the
    /// observer records what it saved in `thread.saved_messages`).
    async fn checkpoint(&self, thread: &mut ThreadState) -> Result<(), CheckpointError>;
}

/// An observer that ignores everything.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Unobserved;

#[cfg(test)]
#[async_trait::async_trait]
impl RunObserver for Unobserved {
    fn delta(&self, _text: &str) {}

    async fn checkpoint(&self, _thread: &mut ThreadState) -> Result<(), CheckpointError> {
        Ok(())
    }
}

/// The bounds of one run: its time, and a token that stops it (`/stop`).
#[derive(Debug, Clone)]
pub(crate) struct RunLimits {
    /// How long the run may take, tool calls included (`after_run` hooks get a little more).
    pub(crate) timeout: Duration,
    /// Cancelled when the user stops the run.
    pub(crate) cancel: CancellationToken,
}

/// How a run ended.
#[derive(Debug)]
pub(crate) struct RunOutcome {
    /// Answered, interrupted, stopped, failed or timed out.
    pub(crate) ending: RunEnding,
    /// The text for the user: everything they were shown, plus the question, the notice of
    /// a stop, or what went wrong.
    pub(crate) answer: String,
    /// The failure, when the run failed.
    pub(crate) error: Option<RunError>,
    /// Model calls made.
    pub(crate) model_calls: u32,
    /// Why the run stopped early (`loop_capped`, `iteration_limit`, `stopped_by_user`).
    pub(crate) stop_reason: Option<String>,
    /// Tokens the run used, helper calls included.
    pub(crate) usage: TokenUsage,
    /// Side outputs for the caller to persist with the turn.
    pub(crate) outputs: RunOutputs,
}

impl RunOutcome {
    /// Whether the run's messages belong out of the model's context (failed or timed out).
    pub(crate) fn failed(&self) -> bool {
        matches!(self.ending, RunEnding::Failed | RunEnding::TimedOut)
    }
}

/// Why a run failed. Tool failures are not here: they are results for the model.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Middleware(#[from] ChainAbort),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl RunError {
    /// Whether sending the same message again may succeed.
    pub(crate) fn retry_can_help(&self) -> bool {
        match self {
            Self::Model(e) => e.retry_can_help(),
            Self::Middleware(_) => false,
            Self::Checkpoint(_) => true,
        }
    }

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
            Self::Checkpoint(_) => "⚠️ Sorry, antler could not save this conversation's \
                progress, so it stopped rather than risk repeating work. Send your message \
                again in a moment."
                .to_owned(),
        }
    }
}

/// How the runtime is set up.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeSettings {
    /// The system prompt, first in every request; a run keeps the one it started with.
    pub(crate) system_prompt: Arc<Live<str>>,
    /// Model calls per run; the last one is made without tools.
    pub(crate) max_model_calls: u32,
    /// Tool calls of one response that run at once.
    pub(crate) max_parallel_tools: usize,
    /// The most tokens a request may hold (estimated); 0 for no bound.
    pub(crate) context_tokens: usize,
    /// Where threads keep their folders (the store's directory).
    pub(crate) data_root: PathBuf,
    /// The time zone of the current time each run is told (`agent.timezone`).
    pub(crate) timezone: jiff::tz::TimeZone,
    /// Tokens one run may use, model and helper calls (a subagent task's budget); `None`
    /// for no budget.
    pub(crate) token_budget: Option<u64>,
}

/// The agent: a model, tools, a middleware chain and its settings.
#[derive(Clone)]
pub(crate) struct Runtime {
    model: Arc<dyn ChatModel>,
    tools: ToolRegistry,
    chain: MiddlewareChain,
    settings: Arc<RuntimeSettings>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("model", &self.model.name())
            .field("tools", &self.tools)
            .field("chain", &self.chain)
            .field("max_model_calls", &self.settings.max_model_calls)
            .finish_non_exhaustive()
    }
}

/// How the loop itself ended (before `after_run`).
enum Finish {
    Answered,
    Interrupted(PendingQuestion),
    Stopped(String),
}

/// The run was cut short from outside.
enum CutShort {
    Cancelled,
    TimedOut,
}

impl Runtime {
    /// A runtime whose registry also holds the tools the middlewares contribute.
    pub(crate) fn new(
        model: Arc<dyn ChatModel>,
        mut tools: ToolRegistry,
        chain: MiddlewareChain,
        mut settings: RuntimeSettings,
    ) -> Self {
        for tool in chain.tools() {
            let name = tool.spec().name;
            if tools.contains(&name) {
                tracing::warn!(tool = %name, "a middleware's tool replaces a built-in tool of the same name");
            }
            tools.register(tool);
        }
        settings.max_model_calls = settings.max_model_calls.max(1);
        settings.max_parallel_tools = settings.max_parallel_tools.max(1);
        Self {
            model,
            tools,
            chain,
            settings: Arc::new(settings),
        }
    }

    /// Offers the model only the tools `keep` accepts (a subagent's share of the lead's).
    #[must_use]
    pub(crate) fn with_tools_only(mut self, keep: impl Fn(&str) -> bool) -> Self {
        self.tools.retain(keep);
        self
    }

    /// The names of the tools offered to the model.
    #[cfg(test)]
    pub(crate) fn tool_names(&self) -> Vec<String> {
        self.tools
            .specs()
            .iter()
            .map(|spec| spec.name.clone())
            .collect()
    }

    /// The model's name.
    pub(crate) fn model_name(&self) -> &str {
        self.model.name()
    }

    /// The middleware names in chain order.
    pub(crate) fn middleware_names(&self) -> Vec<&'static str> {
        self.chain.names()
    }

    /// The folders of thread `thread_id`.
    pub(crate) fn folders(
        &self,
        thread_id: &str,
    ) -> Result<ThreadFolders, super::input::UnsafeThreadId> {
        ThreadFolders::new(&self.settings.data_root, thread_id)
    }

    /// Runs one turn for `input` on `thread`. When the thread holds a question from the last
    /// run, the message answers it (a number picks one of its options).
    pub(crate) async fn run(
        &self,
        thread: &mut ThreadState,
        input: &RunInput,
        observer: &dyn RunObserver,
        limits: &RunLimits,
    ) -> RunOutcome {
        let answering = thread.pending_question.take();
        let text = answering
            .as_ref()
            .map_or_else(|| input.text.clone(), |q| q.answer(&input.text));
        thread.messages.push(ChatMessage::user(text));
        self.drive_to_end(thread, input, answering, observer, limits)
            .await
    }

    /// Continues a turn whose user message (and maybe some tool results) is already at the
    /// end of `thread`: the re-run of a turn interrupted after a checkpoint. Tool calls of the
    /// last round that have no result yet run first.
    pub(crate) async fn resume(
        &self,
        thread: &mut ThreadState,
        input: &RunInput,
        observer: &dyn RunObserver,
        limits: &RunLimits,
    ) -> RunOutcome {
        self.drive_to_end(thread, input, None, observer, limits)
            .await
    }

    async fn drive_to_end(
        &self,
        thread: &mut ThreadState,
        input: &RunInput,
        answering: Option<PendingQuestion>,
        observer: &dyn RunObserver,
        limits: &RunLimits,
    ) -> RunOutcome {
        let mut cx = RunContext::new(thread, input, Arc::clone(&self.model));
        cx.answering = answering;
        cx.folders = ThreadFolders::new(&self.settings.data_root, &cx.thread.id).ok();
        // First, before any hook's block: fixed for the run, so its requests stay identical.
        cx.hidden_context.push(current_time(
            jiff::Timestamp::now(),
            &self.settings.timezone,
        ));
        let shown = Shown::default();
        let started = Instant::now();
        let deadline = TurnDeadline::new(started + limits.timeout);
        tracing::debug!(thread = %cx.thread.id, user = %cx.user_id, "run starts");
        let result = tokio::select! {
            biased;
            () = limits.cancel.cancelled() => Err(CutShort::Cancelled),
            () = deadline.passed() => Err(CutShort::TimedOut),
            result = self.drive(&mut cx, observer, &shown, &limits.cancel, &deadline) => Ok(result),
        };
        let (ending, mut answer, mut error) = match result {
            Ok(Ok(Finish::Answered)) => (RunEnding::Answered, shown.completed(), None),
            Ok(Ok(Finish::Interrupted(question))) => {
                let text = join(shown.completed(), &question.render());
                cx.thread.pending_question = Some(question);
                (RunEnding::Interrupted, text, None)
            }
            Ok(Ok(Finish::Stopped(reason))) => {
                cx.stop_reason.get_or_insert(reason);
                (RunEnding::Stopped, shown.completed(), None)
            }
            Ok(Err(e)) => {
                // A stream that broke off repeats what it showed in its own message.
                let text = match &e {
                    RunError::Model(model) if model.shown_text().is_some() => shown.completed(),
                    _ => shown.everything(),
                };
                (RunEnding::Failed, join(text, &e.user_message()), Some(e))
            }
            Err(CutShort::Cancelled) => {
                cx.stop_reason = Some("stopped_by_user".to_owned());
                let text = shown.everything();
                // The user saw it and may say "go on": it stays in the context.
                cx.thread
                    .messages
                    .push(ChatMessage::assistant(join(text.clone(), "[stopped]")));
                let notice = if text.trim().is_empty() {
                    "⏹ Stopped before an answer was written."
                } else {
                    "⏹ Stopped."
                };
                (RunEnding::Stopped, join(text, notice), None)
            }
            Err(CutShort::TimedOut) => {
                // The configured time, or more when lasting work made the turn grow.
                let allowed = deadline.get().saturating_duration_since(started);
                tracing::warn!(thread = %cx.thread.id, timeout = ?allowed, "run timed out");
                let notice = format!(
                    "⚠️ Sorry, this took longer than {} seconds and was stopped. Send it again \
                     to retry, perhaps asking for less at once.",
                    allowed.as_secs()
                );
                (RunEnding::TimedOut, join(shown.everything(), &notice), None)
            }
        };
        let mut ending = ending;
        cx.ending = Some(ending);
        // after_run hooks see every run, also failed ones (usage, memory, cleanup).
        match tokio::time::timeout(AFTER_RUN_LIMIT, self.chain.after_run(&mut cx)).await {
            Ok(Ok(())) => {}
            Ok(Err(abort)) => {
                if error.is_none() {
                    let e = RunError::from(abort);
                    answer = e.user_message();
                    ending = RunEnding::Failed;
                    error = Some(e);
                }
            }
            Err(_) => tracing::warn!(thread = %cx.thread.id, "after_run hooks ran out of time"),
        }
        if !matches!(ending, RunEnding::Failed | RunEnding::TimedOut) {
            cx.thread.turns += 1;
        }
        metrics::counter!("antler_runs_total", "ending" => ending.as_str()).increment(1);
        RunOutcome {
            ending,
            answer,
            error,
            model_calls: cx.model_calls,
            stop_reason: cx.stop_reason.take(),
            usage: cx.run_usage,
            outputs: std::mem::take(&mut cx.outputs),
        }
    }

    async fn drive(
        &self,
        cx: &mut RunContext<'_>,
        observer: &dyn RunObserver,
        shown: &Shown,
        cancel: &CancellationToken,
        deadline: &TurnDeadline,
    ) -> Result<Finish, RunError> {
        self.chain.before_run(cx).await?;
        let mut continues = 0;
        let mut nudged = false;
        // The model's own count, so the budget holds also without the token_usage middleware.
        let mut model_tokens = 0_u64;
        let system_prompt = self.settings.system_prompt.current();
        let unanswered = unanswered_calls(&cx.thread.messages);
        if !unanswered.is_empty() {
            tracing::info!(thread = %cx.thread.id, calls = unanswered.len(), "running the tool calls left unanswered");
            if self
                .run_tools(cx, &unanswered, observer, cancel, deadline)
                .await?
            {
                observer.checkpoint(cx.thread).await?;
                return Ok(Finish::Stopped(AWAITING_APPROVAL.to_owned()));
            }
        }
        // The tools this run is offered are known (the shell's probe may still run at start).
        self.tools.settle(&cx.input.author).await;
        loop {
            let last_call = cx.model_calls + 1 >= self.settings.max_model_calls;
            let mut request = ModelRequest {
                // Failed turns stay in the thread for people, not for the model.
                messages: std::iter::once(ChatMessage::system(&*system_prompt))
                    .chain(cx.thread.context().cloned())
                    .collect(),
                tools: self.tools.specs_for(&cx.input.author),
            };
            self.chain.before_model(cx, &mut request).await?;
            self.finalize(cx, &mut request, last_call);

            shown.begin_round();
            let sink = |text: &str| shown.stream(text, observer);
            let mut response = self.call_model(cx, &request, &sink).await?;
            cx.model_calls += 1;
            model_tokens += response.usage.map_or(0, |u| u.total_tokens);
            self.chain.after_model(cx, &mut response).await?;

            if response.finish_reason == FinishReason::ContentFilter
                && !response.tool_calls.is_empty()
            {
                // What the filter stopped is not a decision to act on.
                tracing::warn!(
                    thread = %cx.thread.id,
                    calls = response.tool_calls.len(),
                    "the provider's content filter stopped a response; its tool calls are not run"
                );
                metrics::counter!("antler_model_content_filtered_total").increment(1);
                response.tool_calls.clear();
            }
            if let Some(budget) = self.settings.token_budget {
                let used = model_tokens.max(cx.run_usage.total_tokens);
                if used >= budget && !response.tool_calls.is_empty() {
                    tracing::info!(thread = %cx.thread.id, used, budget, "the run used up its token budget");
                    cx.stop(TOKEN_BUDGET);
                }
            }

            let control = cx.take_control();
            let ends_here = matches!(
                control,
                Some(RunControl::Stop { .. } | RunControl::Interrupt { .. })
            );
            if (last_call || ends_here) && !response.tool_calls.is_empty() {
                // No round may follow: keep the text, drop calls that would need one.
                response.tool_calls.clear();
                if !ends_here {
                    cx.stop_reason
                        .get_or_insert_with(|| "iteration_limit".to_owned());
                    if response.content.trim().is_empty() {
                        response.content = format!(
                            "{NO_ANSWER_PREFIX} {} steps without reaching a final answer.",
                            cx.model_calls
                        );
                    }
                }
            }
            let calls = std::mem::take(&mut response.tool_calls);
            if calls.is_empty()
                && control.is_none()
                && response.content.trim().is_empty()
                && response.finish_reason != FinishReason::ContentFilter
            {
                if !nudged && !last_call {
                    // Nothing to show and nothing to run: one more try, reminded.
                    nudged = true;
                    tracing::info!(thread = %cx.thread.id, "an empty final response; the model is reminded once");
                    metrics::counter!("antler_empty_answers_total", "action" => "retry")
                        .increment(1);
                    cx.thread
                        .messages
                        .push(ChatMessage::user(EMPTY_ANSWER_REMINDER));
                    continue;
                }
                tracing::warn!(thread = %cx.thread.id, "the model gave no answer");
                metrics::counter!("antler_empty_answers_total", "action" => "reported")
                    .increment(1);
                cx.stop_reason
                    .get_or_insert_with(|| EMPTY_ANSWER.to_owned());
                response.content = EMPTY_ANSWER_NOTE.to_owned();
            }
            let note = if calls.is_empty() {
                finish_note(&response.finish_reason)
            } else {
                None
            };
            shown.end_round(&response.content, note);
            let ModelResponse {
                content, reasoning, ..
            } = response;
            cx.thread.messages.push(ChatMessage::Assistant {
                content,
                tool_calls: calls.clone(),
                reasoning,
            });

            let mut added = Vec::new();
            match control {
                Some(RunControl::Stop { reason }) => return Ok(Finish::Stopped(reason)),
                Some(RunControl::Interrupt { question, options }) => {
                    return Ok(Finish::Interrupted(PendingQuestion { question, options }));
                }
                Some(RunControl::Continue(messages)) => added = messages,
                None => {}
            }
            if !calls.is_empty() {
                if self
                    .run_tools(cx, &calls, observer, cancel, deadline)
                    .await?
                {
                    // The held call stays unanswered in the saved thread; a decision resumes it.
                    observer.checkpoint(cx.thread).await?;
                    return Ok(Finish::Stopped(AWAITING_APPROVAL.to_owned()));
                }
                match cx.take_control() {
                    Some(RunControl::Stop { reason }) => return Ok(Finish::Stopped(reason)),
                    Some(RunControl::Interrupt { question, options }) => {
                        return Ok(Finish::Interrupted(PendingQuestion { question, options }));
                    }
                    Some(RunControl::Continue(messages)) => added.extend(messages),
                    None => {}
                }
            }
            if !added.is_empty() {
                // Sent back only within both caps: the run's continues and its model calls.
                if continues < MAX_CONTINUES && cx.model_calls < self.settings.max_model_calls {
                    continues += 1;
                    cx.thread.messages.extend(added);
                    continue;
                }
                tracing::info!(thread = %cx.thread.id, cap = MAX_CONTINUES, "a hook asked to continue past the cap; the run ends");
                metrics::counter!("antler_run_continues_capped_total").increment(1);
            }
            if calls.is_empty() {
                return Ok(Finish::Answered);
            }
        }
    }

    /// One model call in its `model_call` span: the model, the tokens, the latency and the
    /// retries (recorded by the client) are its attributes; never the text.
    async fn call_model(
        &self,
        cx: &RunContext<'_>,
        request: &ModelRequest,
        sink: super::model::DeltaSink<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let span = tracing::info_span!(
            "model_call",
            model = %self.model.name(),
            call = cx.model_calls + 1,
            prompt_tokens = tracing::field::Empty,
            completion_tokens = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
            retries = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let began = Instant::now();
        let result = self
            .model
            .complete(request, Some(sink))
            .instrument(span.clone())
            .await;
        span.record(
            "latency_ms",
            u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
        );
        match &result {
            Ok(response) => {
                if let Some(usage) = response.usage {
                    span.record("prompt_tokens", usage.prompt_tokens);
                    span.record("completion_tokens", usage.completion_tokens);
                }
                span.record("outcome", "ok");
            }
            Err(_) => {
                span.record("outcome", "error");
            }
        }
        result
    }

    /// Makes the request valid whatever the hooks did: tool-call pairing repaired, the
    /// oldest whole exchanges left out when it is too long, no tools on the last call; then
    /// the run's hidden context goes in just before the turn's user message. There, after
    /// the stored history, it leaves the request's prefix (system prompt and history) the
    /// same from run to run and user to user, so providers' prompt caches keep hitting.
    fn finalize(&self, cx: &RunContext<'_>, request: &mut ModelRequest, last_call: bool) {
        dangling_tool_call::repair(&mut request.messages);
        if last_call {
            request.tools.clear();
        }
        let hidden = cx.hidden_context_message();
        if self.settings.context_tokens > 0 {
            let budget = self
                .settings
                .context_tokens
                .saturating_sub(hidden.as_ref().map_or(0, estimate_tokens));
            let dropped = fit_context(request, budget);
            if dropped > 0 {
                tracing::debug!(
                    thread = %cx.thread.id,
                    messages = dropped,
                    "left the oldest exchanges out of the request"
                );
                metrics::counter!("antler_context_trimmed_messages_total")
                    .increment(dropped as u64);
            }
        }
        if let Some(hidden) = hidden {
            let at = cx
                .turn_position(request)
                .or_else(|| {
                    request
                        .messages
                        .iter()
                        .rposition(|m| matches!(m, ChatMessage::User { .. }))
                })
                .unwrap_or_else(|| {
                    request
                        .messages
                        .iter()
                        .take_while(|m| matches!(m, ChatMessage::System { .. }))
                        .count()
                });
            request.messages.insert(at, hidden);
        }
    }

    /// Runs one response's tool calls: hooks first (in order, one at a time), then the
    /// approved calls concurrently, bounded; results go into the thread in call order, each
    /// checkpointed. Returns whether a call was held for a person (it has no result).
    async fn run_tools(
        &self,
        cx: &mut RunContext<'_>,
        calls: &[ToolCall],
        observer: &dyn RunObserver,
        cancel: &CancellationToken,
        deadline: &TurnDeadline,
    ) -> Result<bool, RunError> {
        let mut slots: Vec<Option<ToolOutput>> = Vec::with_capacity(calls.len());
        // Calls that wait for a person: no result now; the run ends after this round.
        let mut held = vec![false; calls.len()];
        let mut approved = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let ended = matches!(
                cx.control(),
                Some(RunControl::Stop { .. } | RunControl::Interrupt { .. })
            );
            let decision = if ended {
                ToolDecision::Skip(ToolOutput::error(
                    "Not run: the run ended before this call.",
                ))
            } else {
                self.chain.before_tool(cx, call).await
            };
            match decision {
                ToolDecision::Run => {
                    slots.push(None);
                    approved.push(index);
                }
                ToolDecision::Skip(output) => slots.push(Some(output)),
                ToolDecision::Hold => {
                    slots.push(None);
                    if let Some(flag) = held.get_mut(index) {
                        *flag = true;
                    }
                }
            }
        }
        let holding = held.contains(&true);

        // Calls that start long work (a subagent task) are saved before they run, so a turn
        // re-run after a crash runs the same calls (with the same ids, which find the work
        // they started) instead of asking the model again.
        let lasting = approved.iter().any(|&index| {
            calls
                .get(index)
                .is_some_and(|call| self.tools.checkpoint_first(&call.name))
        });
        if lasting {
            observer.checkpoint(cx.thread).await?;
        }
        let folders = ThreadFolders::new(&self.settings.data_root, &cx.thread.id)
            .map_err(|e| CheckpointError(e.to_string()))?;
        if !approved.is_empty() {
            if let Err(e) = folders.create().await {
                // The tools that need them will say so; the others can still run.
                tracing::warn!(thread = %cx.thread.id, error = %e, "cannot create the thread's folders");
            }
        }
        let calls_cancel = cancel.child_token();
        // Tools still running when the run ends (an error, a timeout) are told to stop.
        let _stop_calls = calls_cancel.clone().drop_guard();
        let permits = Arc::new(Semaphore::new(self.settings.max_parallel_tools));
        let (events, mut progress) = mpsc::unbounded_channel::<ToolProgress>();
        let mut running = JoinSet::new();
        let mut index_of = HashMap::new();
        for index in approved {
            let Some(call) = calls.get(index).cloned() else {
                continue;
            };
            let registry = self.tools.clone();
            let permits = Arc::clone(&permits);
            let events = events.clone();
            let notes = events.clone();
            let (call_id, name) = (call.id.clone(), call.name.clone());
            let turn = deadline.clone();
            let lasting = self.tools.checkpoint_first(&call.name);
            let base = ToolContext {
                thread_id: cx.thread.id.clone(),
                call_id: call.id.clone(),
                author: cx.input.author.clone(),
                folders: folders.clone(),
                deadline: deadline.get(),
                cancel: calls_cancel.clone(),
                progress: Arc::new(move |text: &str| {
                    let _ = notes.send(ToolProgress::Note {
                        call_id: call_id.clone(),
                        name: name.clone(),
                        text: text.to_owned(),
                    });
                }),
                turn: cx.thread.running.map_or(0, |r| r.inbox_seq),
                trace_id: cx.input.trace_id.clone(),
                skills: cx.skills.clone(),
            };
            let handle = running.spawn(
                async move {
                    // The semaphore is never closed; a failed acquire just runs unbounded.
                    let _permit = permits.acquire_owned().await;
                    let _ = events.send(ToolProgress::Started {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                    });
                    let limit = Instant::now() + registry.call_timeout(&call);
                    let deadline = if lasting {
                        // Lasting work (a subagent task) gets its whole limit: the turn grows
                        // to fit it and the model's answer after it.
                        turn.extend_to(limit + ANSWER_TIME);
                        limit
                    } else {
                        turn.get().min(limit)
                    };
                    let cx = ToolContext { deadline, ..base };
                    let span = tracing::info_span!(
                        "tool_call",
                        tool = %call.name,
                        outcome = tracing::field::Empty,
                    );
                    let output = registry.call(&call, &cx).instrument(span.clone()).await;
                    span.record("outcome", if output.is_error { "error" } else { "ok" });
                    output
                }
                .in_current_span(),
            );
            index_of.insert(handle.id(), index);
        }
        drop(events);

        let mut next = 0;
        loop {
            while next < calls.len() {
                if held.get(next).copied().unwrap_or(false) {
                    next += 1;
                    continue;
                }
                let Some(output) = slots.get_mut(next).and_then(Option::take) else {
                    break;
                };
                let Some(call) = calls.get(next) else { break };
                self.record_result(cx, call, output, observer).await?;
                next += 1;
            }
            if next >= calls.len() {
                return Ok(holding);
            }
            tokio::select! {
                biased;
                Some(event) = progress.recv() => observer.progress(&event),
                joined = running.join_next_with_id() => {
                    // What the call reported before it ended comes first.
                    while let Ok(event) = progress.try_recv() {
                        observer.progress(&event);
                    }
                    let (id, output) = match joined {
                        Some(Ok((id, output))) => (id, output),
                        Some(Err(e)) => {
                            tracing::error!(error = %e, "a tool call panicked or was aborted");
                            (e.id(), ToolOutput::error("Error: the tool crashed."))
                        }
                        // Unreachable while a slot is empty; end rather than spin.
                        None => return Ok(holding),
                    };
                    if let Some(&index) = index_of.get(&id) {
                        if let Some(call) = calls.get(index) {
                            observer.progress(&ToolProgress::Finished {
                                call_id: call.id.clone(),
                                name: call.name.clone(),
                                is_error: output.is_error,
                            });
                        }
                        if let Some(slot) = slots.get_mut(index) {
                            *slot = Some(output);
                        }
                    }
                }
            }
        }
    }

    /// After-tool hooks, then the result into the thread, then a checkpoint.
    async fn record_result(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        mut output: ToolOutput,
        observer: &dyn RunObserver,
    ) -> Result<(), RunError> {
        self.chain.after_tool(cx, call, &mut output).await?;
        if output.is_error {
            tracing::debug!(tool = %call.name, "tool call answered with an error");
        }
        cx.thread
            .messages
            .push(ChatMessage::tool(call.id.clone(), output.content));
        observer.checkpoint(cx.thread).await?;
        Ok(())
    }
}

/// The calls of the current turn's last assistant message that have no result after it. Only
/// messages after the turn's user message count: an earlier turn's calls are never run again.
fn unanswered_calls(messages: &[ChatMessage]) -> Vec<ToolCall> {
    unanswered_calls_at(messages)
        .map(|(_, calls)| calls.into_iter().cloned().collect())
        .unwrap_or_default()
}

/// [`unanswered_calls`], by reference, with the index of the message holding them (`None`
/// when it has none).
pub(crate) fn unanswered_calls_at(messages: &[ChatMessage]) -> Option<(usize, Vec<&ToolCall>)> {
    let position = messages
        .iter()
        .rposition(|m| matches!(m, ChatMessage::Assistant { .. } | ChatMessage::User { .. }))?;
    let Some(ChatMessage::Assistant { tool_calls, .. }) = messages.get(position) else {
        return None;
    };
    let answered: Vec<&str> = messages
        .get(position + 1..)
        .unwrap_or_default()
        .iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    let unanswered = tool_calls
        .iter()
        .filter(|call| !answered.contains(&call.id.as_str()))
        .collect();
    Some((position, unanswered))
}

/// What the user is told about an answer the model did not finish.
fn finish_note(reason: &FinishReason) -> Option<&'static str> {
    match reason {
        FinishReason::Length => {
            Some("_(The answer was cut off: the model reached its output limit.)_")
        }
        FinishReason::ContentFilter => {
            Some("_(The model provider's content filter withheld the rest of this answer.)_")
        }
        _ => None,
    }
}

/// When a turn must end: its timeout from the start, moved later while a lasting tool call
/// (a subagent task) needs more. Shared by the run loop and the calls it runs.
#[derive(Debug, Clone)]
struct TurnDeadline(Arc<Mutex<Instant>>);

impl TurnDeadline {
    fn new(at: Instant) -> Self {
        Self(Arc::new(Mutex::new(at)))
    }

    fn get(&self) -> Instant {
        // A poisoned lock still holds a valid instant.
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Moves the deadline to `at` if that is later; never earlier.
    fn extend_to(&self, at: Instant) {
        let mut current = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if at > *current {
            tracing::info!(
                by_secs = at.saturating_duration_since(*current).as_secs(),
                "the turn's time grows to fit a lasting tool call"
            );
            *current = at;
        }
    }

    /// Resolves once the deadline, as it stands then, has passed.
    async fn passed(&self) {
        loop {
            let at = self.get();
            tokio::time::sleep_until(at).await;
            if self.get() <= Instant::now() {
                return;
            }
        }
    }
}

/// The `<current_time>` block of a run that starts at `now`, in `zone`:
/// `Friday, 2026-12-04 21:05 (Europe/Berlin, UTC+01:00)`.
pub(crate) fn current_time(now: jiff::Timestamp, zone: &jiff::tz::TimeZone) -> String {
    let local = now.to_zoned(zone.clone());
    let name = zone.iana_name().unwrap_or("UTC");
    format!(
        "<current_time>{} ({name}, UTC{})</current_time>",
        local.strftime("%A, %Y-%m-%d %H:%M"),
        local.strftime("%:z")
    )
}

/// `first` and `second` as paragraphs, either may be empty.
fn join(mut first: String, second: &str) -> String {
    if second.trim().is_empty() {
        return first;
    }
    if !first.trim().is_empty() {
        first.push_str("\n\n");
    } else {
        first.clear();
    }
    first.push_str(second);
    first
}

/// A rough token count: about four characters a token, plus a little per message. Good
/// enough to stay under a context bound with margin; the provider has the last word.
fn estimate_tokens(message: &ChatMessage) -> usize {
    // A low-detail image costs a fixed ~85 tokens.
    message.payload_bytes(340) / 4 + 4
}

/// The length of `value` written as compact JSON, escapes aside, found without writing it:
/// on every model call for every tool, writing the schemas out cost more than the rest of
/// the estimate.
fn json_len(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    let separators = |n: usize| n.saturating_sub(1);
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => s.len() + 2,
        Value::Array(items) => {
            2 + separators(items.len()) + items.iter().map(json_len).sum::<usize>()
        }
        Value::Object(map) => {
            2 + separators(map.len())
                + map
                    .iter()
                    .map(|(k, v)| k.len() + 3 + json_len(v))
                    .sum::<usize>()
        }
    }
}

/// Leaves the oldest whole exchanges (a user message and everything up to the next one) out
/// of `request` until it fits `budget` tokens; system messages and the last exchange always
/// stay. Returns how many messages were left out.
fn fit_context(request: &mut ModelRequest, budget: usize) -> usize {
    let tools: usize = request
        .tools
        .iter()
        .map(|t| (t.name.len() + t.description.len() + json_len(&t.parameters)) / 4)
        .sum();
    let mut total: usize = tools + request.messages.iter().map(estimate_tokens).sum::<usize>();
    let mut dropped = 0;
    while total > budget {
        // The first exchange: from the first non-system message to the next user message.
        let Some(start) = request
            .messages
            .iter()
            .position(|m| !matches!(m, ChatMessage::System { .. }))
        else {
            break;
        };
        let Some(end) = request
            .messages
            .iter()
            .enumerate()
            .skip(start + 1)
            .find(|(_, m)| matches!(m, ChatMessage::User { .. }))
            .map(|(i, _)| i)
        else {
            break; // only the last exchange is left
        };
        let removed: Vec<ChatMessage> = request.messages.drain(start..end).collect();
        total -= removed.iter().map(estimate_tokens).sum::<usize>();
        dropped += removed.len();
    }
    // What is left starts at a user message, so no tool result lost its call.
    dropped
}

/// The text shown to the user so far: finished rounds, and the round being streamed.
#[derive(Debug, Default)]
struct Shown {
    text: Mutex<ShownText>,
}

#[derive(Debug, Default)]
struct ShownText {
    completed: String,
    partial: String,
}

impl Shown {
    fn begin_round(&self) {
        if let Ok(mut text) = self.text.lock() {
            text.partial.clear();
        }
    }

    /// Passes a fragment on, separated from earlier rounds' text by a blank line.
    fn stream(&self, fragment: &str, observer: &dyn RunObserver) {
        if fragment.is_empty() {
            return;
        }
        let separate = match self.text.lock() {
            Ok(mut text) => {
                let separate = text.partial.is_empty() && !text.completed.trim().is_empty();
                text.partial.push_str(fragment);
                separate
            }
            Err(_) => false,
        };
        if separate {
            observer.delta("\n\n");
        }
        observer.delta(fragment);
    }

    /// The round is over: its final content (after hooks rewrote it) and a note join the text.
    fn end_round(&self, content: &str, note: Option<&str>) {
        if let Ok(mut text) = self.text.lock() {
            text.partial.clear();
            let completed = std::mem::take(&mut text.completed);
            text.completed = join(join(completed, content), note.unwrap_or_default());
        }
    }

    /// The finished rounds' text.
    fn completed(&self) -> String {
        self.text
            .lock()
            .map(|text| text.completed.clone())
            .unwrap_or_default()
    }

    /// Everything shown, the round cut short included.
    fn everything(&self) -> String {
        self.text
            .lock()
            .map(|text| join(text.completed.clone(), &text.partial))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
