//! Runs subagent tasks: each a run of its type's [`Runtime`] on a thread of its own (not
//! stored: only its record is), at most `max_concurrent` at once across all conversations.
//!
//! - **Its own task**: a subagent runs in a task of its own, never in the caller's future, so
//!   a parent dropped at an `.await` (its run timed out, the turn was interrupted) cannot
//!   leave a record half written: dropping the caller cancels the task, which then records how
//!   it ended.
//! - **Limits**: a task waits for a slot, then runs for its type's timeout at most, and never
//!   past its parent call's deadline less [`PARENT_MARGIN`], so the lead still has time to
//!   answer from what its subagents did. The call's deadline is the type's timeout and a
//!   margin (`TASK_CALL_MARGIN`), and the turn's timeout grows to fit the slowest type, so
//!   the type's timeout is what limits a task; when the parent's turn left less (a task
//!   started late in a long turn), the error says so. A timeout cancels the subagent's model
//!   and tool calls cooperatively (the runtime's own deadline) and is recorded as TIMED_OUT.
//!   A task that used up its type's token budget ends before its next round, TIMED_OUT with
//!   `stop_reason = "token_budget"` and what it wrote so far as its result.
//! - **Cancellation**: the parent's cancellation (`/stop`, its run ending) and
//!   [`SubagentExecutor::cancel`] (the operator's API) end a task as CANCELLED. A task cut
//!   short because antler is shutting down is left RUNNING: the next start marks it FAILED
//!   ("interrupted by restart"), which is what the parent's re-run then finds.
//! - **Re-runs**: a task is found again by its parent's turn and tool call, so a turn re-run
//!   after a crash gets the recorded result instead of starting the work again.
//! - **Tracing**: the child's log lines carry the parent's trace id (`subagent` span).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::config::SubagentType;
use super::registry::{
    RegistryError, SubagentChange, SubagentRecord, SubagentRegistry, SubagentStatus, Transition,
};
use crate::agent::input::{Author, ChannelFlags, RunInput};
use crate::agent::middleware::{MiddlewareChain, RunEnding};
use crate::agent::model::ChatModel;
use crate::agent::runtime::{
    CheckpointError, EMPTY_ANSWER, NO_ANSWER_PREFIX, RunLimits, RunObserver, RunOutcome, Runtime,
    RuntimeSettings, TOKEN_BUDGET, ToolProgress,
};
use crate::agent::thread::ThreadState;
use crate::agent::tools::{ProgressSink, ToolRegistry};

/// How long before its parent's deadline a subagent is stopped, so the lead can still answer.
pub(crate) const PARENT_MARGIN: Duration = Duration::from_secs(15);

/// The most of a subagent's answer kept as its result.
const MAX_RESULT_BYTES: usize = 64 * 1024;

/// The error of a task that antler's restart interrupted.
pub(crate) const INTERRUPTED: &str = "interrupted by restart";

/// How often a failed registry write is tried before the task gives up on recording it.
const REGISTRY_ATTEMPTS: u32 = 3;

/// A subagent type and the runtime that runs it.
#[derive(Debug, Clone)]
pub(crate) struct SubagentKind {
    pub(crate) spec: SubagentType,
    pub(crate) runtime: Runtime,
}

impl SubagentKind {
    /// The runtime of type `spec`: `model`, the type's share of `tools` (and of the tools
    /// `chain` contributes), the type's system prompt and turn cap; the rest of `settings`
    /// as the lead's.
    pub(crate) fn new(
        spec: SubagentType,
        model: Arc<dyn ChatModel>,
        tools: ToolRegistry,
        chain: MiddlewareChain,
        settings: RuntimeSettings,
    ) -> Self {
        let settings = RuntimeSettings {
            system_prompt: crate::live::Live::text(&spec.system_prompt),
            max_model_calls: spec.max_turns,
            token_budget: spec.token_budget,
            ..settings
        };
        let runtime =
            Runtime::new(model, tools, chain, settings).with_tools_only(|name| spec.allows(name));
        Self { spec, runtime }
    }
}

/// What the parent asks for.
#[derive(Debug, Clone)]
pub(crate) struct TaskRequest {
    /// A few words, shown in the chat and in `/tasks`.
    pub(crate) description: String,
    /// Everything the subagent knows about the task.
    pub(crate) prompt: String,
    pub(crate) subagent_type: String,
    /// Where it comes from.
    pub(crate) parent: ParentCall,
}

/// The parent's tool call that asks for a task.
#[derive(Clone)]
pub(crate) struct ParentCall {
    pub(crate) thread_id: String,
    /// The inbox item of the parent's turn.
    pub(crate) turn: u64,
    pub(crate) call_id: String,
    /// Who the parent runs for: the subagent runs with the same rights.
    pub(crate) author: Author,
    pub(crate) trace_id: String,
    /// When the parent's call must be done.
    pub(crate) deadline: Instant,
    /// Where the subagent's steps are reported (the parent call's progress line).
    pub(crate) progress: ProgressSink,
}

impl std::fmt::Debug for ParentCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentCall")
            .field("thread_id", &self.thread_id)
            .field("turn", &self.turn)
            .field("call_id", &self.call_id)
            .field("trace_id", &self.trace_id)
            .finish_non_exhaustive()
    }
}

/// Why a task could not be run at all (its record could not be written).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TaskError {
    #[error("there is no subagent type `{0}`")]
    UnknownType(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// What [`SubagentExecutor::cancel`] found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CancelOutcome {
    /// No task has that id.
    Unknown,
    /// It had already ended; the record as it is.
    AlreadyEnded(SubagentRecord),
    /// Cancelled; the record as it is now.
    Cancelled(SubagentRecord),
}

/// Runs subagent tasks. Cloning shares it.
#[derive(Debug, Clone)]
pub(crate) struct SubagentExecutor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Arc<dyn SubagentRegistry>,
    kinds: BTreeMap<String, SubagentKind>,
    slots: Arc<Semaphore>,
    /// The tasks of this process that have not ended, by id; bounded by the tasks the
    /// parents' runs may start at once.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// Cancelled when antler shuts down: tasks cut short then stay RUNNING (see the module doc).
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl SubagentExecutor {
    /// An executor of `kinds`, running at most `max_concurrent` tasks at once.
    pub(crate) fn new(
        registry: Arc<dyn SubagentRegistry>,
        kinds: Vec<SubagentKind>,
        max_concurrent: usize,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                registry,
                kinds: kinds
                    .into_iter()
                    .map(|kind| (kind.spec.name.clone(), kind))
                    .collect(),
                slots: Arc::new(Semaphore::new(max_concurrent.max(1))),
                running: Mutex::default(),
                shutdown,
                tasks: TaskTracker::new(),
            }),
        }
    }

    /// The types, sorted by name.
    pub(crate) fn types(&self) -> impl Iterator<Item = &SubagentType> {
        self.inner.kinds.values().map(|kind| &kind.spec)
    }

    /// The type called `name`.
    pub(crate) fn kind(&self, name: &str) -> Option<&SubagentType> {
        self.inner.kinds.get(name).map(|kind| &kind.spec)
    }

    /// Tasks running or waiting for a slot in this process.
    #[cfg(test)]
    pub(crate) fn active(&self) -> usize {
        self.inner.running.lock().map_or(0, |running| running.len())
    }

    /// Runs the task `request` asks for until it ends, and returns its final record; a turn
    /// re-run gets the record its earlier run left. `cancel` is the parent call's token.
    pub(crate) async fn run(
        &self,
        request: TaskRequest,
        cancel: &CancellationToken,
    ) -> Result<SubagentRecord, TaskError> {
        let inner = &self.inner;
        let parent = &request.parent;
        if let Some(earlier) = inner
            .registry
            .for_call(&parent.thread_id, parent.turn, &parent.call_id)
            .await?
        {
            return self.earlier(earlier).await;
        }
        let Some(kind) = inner.kinds.get(&request.subagent_type).cloned() else {
            return Err(TaskError::UnknownType(request.subagent_type));
        };
        let now = crate::now_ms();
        let record = SubagentRecord {
            id: format!("task_{now:012x}{:08x}", fastrand::u32(..)),
            parent_thread_id: parent.thread_id.clone(),
            parent_turn: parent.turn,
            parent_call_id: parent.call_id.clone(),
            subagent_type: request.subagent_type.clone(),
            description: request.description.clone(),
            prompt: request.prompt.clone(),
            status: SubagentStatus::Pending,
            stop_reason: None,
            result: None,
            error: None,
            usage: Default::default(),
            trace_id: parent.trace_id.clone(),
            created_at_ms: now,
            started_at_ms: None,
            finished_at_ms: None,
        };
        inner.registry.create(&record).await?;
        let task_cancel = cancel.child_token();
        if let Ok(mut running) = inner.running.lock() {
            running.insert(record.id.clone(), task_cancel.clone());
            metrics::gauge!("antler_subagents_active").set(running.len() as f64);
        }
        let span = tracing::info_span!(
            "subagent",
            trace = %parent.trace_id,
            task = %record.id,
            kind = %kind.spec.name
        );
        let id = record.id.clone();
        let handle = inner.tasks.spawn(
            self.clone()
                .execute(kind, record, request, task_cancel.clone())
                .instrument(span),
        );
        // The caller gone (its run ended or was dropped) means the task is no longer wanted.
        let _cancel_when_dropped = task_cancel.drop_guard();
        match handle.await {
            Ok(record) => Ok(record),
            Err(e) => {
                tracing::error!(task = %id, error = %e, "a subagent task panicked");
                let change = SubagentChange::failed(
                    SubagentStatus::Failed,
                    "the subagent crashed; the details are in antler's log",
                    crate::now_ms(),
                );
                self.forget(&id);
                Ok(inner.registry.transition(&id, &change).await?.into_record())
            }
        }
    }

    /// The record a re-run of the parent's turn finds: what the earlier run recorded, or, if
    /// that run was interrupted before the task ended, the task marked failed.
    async fn earlier(&self, record: SubagentRecord) -> Result<SubagentRecord, TaskError> {
        let live = self
            .inner
            .running
            .lock()
            .is_ok_and(|running| running.contains_key(&record.id));
        if record.status.is_terminal() || live {
            return Ok(record);
        }
        let change = SubagentChange::failed(SubagentStatus::Failed, INTERRUPTED, crate::now_ms());
        Ok(self
            .inner
            .registry
            .transition(&record.id, &change)
            .await?
            .into_record())
    }

    /// Cancels task `id` if it has not ended: records CANCELLED ("cancelled by an operator"),
    /// then stops it if it runs in this process (its model and tool calls end).
    pub(crate) async fn cancel(&self, id: &str) -> Result<CancelOutcome, RegistryError> {
        let token = self
            .inner
            .running
            .lock()
            .ok()
            .and_then(|running| running.get(id).cloned());
        let Some(record) = self.inner.registry.get(id).await? else {
            return Ok(CancelOutcome::Unknown);
        };
        if record.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded(record));
        }
        // The end is recorded here, with its reason, before the task is told: the first
        // terminal write wins, so the task's own "cancelled" afterwards changes nothing.
        let change = SubagentChange::failed(
            SubagentStatus::Cancelled,
            "cancelled by an operator",
            crate::now_ms(),
        );
        let outcome = match self.inner.registry.transition(id, &change).await? {
            Transition::Applied(record) => CancelOutcome::Cancelled(record),
            Transition::Refused(record) => CancelOutcome::AlreadyEnded(record),
        };
        if let Some(token) = token {
            token.cancel();
        }
        Ok(outcome)
    }

    /// Stops taking tasks and waits up to `wait` for those running to end (shutdown).
    pub(crate) async fn close(&self, wait: Duration) {
        self.inner.tasks.close();
        if tokio::time::timeout(wait, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some subagent tasks did not stop in time");
        }
    }

    fn forget(&self, id: &str) {
        if let Ok(mut running) = self.inner.running.lock() {
            running.remove(id);
            metrics::gauge!("antler_subagents_active").set(running.len() as f64);
        }
    }

    /// The task itself: a slot, RUNNING, the run, its end recorded.
    async fn execute(
        self,
        kind: SubagentKind,
        record: SubagentRecord,
        request: TaskRequest,
        cancel: CancellationToken,
    ) -> SubagentRecord {
        let ended = self.execute_inner(kind, record, request, &cancel).await;
        self.forget(&ended.id);
        metrics::counter!("antler_subagents_total", "status" => ended.status.as_str()).increment(1);
        if let Some(ms) = ended.duration_ms(crate::now_ms()) {
            metrics::histogram!("antler_subagent_duration_seconds").record(ms as f64 / 1000.0);
        }
        ended
    }

    async fn execute_inner(
        &self,
        kind: SubagentKind,
        record: SubagentRecord,
        request: TaskRequest,
        cancel: &CancellationToken,
    ) -> SubagentRecord {
        let inner = &self.inner;
        let parent = &request.parent;
        let latest_end = parent
            .deadline
            .checked_sub(PARENT_MARGIN)
            .unwrap_or_else(Instant::now);
        let waited = Instant::now();
        let slot = tokio::select! {
            biased;
            () = cancel.cancelled() => return self.cancelled(record).await,
            () = tokio::time::sleep_until(latest_end) => {
                let error = format!(
                    "it waited {} seconds for a free slot (at most {} tasks run at once) and \
                     its parent could not wait longer",
                    waited.elapsed().as_secs(),
                    inner.slots.available_permits().max(1)
                );
                return self
                    .end(&record, SubagentChange::failed(SubagentStatus::TimedOut, error, crate::now_ms()))
                    .await;
            }
            slot = Arc::clone(&inner.slots).acquire_owned() => slot.ok(),
        };
        let running = SubagentChange::to(SubagentStatus::Running, crate::now_ms());
        let record = match self.write(&record.id, &running).await {
            Some(Transition::Applied(record)) => record,
            // Cancelled by an operator while it waited, or the store failed: nothing runs.
            Some(Transition::Refused(record)) => return record,
            None => return record,
        };
        tracing::info!(
            waited_ms = waited.elapsed().as_millis() as u64,
            "subagent starts"
        );
        let timeout = kind
            .spec
            .timeout
            .min(latest_end.saturating_duration_since(Instant::now()));
        // The call's deadline leaves the type's whole timeout unless the task waited long for
        // a slot; then its error says so, so a cut is never silent.
        let cut_by_parent = timeout < kind.spec.timeout;
        if cut_by_parent {
            tracing::warn!(
                timeout_secs = timeout.as_secs(),
                type_timeout_secs = kind.spec.timeout.as_secs(),
                "the parent's call leaves the task less than its type's timeout"
            );
        }
        let mut thread = ThreadState::new(
            parent.thread_id.clone(),
            format!("subagent:{}", record.id),
            0,
            crate::now_ms(),
        );
        let input = RunInput {
            text: request.prompt.clone(),
            author: parent.author.clone(),
            attachments: Vec::new(),
            flags: ChannelFlags::default(),
            trace_id: parent.trace_id.clone(),
        };
        let observer = ChildObserver {
            description: request.description.clone(),
            progress: Arc::clone(&parent.progress),
        };
        let limits = RunLimits {
            timeout,
            cancel: cancel.clone(),
        };
        let outcome = kind
            .runtime
            .run(&mut thread, &input, &observer, &limits)
            .await;
        drop(slot);
        if cancel.is_cancelled() && inner.shutdown.is_cancelled() {
            // antler is stopping: the next start marks it failed, and the parent's re-run
            // sees that (module doc).
            tracing::info!("subagent interrupted by shutdown");
            return record;
        }
        let change = conclude(&outcome, timeout, cut_by_parent, kind.spec.token_budget);
        tracing::info!(
            status = change.status.as_str(),
            model_calls = outcome.model_calls,
            tokens = outcome.usage.total_tokens,
            "subagent ended"
        );
        self.end(&record, change).await
    }

    async fn cancelled(&self, record: SubagentRecord) -> SubagentRecord {
        if self.inner.shutdown.is_cancelled() {
            return record;
        }
        let change = SubagentChange::to(SubagentStatus::Cancelled, crate::now_ms());
        self.end(&record, change).await
    }

    /// Records the end; if the registry keeps failing, the record as it would be (the parent
    /// still gets its result; the stored record is fixed by the next start).
    async fn end(&self, record: &SubagentRecord, change: SubagentChange) -> SubagentRecord {
        match self.write(&record.id, &change).await {
            Some(transition) => transition.into_record(),
            None => {
                let mut record = record.clone();
                change.apply(&mut record);
                record
            }
        }
    }

    async fn write(&self, id: &str, change: &SubagentChange) -> Option<Transition> {
        let mut wait = Duration::from_millis(50);
        for attempt in 1..=REGISTRY_ATTEMPTS {
            match self.inner.registry.transition(id, change).await {
                Ok(transition) => return Some(transition),
                Err(e) => {
                    tracing::error!(attempt, error = %e, status = change.status.as_str(), "cannot record a subagent's status");
                    tokio::time::sleep(wait).await;
                    wait *= 4;
                }
            }
        }
        None
    }
}

/// How a subagent's run ended, as a registry change. `timeout` is the time it had,
/// `cut_by_parent` whether that was less than its type's timeout (its parent's call had no
/// more), `budget` its token budget.
fn conclude(
    outcome: &RunOutcome,
    timeout: Duration,
    cut_by_parent: bool,
    budget: Option<u64>,
) -> SubagentChange {
    let now = crate::now_ms();
    let stop_reason = match outcome.stop_reason.as_deref() {
        Some("iteration_limit") => Some("turn_capped".to_owned()),
        Some("loop_capped") => Some("loop_capped".to_owned()),
        Some(TOKEN_BUDGET) => Some(TOKEN_BUDGET.to_owned()),
        _ => None,
    };
    let with_usage = |change: SubagentChange| SubagentChange {
        usage: outcome.usage,
        stop_reason: stop_reason.clone(),
        ..change
    };
    if outcome.stop_reason.as_deref() == Some(TOKEN_BUDGET) {
        // Ended like a timeout (as DeerFlow's), keeping what it wrote so far.
        let partial = outcome.answer.trim();
        return with_usage(SubagentChange {
            result: (!partial.is_empty()).then(|| bounded(partial)),
            ..SubagentChange::failed(
                SubagentStatus::TimedOut,
                format!(
                    "it used {} tokens, over its budget of {} (subagents.token_budget)",
                    outcome.usage.total_tokens,
                    budget.unwrap_or_default()
                ),
                now,
            )
        });
    }
    match outcome.ending {
        RunEnding::TimedOut => with_usage(SubagentChange::failed(
            SubagentStatus::TimedOut,
            if cut_by_parent {
                format!(
                    "it did not finish within {} seconds, all the time its `task` call had left \
                     after it waited for a free slot",
                    timeout.as_secs()
                )
            } else {
                format!("it did not finish within {} seconds", timeout.as_secs())
            },
            now,
        )),
        RunEnding::Failed => with_usage(SubagentChange::failed(
            SubagentStatus::Failed,
            outcome
                .error
                .as_ref()
                .map_or_else(|| "the subagent failed".to_owned(), |e| e.user_message()),
            now,
        )),
        RunEnding::Stopped if outcome.stop_reason.as_deref() == Some("stopped_by_user") => {
            with_usage(SubagentChange::to(SubagentStatus::Cancelled, now))
        }
        RunEnding::Answered | RunEnding::Interrupted | RunEnding::Stopped => {
            let answer = outcome.answer.trim();
            let no_answer = outcome.stop_reason.as_deref() == Some(EMPTY_ANSWER);
            if no_answer || answer.is_empty() || answer.starts_with(NO_ANSWER_PREFIX) {
                let why = stop_reason.as_deref().map_or_else(
                    || "the subagent gave no answer".to_owned(),
                    |reason| format!("the subagent gave no answer ({reason})"),
                );
                with_usage(SubagentChange::failed(SubagentStatus::Failed, why, now))
            } else {
                with_usage(SubagentChange {
                    result: Some(bounded(answer)),
                    ..SubagentChange::to(SubagentStatus::Completed, now)
                })
            }
        }
    }
}

/// `text`, cut at [`MAX_RESULT_BYTES`] with a note.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_RESULT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_RESULT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n\n[… the rest of the answer was cut]", &text[..end])
}

/// Reports a subagent's steps on its parent's progress line; keeps nothing (a subagent's
/// thread is not stored).
struct ChildObserver {
    description: String,
    progress: ProgressSink,
}

#[async_trait::async_trait]
impl RunObserver for ChildObserver {
    fn delta(&self, _text: &str) {}

    fn progress(&self, event: &ToolProgress) {
        if let ToolProgress::Started { name, .. } = event {
            (self.progress)(&format!("⏳ {} · {name}", self.description));
        }
    }

    async fn checkpoint(&self, _thread: &mut ThreadState) -> Result<(), CheckpointError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
