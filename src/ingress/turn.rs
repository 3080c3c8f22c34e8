//! One turn: an inbox item becomes a command reply or an agent run, and its replies go to the
//! outbox in the same transaction that removes the item from the inbox.
//!
//! A turn never gives its place up to a later message of its conversation: when the store
//! fails to start or finish it, the runner retries with backoff until it succeeds or antler
//! stops. A turn that fails (model error, timeout, panic) is answered with what went wrong,
//! and its messages stay in the thread marked as failed, out of the model's context, so the
//! user can simply send the message again. A turn interrupted by shutdown gives its attempt
//! back; only attempts cut short by a crash count towards giving up on a message.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use antler_channel::{InboundEvent, OutboundFile, OutboundMessage, Progress, Prompt, Receipt};
use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

mod operator;

use super::approvals::{self, Approvals, Decider};
use super::attachments;
use super::commands::{self, Command, PlanSwitch};
use super::dispatcher::Dispatcher;
use super::pairing::Pairing;
use crate::agent::approvals::{ApprovalRecord, ApprovalState};
use crate::agent::input::{Attachment, Author, ChannelFlags, Role, RunInput};
use crate::agent::memory::MemoryUpdate;
use crate::agent::memory::identity::MemoryIdentities;
use crate::agent::memory::sharing::GroupPolicy;
use crate::agent::message::ChatMessage;
use crate::agent::middleware::RunEnding;
use crate::agent::middleware::pending_title::PendingTitle;
use crate::agent::middleware::todo::TodoConfig;
use crate::agent::runtime::{
    CheckpointError, RunLimits, RunObserver, Runtime, ToolProgress, unanswered_calls_at,
};
use crate::agent::skills::Catalogue;
use crate::agent::thread::{RunningTurn, ThreadState};
use crate::delivery::{Delivery, Draft};
use crate::events::{EventHub, ThreadEvent, ToolState};
use crate::live::Live;
use crate::opcommands::OperatorCommands;
use crate::retry::{Backoff, RetryPolicy};
use crate::schedule::Schedules;
use crate::store::{FinishTurn, InboxItem, InboxStatus, OutboxItem, Store, StoreError};

/// The first wait before retrying a failed store operation; it doubles up to the cap.
const STORE_RETRY_FIRST: Duration = Duration::from_millis(100);
const STORE_RETRY_CAP: Duration = Duration::from_secs(10);

/// How often the typing indicator is renewed (platforms show it for about 5 seconds).
const TYPING_EVERY: Duration = Duration::from_secs(4);

/// The most finished turns written in one transaction.
const MAX_FINISH_BATCH: usize = 256;

/// A finished turn on its way to the finisher, and where its outbox items go. Shared, so a
/// retry sends the same turn again without copying its thread.
type FinishRequest = (
    Arc<FinishTurn>,
    oneshot::Sender<Result<Vec<OutboxItem>, StoreError>>,
);

/// How long an album's parts must have stopped arriving before its turn runs: Telegram sends
/// them one right after the other.
const ALBUM_QUIET: Duration = Duration::from_millis(1500);

/// The longest an album's turn waits for its parts.
const ALBUM_MAX_WAIT: Duration = Duration::from_secs(10);

/// The most parts of one album (Telegram's `sendMediaGroup` takes 2–10).
const MAX_ALBUM_PARTS: usize = 10;

/// The reply of a turn whose model said nothing before calls that wait for approval (their
/// prompts follow it).
const WAITING_FOR_APPROVAL: &str = "⏸ Waiting for approval before going on.";

/// The answer to a turn that panicked.
const PANIC_REPLY: &str = "⚠️ Sorry, something went wrong inside antler while answering this \
message; the details are in antler's log. Send it again to retry.";

/// The answer when the conversation's thread cannot be read from the store.
const UNREADABLE_THREAD: &str = "⚠️ Sorry, I cannot read this conversation's history: \
antler's store could not load it (the details are in antler's log). /new starts a fresh \
conversation.";

/// Why a store operation was not retried to success.
#[derive(Debug)]
enum Stopped {
    /// Turns are being cancelled (shutdown).
    Cancelled,
    /// The store failed in a way that trying again cannot mend (logged where it happened).
    Failed,
    /// Another replica holds the conversation now ([`StoreError::NotHeld`]).
    NotHeld,
}

/// Runs inbox items. Cloning shares it.
#[derive(Debug, Clone)]
pub(crate) struct TurnRunner {
    inner: Arc<Inner>,
}

/// How turns run.
#[derive(Debug, Clone)]
pub(crate) struct TurnSettings {
    /// Attempts before a message is given up (only crashes count).
    pub(crate) max_attempts: u32,
    /// The time limit of one turn.
    pub(crate) turn_timeout: Duration,
    /// The largest attachment fetched for a turn.
    pub(crate) max_attachment_bytes: u64,
    /// `[agent.middleware.todo]`: whether `/plan` may switch plan mode, and its default.
    pub(crate) todo: TodoConfig,
    /// `telemetry.trace_url`: `/status` links the last turn's trace with it.
    pub(crate) trace_url: Option<String>,
    /// `[[memory.identities]]`: whose memory `/memory` reads.
    pub(crate) memory_identities: MemoryIdentities,
    /// What of it `/memory` shows in a group chat.
    pub(crate) memory_groups: GroupPolicy,
    /// The skills found (at start, and again by a reload), for `/skills`.
    pub(crate) skills: Arc<Live<Catalogue>>,
    /// DM pairing: a refused author writing privately gets a pairing code (`None`: never).
    pub(crate) pairing: Option<Arc<Pairing>>,
    /// `[[commands]]`: operator commands, run as `/name`.
    pub(crate) commands: OperatorCommands,
    /// The schedules, for `/schedules` and `/schedule`.
    pub(crate) schedules: Arc<Schedules>,
    /// Tool calls waiting for a person: `/approve`, `/deny`, `/approvals` and resumes.
    pub(crate) approvals: Arc<Approvals>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    runtime: Runtime,
    hub: EventHub,
    delivery: Delivery,
    max_attempts: u32,
    max_attachment_bytes: u64,
    turn_timeout: Duration,
    /// `[agent.middleware.todo]`, for `/plan` and `/status`.
    todo: TodoConfig,
    /// `telemetry.trace_url`, for `/status`.
    trace_url: Option<String>,
    /// Whose memory `/memory` reads.
    memory_identities: MemoryIdentities,
    /// What of it `/memory` shows in a group chat.
    memory_groups: GroupPolicy,
    /// The skills found (at start, and again by a reload), for `/skills`.
    skills: Arc<Live<Catalogue>>,
    /// DM pairing, for refused authors writing privately.
    pairing: Option<Arc<Pairing>>,
    /// Operator commands, for `/name` and `/help`.
    commands: OperatorCommands,
    /// The schedules, for `/schedules` and `/schedule`.
    schedules: Arc<Schedules>,
    /// Tool calls waiting for a person.
    approvals: Arc<Approvals>,
    /// The running agent turn of each conversation, for `/stop`: its inbox seq and token.
    running: Mutex<HashMap<String, (u64, CancellationToken)>>,
    /// `/stop` items (inbox seqs) that stopped a turn when they arrived; each is removed
    /// when that item is answered.
    stops: Mutex<HashSet<u64>>,
    /// Cancelled when running turns must stop (shutdown, after the grace period).
    cancel: CancellationToken,
    /// The finisher: writes every finished turn waiting at that moment in one transaction.
    finisher: mpsc::UnboundedSender<FinishRequest>,
    /// For `/status`. Set once the dispatcher exists; weak, because the dispatcher owns this
    /// runner and a cycle would keep the store open after shutdown.
    queue: OnceLock<std::sync::Weak<dyn QueueView>>,
}

/// What `/status` reads about the queue.
pub(crate) trait QueueView: Send + Sync + std::fmt::Debug {
    /// Items waiting in a conversation.
    fn waiting(&self, conversation: &str) -> usize;
}

impl QueueView for Dispatcher {
    fn waiting(&self, conversation: &str) -> usize {
        Dispatcher::waiting(self, conversation)
    }
}

/// What a turn produced.
struct TurnResult {
    thread: Option<ThreadState>,
    text: String,
    outcome: &'static str,
    /// The conversation a middleware queued for the user's memory, written with the turn.
    memory_update: Option<MemoryUpdate>,
    /// The turn's live draft, which the reply replaces.
    draft: Option<Receipt>,
    /// Files the agent presented, delivered with the reply.
    files: Vec<OutboundFile>,
    /// Messages with buttons sent after the reply (the calls waiting for approval).
    prompts: Vec<Prompt>,
    /// The model's title of a new thread, written after the reply.
    title: Option<PendingTitle>,
}

/// Starts inbox item `seq`'s turn; `None` when the item is gone (an album's part that an
/// earlier part's turn took in).
async fn start_turn(store: &dyn Store, seq: u64) -> Result<Option<InboxItem>, StoreError> {
    match store.start_turn(seq).await {
        Ok(item) => Ok(Some(item)),
        Err(StoreError::Missing { .. }) => Ok(None),
        // Another replica holds the conversation now (this one stalled past its mark, or the
        // item was adopted): the holder runs it.
        Err(StoreError::NotHeld { conversation }) => {
            tracing::info!(
                seq,
                conversation,
                "another replica runs this conversation now"
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether `other` is a part of `first`'s album `group` that is still waiting: the same
/// author in the same conversation and thread, later in the inbox.
fn is_album_part(first: &InboxItem, other: &InboxItem, group: &str) -> bool {
    other.seq > first.seq
        && other.status == InboxStatus::Pending
        && other.event.media_group.as_deref() == Some(group)
        && other.event.conversation == first.event.conversation
        && other.thread_id == first.thread_id
        && other.event.user.id == first.event.user.id
        && !other.event.refused
}

/// Streams deltas to subscribers and checkpoints the thread after tool results.
struct TurnObserver<'a> {
    store: &'a dyn Store,
    hub: &'a EventHub,
    thread_id: &'a str,
    in_reply_to: &'a str,
    draft: Option<&'a Draft>,
}

#[async_trait::async_trait]
impl RunObserver for TurnObserver<'_> {
    fn delta(&self, text: &str) {
        if let Some(draft) = self.draft {
            draft.delta(text);
        }
        self.hub.publish(
            self.thread_id,
            ThreadEvent::Delta {
                in_reply_to: self.in_reply_to.to_owned(),
                text: text.to_owned(),
            },
        );
    }

    fn progress(&self, event: &ToolProgress) {
        if let Some(draft) = self.draft {
            match event {
                ToolProgress::Started { name, .. } => draft.tool_started(name),
                ToolProgress::Note { call_id, text, .. } => draft.note(call_id, text),
                ToolProgress::Finished { .. } => {}
            }
        }
        let (call_id, name, state, text) = match event {
            ToolProgress::Started { call_id, name } => (call_id, name, ToolState::Started, None),
            ToolProgress::Note {
                call_id,
                name,
                text,
            } => (call_id, name, ToolState::Running, Some(text.clone())),
            ToolProgress::Finished {
                call_id,
                name,
                is_error,
            } => (
                call_id,
                name,
                if *is_error {
                    ToolState::Failed
                } else {
                    ToolState::Finished
                },
                None,
            ),
        };
        self.hub.publish(
            self.thread_id,
            ThreadEvent::Tool {
                in_reply_to: self.in_reply_to.to_owned(),
                call_id: call_id.clone(),
                name: name.clone(),
                state,
                text,
            },
        );
    }

    async fn checkpoint(&self, thread: &mut ThreadState) -> Result<(), CheckpointError> {
        self.store.checkpoint_thread(thread).await.map_err(|e| {
            tracing::warn!(thread = %thread.id, error = %e, "checkpoint failed; the turn fails");
            CheckpointError(e.to_string())
        })
    }
}

impl TurnRunner {
    /// The approval service its turns open approvals in.
    pub(crate) fn approvals(&self) -> Arc<Approvals> {
        Arc::clone(&self.inner.approvals)
    }

    pub(crate) fn new(
        store: Arc<dyn Store>,
        runtime: Runtime,
        hub: EventHub,
        delivery: Delivery,
        settings: &TurnSettings,
        cancel: CancellationToken,
    ) -> Self {
        let (finisher, finishes) = mpsc::unbounded_channel();
        // Ends when the last handle to this runner is dropped.
        tokio::spawn(finish_batches(Arc::clone(&store), finishes));
        Self {
            inner: Arc::new(Inner {
                finisher,
                store,
                runtime,
                hub,
                delivery,
                max_attempts: settings.max_attempts.max(1),
                max_attachment_bytes: settings.max_attachment_bytes,
                todo: settings.todo.clone(),
                trace_url: settings.trace_url.clone(),
                memory_identities: settings.memory_identities.clone(),
                memory_groups: settings.memory_groups,
                skills: Arc::clone(&settings.skills),
                pairing: settings.pairing.clone(),
                commands: settings.commands.clone(),
                schedules: Arc::clone(&settings.schedules),
                approvals: Arc::clone(&settings.approvals),
                turn_timeout: settings.turn_timeout,
                running: Mutex::default(),
                stops: Mutex::default(),
                cancel,
                queue: OnceLock::new(),
            }),
        }
    }

    /// Lets `/status` see the queue (the dispatcher is built after the runner).
    pub(crate) fn attach_queue(&self, queue: std::sync::Weak<dyn QueueView>) {
        let _ = self.inner.queue.set(queue);
    }

    /// `/stop` arrived as inbox item `stop_seq`: stops the agent turn running in
    /// `conversation`, if any, ahead of the queue (the `/stop` item itself is answered in
    /// turn, saying whether it stopped something). Returns whether it did.
    pub(crate) fn stop(&self, conversation: &str, stop_seq: u64) -> bool {
        let stopped = self
            .inner
            .running
            .lock()
            .ok()
            .and_then(|running| running.get(conversation).cloned())
            .is_some_and(|(seq, token)| {
                tracing::info!(
                    seq,
                    conversation,
                    "stopping the running turn at the user's request"
                );
                token.cancel();
                true
            });
        if stopped {
            if let Ok(mut stops) = self.inner.stops.lock() {
                stops.insert(stop_seq);
            }
        }
        stopped
    }

    /// Runs one item to completion. Returns whether it finished (left the inbox); `false`
    /// means it stays in the inbox and runs again after a restart.
    pub(crate) async fn run(&self, seq: u64) -> bool {
        let inner = &self.inner;
        let started = Instant::now();
        let item = match self
            .retry("start the turn", seq, || {
                start_turn(inner.store.as_ref(), seq)
            })
            .await
        {
            Ok(Some(item)) => item,
            // Answered already, with the earlier part of its album that took it in.
            Ok(None) => return true,
            Err(_) => return false,
        };
        let (item, absorbed) = self.gather_album(item).await;
        let span = turn_span(&item);
        self.run_item(item, absorbed, started)
            .instrument(span)
            .await
    }

    /// [`Self::run`] once the item is read, inside its `turn` span.
    async fn run_item(&self, item: InboxItem, absorbed: Vec<u64>, started: Instant) -> bool {
        let inner = &self.inner;
        let seq = item.seq;
        let planned = tokio::select! {
            biased;
            () = inner.cancel.cancelled() => None,
            result = self.plan(&item) => Some(result),
        };
        let Some(result) = planned else {
            // Stopped on purpose: the attempt does not count as a crash.
            if let Err(e) = inner.store.release_turn(seq).await {
                tracing::warn!(seq, error = %e, "cannot release an interrupted turn");
            }
            tracing::info!(
                seq,
                "turn interrupted by shutdown; it runs again on the next start"
            );
            return false;
        };
        let titled = result.thread.as_ref().map(|thread| thread.id.clone());
        let reply = OutboundMessage {
            prompts: result.prompts,
            idempotency_key: format!("{}:{}:0", item.thread_id, item.seq),
            conversation: item.event.conversation.clone(),
            thread_id: item.thread_id.clone(),
            text: result.text,
            reply_to: item.event.reply_to.clone(),
            files: result.files,
            reply_context: item.event.reply_context.clone(),
        };
        // A resume with nothing to say (its call was answered another way) sends nothing.
        let replies = if reply.text.is_empty() && reply.files.is_empty() && reply.prompts.is_empty()
        {
            Vec::new()
        } else {
            vec![reply]
        };
        let finish = Arc::new(FinishTurn {
            inbox_seq: item.seq,
            trace: item.trace,
            thread: result.thread,
            replies,
            memory_update: result.memory_update,
            draft: result.draft,
            now_ms: crate::now_ms(),
            absorbed,
        });
        let items = match self
            .retry("finish the turn", seq, || self.finish(Arc::clone(&finish)))
            .await
        {
            Ok(items) => items,
            // Another replica took the conversation over and runs the item again: this
            // replica's answer is dropped, unsent.
            Err(Stopped::NotHeld) => return true,
            Err(_) => return false,
        };
        inner.delivery.enqueue(items);
        metrics::counter!("antler_turns_total", "outcome" => result.outcome).increment(1);
        metrics::histogram!("antler_turn_duration_seconds").record(started.elapsed().as_secs_f64());
        if let (Some(pending), Some(thread_id)) = (result.title, titled) {
            // Still inside the turn, so the conversation's lane is held: no later turn of the
            // thread runs (and writes it) before the title is written.
            self.write_title(seq, &thread_id, pending).await;
        }
        true
    }

    /// Waits for the model's title of thread `thread_id`, whose first turn has just finished
    /// with the fallback title, and writes it if the thread still carries that fallback. The
    /// reply is on its way already. A shutdown lets the call finish within the grace period
    /// for turns and abandons it when running turns are interrupted; a failed write is logged
    /// and loses only the model's title (and the count of its tokens): the thread keeps the
    /// fallback.
    async fn write_title(&self, seq: u64, thread_id: &str, pending: PendingTitle) {
        let inner = &self.inner;
        let update = tokio::select! {
            biased;
            () = inner.cancel.cancelled() => {
                tracing::debug!(seq, thread = thread_id, "title call abandoned at shutdown");
                return;
            }
            update = pending.wait() => update,
        };
        if !update.changes_anything() {
            return;
        }
        let mut thread = match inner.store.thread(thread_id).await {
            Ok(Some(thread)) => thread,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(seq, thread = thread_id, error = %e, "cannot read the thread to title it; it keeps the question as its title");
                return;
            }
        };
        if !update.apply(&mut thread) {
            return;
        }
        thread.updated_at_ms = crate::now_ms();
        if let Err(e) = inner.store.checkpoint_thread(&mut thread).await {
            tracing::warn!(seq, thread = thread_id, error = %e, "cannot write the thread's title; it keeps the question as its title");
        }
    }

    /// The first part of an album to run waits until the other parts stop arriving (each is an
    /// update of its own, sent within moments), then takes them in: one turn answers the
    /// album, with every file and the caption, and the parts it took finish with it, with no
    /// answer of their own. Returns the item as the turn sees it and the parts it took. Run
    /// again after a crash, it takes the same parts (they are still in the inbox).
    async fn gather_album(&self, mut item: InboxItem) -> (InboxItem, Vec<u64>) {
        let inner = &self.inner;
        let Some(group) = item.event.media_group.clone() else {
            return (item, Vec::new());
        };
        if item.event.refused || item.event.unsupported.is_some() {
            return (item, Vec::new());
        }
        let waiting_since = Instant::now();
        let parts = loop {
            let parts: Vec<InboxItem> = match inner.store.inbox().await {
                Ok(inbox) => inbox
                    .into_iter()
                    .filter(|other| is_album_part(&item, other, &group))
                    .take(MAX_ALBUM_PARTS - 1)
                    .collect(),
                Err(e) => {
                    // Each part is still answered, on its own.
                    tracing::warn!(seq = item.seq, error = %e, "cannot read the rest of an album");
                    break Vec::new();
                }
            };
            let last_ms = parts
                .iter()
                .map(|part| part.accepted_at_ms)
                .fold(item.accepted_at_ms, u64::max);
            let quiet = Duration::from_millis(crate::now_ms().saturating_sub(last_ms));
            let left = ALBUM_MAX_WAIT.saturating_sub(waiting_since.elapsed());
            if quiet >= ALBUM_QUIET || left.is_zero() || parts.len() + 1 >= MAX_ALBUM_PARTS {
                break parts;
            }
            tokio::select! {
                () = tokio::time::sleep((ALBUM_QUIET - quiet).min(left)) => {}
                () = inner.cancel.cancelled() => break parts,
            }
        };
        let mut texts = vec![std::mem::take(&mut item.event.text)];
        for part in &parts {
            texts.push(part.event.text.clone());
            item.event
                .attachments
                .extend(part.event.attachments.iter().cloned());
        }
        texts.retain(|text| !text.trim().is_empty());
        item.event.text = texts.join("\n\n");
        if !parts.is_empty() {
            tracing::debug!(
                seq = item.seq,
                parts = parts.len() + 1,
                "an album is answered in one turn"
            );
        }
        (item, parts.iter().map(|part| part.seq).collect())
    }

    /// Writes a finished turn through the finisher (durable once it answers).
    async fn finish(&self, finish: Arc<FinishTurn>) -> Result<Vec<OutboxItem>, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.inner
            .finisher
            .send((finish, answer))
            .map_err(|_| StoreError::unavailable("the finisher has stopped"))?;
        answered
            .await
            .map_err(|_| StoreError::unavailable("the finisher has stopped"))?
    }

    /// Retries a store operation with backoff while the store says trying again can
    /// succeed: an unavailable store delays the item rather than skip it, which would let a
    /// later message of its conversation overtake it. An error that would come back every
    /// time (a record that cannot be decoded or is gone) ends the attempt at once.
    async fn retry<T, F, Fut>(&self, what: &str, seq: u64, mut operation: F) -> Result<T, Stopped>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut backoff = Backoff::new(RetryPolicy::forever(STORE_RETRY_FIRST, STORE_RETRY_CAP));
        loop {
            let wait = backoff.next_wait();
            match operation().await {
                Ok(value) => return Ok(value),
                Err(StoreError::NotHeld { conversation }) => {
                    tracing::warn!(
                        seq,
                        conversation,
                        "cannot {what}: another replica holds the conversation now"
                    );
                    return Err(Stopped::NotHeld);
                }
                Err(e) if e.is_retryable() => {
                    tracing::error!(seq, error = %e, retry_in = ?wait, "cannot {what}; retrying");
                    metrics::counter!("antler_store_errors_total", "retryable" => "true")
                        .increment(1);
                }
                Err(e) => {
                    tracing::error!(seq, error = %e, "cannot {what}; trying again cannot help");
                    metrics::counter!("antler_store_errors_total", "retryable" => "false")
                        .increment(1);
                    return Err(Stopped::Failed);
                }
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.inner.cancel.cancelled() => return Err(Stopped::Cancelled),
            }
        }
    }

    /// What the item becomes: a command reply, an agent turn, or the notice that it was
    /// given up.
    async fn plan(&self, item: &InboxItem) -> TurnResult {
        if item.event.refused {
            // Nothing runs for an author who may not use the bot: no command, no model call,
            // and nothing of theirs enters the thread.
            let (text, outcome) =
                super::pairing::refusal(self.inner.pairing.as_deref(), &item.event).await;
            return TurnResult {
                prompts: Vec::new(),
                title: None,
                thread: None,
                text,
                outcome,
                memory_update: None,
                draft: None,
                files: Vec::new(),
            };
        }
        if let Some(kind) = &item.event.unsupported {
            // Nothing to read: say so rather than leave the user waiting for an answer.
            return TurnResult {
                prompts: Vec::new(),
                title: None,
                thread: None,
                text: format!(
                    "Sorry, I can't read {kind} messages yet. Send me text, or the content as \
                     a file or an image."
                ),
                outcome: "unsupported",
                memory_update: None,
                draft: None,
                files: Vec::new(),
            };
        }
        if let Some(id) = approvals::resumed_id(&item.event) {
            return self.resume_approval(item, id).await;
        }
        let command = commands::parse(&item.event.text);
        if item.attempts > self.inner.max_attempts {
            return self.give_up(item, command.is_none()).await;
        }
        if let Some(Command::Unknown(name)) = &command
            && let Some(operator) = self.inner.commands.find(name).cloned()
        {
            return self.operator_command(item, &operator).await;
        }
        match command {
            Some(Command::Plan(switch)) => self.switch_plan_mode(item, switch).await,
            Some(command) => TurnResult {
                prompts: Vec::new(),
                title: None,
                thread: None,
                text: self.command(item, command).await,
                outcome: "command",
                memory_update: None,
                draft: None,
                files: Vec::new(),
            },
            None => self.agent_turn(item).await,
        }
    }

    /// `/plan`: plan mode on or off for the conversation's thread, kept with the thread.
    async fn switch_plan_mode(&self, item: &InboxItem, switch: PlanSwitch) -> TurnResult {
        let config = &self.inner.todo;
        let answer = |thread: Option<ThreadState>, text: &str| TurnResult {
            prompts: Vec::new(),
            title: None,
            thread,
            text: text.to_owned(),
            outcome: "command",
            memory_update: None,
            draft: None,
            files: Vec::new(),
        };
        if let Some(fixed) = commands::plan::fixed(config) {
            return answer(None, fixed);
        }
        let mut thread = match self.load_thread(item).await {
            Ok(thread) => thread,
            Err(unreadable) => return unreadable,
        };
        match commands::plan::switch(config, switch, &mut thread, crate::now_ms()) {
            Ok(text) => answer(Some(thread), text),
            Err(usage) => answer(None, usage),
        }
    }

    /// The item's thread, loaded (with retries) or new; when it cannot be read, the answer
    /// that says so (nothing is written over the stored thread).
    async fn load_thread(&self, item: &InboxItem) -> Result<ThreadState, TurnResult> {
        self.load_thread_by_id(item, &item.thread_id).await
    }

    /// [`TurnRunner::load_thread`] of thread `thread_id` (an approval's, which `/new` may
    /// have made an older thread of the conversation).
    async fn load_thread_by_id(
        &self,
        item: &InboxItem,
        thread_id: &str,
    ) -> Result<ThreadState, TurnResult> {
        let store = &self.inner.store;
        match self
            .retry("load the thread", item.seq, || store.thread(thread_id))
            .await
        {
            Ok(Some(thread)) => Ok(thread),
            Ok(None) => Ok(ThreadState::new(
                thread_id.to_owned(),
                item.event.conversation.to_string(),
                0,
                crate::now_ms(),
            )),
            // When cancelled, the turn is being dropped and this answer is never stored.
            Err(Stopped::Failed | Stopped::Cancelled | Stopped::NotHeld) => Err(TurnResult {
                prompts: Vec::new(),
                title: None,
                thread: None,
                text: UNREADABLE_THREAD.to_owned(),
                outcome: "store_error",
                memory_update: None,
                draft: item.draft.clone(),
                files: Vec::new(),
            }),
        }
    }

    /// A message that kept crashing antler: its text stays in the thread, marked failed,
    /// with the reason, and it is not run again.
    async fn give_up(&self, item: &InboxItem, in_thread: bool) -> TurnResult {
        let max = self.inner.max_attempts;
        tracing::error!(
            seq = item.seq,
            attempts = item.attempts,
            "giving up on a message that keeps failing"
        );
        let times = if max == 1 {
            "once".to_owned()
        } else {
            format!("{max} times")
        };
        let text = format!(
            "⚠️ Sorry, I gave up on this message: antler stopped unexpectedly {times} while \
             working on it. It stays in the conversation, marked as failed; send it again if \
             you still need an answer."
        );
        let thread = if in_thread {
            let mut thread = match self.load_thread(item).await {
                Ok(thread) => thread,
                Err(unreadable) => return unreadable,
            };
            let start = match thread.running {
                Some(running) if running.inbox_seq == item.seq => running.start,
                _ => {
                    thread.messages.push(ChatMessage::user(&item.event.text));
                    thread.messages.len() - 1
                }
            };
            thread.messages.push(ChatMessage::assistant(&text));
            thread.fail_from(start);
            thread.running = None;
            thread.updated_at_ms = crate::now_ms();
            Some(thread)
        } else {
            None
        };
        TurnResult {
            prompts: Vec::new(),
            title: None,
            thread,
            text,
            outcome: "abandoned",
            memory_update: None,
            // A crashed run's draft shows a half answer: the notice replaces it.
            draft: item.draft.clone(),
            files: Vec::new(),
        }
    }

    /// Runs the agent for `item` inside its `turn` span, which every log line of the turn
    /// carries: the conversation, channel, thread, trace id and inbox number.
    async fn agent_turn(&self, item: &InboxItem) -> TurnResult {
        let input = self.run_input(item);
        self.agent_turn_in_span(item, input, None).await
    }

    /// The turn of an approval's resume item: the held call is run (approved) or answered
    /// (denied, expired) and the run goes on to its answer, which opens with how the
    /// approval was decided. A call answered meanwhile (a new message withdrew it) is not run
    /// again: the chat is told the decision came too late.
    async fn resume_approval(&self, item: &InboxItem, id: &str) -> TurnResult {
        let store = &self.inner.store;
        let record = match self
            .retry("read an approval", item.seq, || store.approval(id))
            .await
        {
            Ok(Some(record))
                if record.conversation == item.event.conversation.as_str()
                    && !matches!(
                        record.state,
                        ApprovalState::Pending | ApprovalState::Withdrawn
                    ) =>
            {
                record
            }
            // Not an approval of this conversation that a decision resumes: nothing to do.
            Ok(_) | Err(_) => {
                tracing::warn!(
                    seq = item.seq,
                    approval = id,
                    "a resume item without a decided approval is dropped"
                );
                return TurnResult {
                    prompts: Vec::new(),
                    title: None,
                    thread: None,
                    text: String::new(),
                    outcome: "approval_gone",
                    memory_update: None,
                    draft: None,
                    files: Vec::new(),
                };
            }
        };
        let input = self.run_input(item);
        self.agent_turn_in_span(item, input, Some(record)).await
    }

    /// Answers the calls of the thread's last round that wait for an approval, before a new
    /// message runs: each pending approval is withdrawn (the first decision wins, so one
    /// decided meanwhile keeps its decision) and its call is answered as not run, so the
    /// model sees a whole exchange and a late decision cannot run it behind the user's back.
    async fn withdraw_held_calls(&self, thread: &mut ThreadState) {
        let store = &self.inner.store;
        for (message, call_id) in held_calls(&thread.messages) {
            let key = crate::agent::approvals::call_key(message, &call_id);
            let record = match store.approval_for_call(&thread.id, &key).await {
                Ok(Some(record)) => record,
                // Not an approval's (a crash left it): the dangling-call repair answers it.
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(thread = %thread.id, error = %e, "cannot read a held call's approval");
                    continue;
                }
            };
            let withdrawal = crate::store::ApprovalDecision {
                state: ApprovalState::Withdrawn,
                by: "a new message".to_owned(),
                reason: None,
                at_ms: crate::now_ms(),
            };
            let decided = match store.decide_approval(&record.id, &withdrawal).await {
                Ok(crate::store::Decided::Now(record) | crate::store::Decided::Before(record)) => {
                    record
                }
                Err(e) => {
                    tracing::warn!(approval = %record.id, error = %e, "cannot withdraw an approval");
                    continue;
                }
            };
            let text = match decided.state {
                ApprovalState::Approved => format!(
                    "Not run: approved by {}, but a new message arrived first.",
                    decided.decided_by.as_deref().unwrap_or("someone")
                ),
                _ => decided.refusal().unwrap_or_default(),
            };
            thread.messages.push(ChatMessage::tool(call_id, text));
        }
    }

    async fn agent_turn_in_span(
        &self,
        item: &InboxItem,
        mut input: RunInput,
        approval: Option<ApprovalRecord>,
    ) -> TurnResult {
        let inner = &self.inner;
        let loaded = match &approval {
            Some(record) => self.load_thread_by_id(item, &record.thread_id).await,
            None => self.load_thread(item).await,
        };
        let mut thread = match loaded {
            Ok(thread) => thread,
            Err(unreadable) => return unreadable,
        };
        let in_reply_to = item
            .event
            .reply_to
            .clone()
            .unwrap_or_else(|| item.event.event_id.clone());
        // A re-run after a crash continues from the checkpoint this item's turn left, if any,
        // so its user message is not added twice and finished tool calls do not run again.
        let (start, resume) = match thread.running {
            Some(running) if running.inbox_seq == item.seq => (running.start, true),
            _ => (thread.messages.len(), approval.is_some()),
        };
        let opening = approval.as_ref().map(commands::approvals::outcome);
        if let Some(record) = &approval {
            let rerun = thread.running.is_some_and(|r| r.inbox_seq == item.seq);
            if !rerun
                && !held_calls(&thread.messages).contains(&(record.message, record.call_id.clone()))
            {
                return TurnResult {
                    prompts: Vec::new(),
                    title: None,
                    thread: None,
                    text: join_text(
                        opening.as_deref().unwrap_or_default(),
                        "The conversation moved on before the decision, so nothing was run.",
                    ),
                    outcome: "approval_late",
                    memory_update: None,
                    draft: None,
                    files: Vec::new(),
                };
            }
        } else if !resume {
            self.withdraw_held_calls(&mut thread).await;
        }
        thread.running = Some(RunningTurn {
            inbox_seq: item.seq,
            start,
        });
        thread.last_trace = Some(item.trace.trace_hex());
        if !item.event.attachments.is_empty() {
            match self.fetch_attachments(item).await {
                Ok(attachments) => input.attachments = attachments,
                Err(text) => {
                    // Nothing ran: the message and the reason stay in the thread, failed.
                    record_failure(&mut thread, start, &item.event.text, &text);
                    return TurnResult {
                        prompts: Vec::new(),
                        title: None,
                        thread: Some(thread),
                        text,
                        outcome: "failed",
                        memory_update: None,
                        draft: item.draft.clone(),
                        files: Vec::new(),
                    };
                }
            }
        }
        let cancel = CancellationToken::new();
        let _registered = Registration::new(inner, item, &cancel);
        let _typing = self.show_typing(&item.event);
        let marks = self.mark_progress(&item.event);
        let draft = inner
            .delivery
            .channel(&item.event.channel)
            .and_then(|channel| Draft::start(inner.store.clone(), channel, item));
        let thread_id = thread.id.clone();
        let observer = TurnObserver {
            store: inner.store.as_ref(),
            hub: &inner.hub,
            thread_id: &thread_id,
            in_reply_to: &in_reply_to,
            draft: draft.as_ref(),
        };
        let limits = RunLimits {
            timeout: inner.turn_timeout,
            cancel,
        };
        let run = async {
            if resume {
                inner
                    .runtime
                    .resume(&mut thread, &input, &observer, &limits)
                    .await
            } else {
                inner
                    .runtime
                    .run(&mut thread, &input, &observer, &limits)
                    .await
            }
        };
        let result = std::panic::AssertUnwindSafe(run).catch_unwind().await;
        let draft = match draft {
            Some(draft) => draft.finish().await,
            None => item.draft.clone(),
        };
        let mut memory_update = None;
        let mut title = None;
        let mut files = Vec::new();
        let mut prompts = Vec::new();
        let (text, outcome, failed) = match result {
            Ok(mut outcome) => {
                if let Some(e) = &outcome.error {
                    tracing::warn!(
                        seq = item.seq,
                        error = %e,
                        retry_can_help = e.retry_can_help(),
                        "turn failed"
                    );
                }
                tracing::debug!(
                    seq = item.seq,
                    ending = outcome.ending.as_str(),
                    model_calls = outcome.model_calls,
                    stop_reason = outcome.stop_reason.as_deref(),
                    tokens = outcome.usage.total_tokens,
                    "turn finished"
                );
                memory_update = outcome.outputs.memory_update.take();
                title = outcome.outputs.title.take();
                let mut text = if !outcome.answer.trim().is_empty() {
                    outcome.answer.clone()
                } else if outcome.outputs.approvals.is_empty() {
                    "(The model returned an empty answer.)".to_owned()
                } else {
                    WAITING_FOR_APPROVAL.to_owned()
                };
                if let Some(opening) = &opening {
                    text = join_text(opening, &text);
                }
                let now = crate::now_ms();
                prompts = outcome
                    .outputs
                    .approvals
                    .iter()
                    .map(|record| commands::approvals::prompt(record, now))
                    .collect();
                let label = match outcome.ending {
                    RunEnding::Answered => "ok",
                    other => other.as_str(),
                };
                if !outcome.failed() {
                    files = outcome
                        .outputs
                        .files
                        .drain(..)
                        .map(|file| OutboundFile {
                            name: file.name,
                            media_type: file.media_type,
                            size: file.size,
                        })
                        .collect();
                }
                (text, label, outcome.failed())
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(seq = item.seq, panic = %message, "turn panicked");
                metrics::counter!("antler_turn_panics_total").increment(1);
                (PANIC_REPLY.to_owned(), "panicked", true)
            }
        };
        if let Some(marks) = marks {
            marks.end(if failed {
                Progress::Failed
            } else {
                Progress::Done
            });
        }
        if failed {
            record_failure(&mut thread, start, &item.event.text, &text);
        } else {
            thread.running = None;
            thread.updated_at_ms = crate::now_ms();
        }
        TurnResult {
            prompts,
            title,
            thread: Some(thread),
            text,
            outcome,
            memory_update,
            draft,
            files,
        }
    }

    /// Fetches the message's files into its thread's `uploads` folder, within the turn's
    /// time; the error is the reply to send.
    async fn fetch_attachments(&self, item: &InboxItem) -> Result<Vec<Attachment>, String> {
        let inner = &self.inner;
        let folders = inner.runtime.folders(&item.thread_id).map_err(|e| {
            tracing::error!(seq = item.seq, error = %e, "no folder for the thread");
            "⚠️ Sorry, antler could not store the files of this message.".to_owned()
        })?;
        let channel = inner.delivery.channel(&item.event.channel);
        let fetched = tokio::time::timeout(
            inner.turn_timeout,
            attachments::fetch_attachments(
                channel.as_deref(),
                &item.event.attachments,
                &folders,
                inner.max_attachment_bytes,
            ),
        )
        .await;
        match fetched {
            Ok(Ok(attachments)) => Ok(attachments),
            Ok(Err(e)) => {
                tracing::warn!(seq = item.seq, error = %e, "attachments not fetched");
                metrics::counter!("antler_attachment_failures_total").increment(1);
                Err(e.user_message())
            }
            Err(_) => Err(format!(
                "⚠️ Sorry, the files of this message did not arrive within {} seconds. Send \
                 them again.",
                inner.turn_timeout.as_secs()
            )),
        }
    }

    /// Marks the user's message as being worked on, on channels that can
    /// ([`antler_channel::Capabilities::progress_marks`]); [`ProgressMarks::end`] marks how the turn ended. The
    /// marks go out in order from one task, so a quick turn's end never lands before its start.
    fn mark_progress(&self, event: &InboundEvent) -> Option<ProgressMarks> {
        let channel = self.inner.delivery.channel(&event.channel)?;
        if !channel.capabilities().progress_marks {
            return None;
        }
        let message_id = event.reply_to.clone()?;
        let conversation = event.conversation.clone();
        let (end, ended) = oneshot::channel();
        tokio::spawn(async move {
            if let Err(e) = channel
                .mark(&conversation, &message_id, Progress::Working)
                .await
            {
                tracing::debug!(error = %e, "progress mark failed");
            }
            // A turn cut short (shutdown) runs again later: its mark stays as it is.
            if let Ok(progress) = ended.await
                && let Err(e) = channel.mark(&conversation, &message_id, progress).await
            {
                tracing::debug!(error = %e, "progress mark failed");
            }
        });
        Some(ProgressMarks { end })
    }

    /// Shows "typing…" in the conversation every few seconds while the turn runs, on channels
    /// that can; it stops when the returned guard is dropped (the turn ended, however).
    fn show_typing(&self, event: &InboundEvent) -> Option<DropGuard> {
        let channel = self.inner.delivery.channel(&event.channel)?;
        if !channel.capabilities().typing {
            return None;
        }
        let stop = CancellationToken::new();
        let until = stop.clone();
        let conversation = event.conversation.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = channel.typing(&conversation).await {
                    tracing::debug!(error = %e, "typing indicator failed");
                    if !e.is_retryable() {
                        break;
                    }
                }
                tokio::select! {
                    () = until.cancelled() => break,
                    () = tokio::time::sleep(TYPING_EVERY) => {}
                }
            }
        });
        Some(stop.drop_guard())
    }

    /// What the runtime is told about the message: who wrote it, where, and what the
    /// channel can show.
    fn run_input(&self, item: &InboxItem) -> RunInput {
        let event = &item.event;
        let capabilities = self
            .inner
            .delivery
            .channel(&event.channel)
            .map(|channel| channel.capabilities())
            .unwrap_or_default();
        RunInput {
            text: event.text.clone(),
            author: Author {
                channel: event.channel.clone(),
                user_id: event.user.id.clone(),
                name: event.user.name.clone(),
                role: if event.user.admin {
                    Role::Admin
                } else {
                    Role::User
                },
            },
            attachments: Vec::new(),
            flags: ChannelFlags {
                group: event.group,
                files: capabilities.files,
                images: capabilities.images,
                interactive: event.interactive,
            },
            // The message's OpenTelemetry trace id, also in every log line of the turn.
            trace_id: item.trace.trace_hex(),
        }
    }

    async fn command(&self, item: &InboxItem, command: Command) -> String {
        match command {
            Command::Help => self.inner.commands.help(commands::help()),
            Command::New => commands::new::answer(&item.thread_id),
            Command::Unknown(name) => self.inner.commands.help(&commands::help::unknown(&name)),
            Command::Status => self.status(item).await,
            Command::Tasks => {
                commands::tasks::answer(self.inner.store.as_ref(), &item.thread_id).await
            }
            Command::Skills(action) => {
                commands::skills::answer(
                    self.inner.store.as_ref(),
                    &self.inner.skills.current(),
                    item.event.user.admin,
                    action,
                )
                .await
            }
            Command::Memory(action) => {
                commands::memory::answer(
                    self.inner.store.as_ref(),
                    &self.inner.memory_identities,
                    &self.inner.memory_groups,
                    commands::memory::Asker {
                        channel: &item.event.channel,
                        user_id: &item.event.user.id,
                        in_group: item.event.group,
                    },
                    action,
                )
                .await
            }
            Command::Schedules(action) => {
                commands::schedules::answer(&self.inner.schedules, &item.event, action).await
            }
            // `plan` answers `/plan` itself, since it writes the thread; were it ever routed
            // here, the user would learn how to use it rather than nothing.
            Command::Plan(_) => commands::plan::USAGE.to_owned(),
            Command::Decide(decision) => {
                let decider = Decider {
                    key: Some(format!("{}:{}", item.event.channel, item.event.user.id)),
                    name: item.event.user.name.clone(),
                    admin: item.event.user.admin,
                };
                commands::approvals::decide(&self.inner.approvals, &decider, decision).await
            }
            Command::Approvals => {
                commands::approvals::list(
                    &self.inner.approvals,
                    item.event.conversation.as_str(),
                    item.event.user.admin,
                )
                .await
            }
            Command::Stop => {
                let stopped = self
                    .inner
                    .stops
                    .lock()
                    .is_ok_and(|mut stops| stops.remove(&item.seq));
                commands::stop::answer(stopped).to_owned()
            }
        }
    }

    async fn status(&self, item: &InboxItem) -> String {
        let inner = &self.inner;
        let thread = inner.store.thread(&item.thread_id).await.ok().flatten();
        let waiting = inner
            .queue
            .get()
            .and_then(std::sync::Weak::upgrade)
            .map_or(0, |q| q.waiting(item.event.conversation.as_str()));
        let backlog = inner.store.stats().await.map(|s| s.inbox).unwrap_or(0);
        commands::status::answer(&commands::status::Facts {
            thread_id: &item.thread_id,
            thread: thread.as_ref(),
            todo: &inner.todo,
            trace_url: inner.trace_url.as_deref(),
            model: inner.runtime.model_name(),
            waiting,
            backlog,
        })
    }
}

/// `a`, a blank line, then `b`; either alone when the other is empty.
fn join_text(a: &str, b: &str) -> String {
    match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, _) => b.to_owned(),
        (false, true) => a.to_owned(),
        (false, false) => format!("{a}\n\n{b}"),
    }
}

/// The last round's tool calls that have no result yet (held for an approval, or left by a
/// crash): the index of the message holding them, and each id.
fn held_calls(messages: &[ChatMessage]) -> Vec<(usize, String)> {
    unanswered_calls_at(messages)
        .map(|(position, calls)| {
            calls
                .into_iter()
                .map(|call| (position, call.id.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Ends a failed turn that started at message `start`: its user message (added if the run
/// never got to it), then the reply saying what went wrong, all marked failed.
fn record_failure(thread: &mut ThreadState, start: usize, user_text: &str, reply: &str) {
    if thread.messages.len() <= start {
        thread.messages.push(ChatMessage::user(user_text));
    }
    thread.messages.push(ChatMessage::assistant(reply));
    thread.fail_from(start);
    thread.running = None;
    thread.updated_at_ms = crate::now_ms();
}

/// The end of a turn's progress marks ([`TurnRunner::mark_progress`]).
struct ProgressMarks {
    end: oneshot::Sender<Progress>,
}

impl ProgressMarks {
    fn end(self, progress: Progress) {
        let _ = self.end.send(progress);
    }
}

/// A running agent turn's entry in the `/stop` table, removed when the turn ends however it
/// ends.
struct Registration<'a> {
    inner: &'a Inner,
    conversation: String,
    seq: u64,
}

impl<'a> Registration<'a> {
    fn new(inner: &'a Inner, item: &InboxItem, cancel: &CancellationToken) -> Self {
        let conversation = item.event.conversation.as_str().to_owned();
        if let Ok(mut running) = inner.running.lock() {
            running.insert(conversation.clone(), (item.seq, cancel.clone()));
        }
        Self {
            inner,
            conversation,
            seq: item.seq,
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Ok(mut running) = self.inner.running.lock() {
            if running
                .get(&self.conversation)
                .is_some_and(|(seq, _)| *seq == self.seq)
            {
                running.remove(&self.conversation);
            }
        }
    }
}

/// The finisher: takes every finished turn waiting at that moment and writes them in one
/// transaction (synced), then answers each; until every sender is gone. Turns finish in
/// parallel, so under load one transaction serves many of them; the next batch gathers while
/// one is written.
async fn finish_batches(
    store: Arc<dyn Store>,
    mut requests: mpsc::UnboundedReceiver<FinishRequest>,
) {
    let mut batch = Vec::new();
    while requests.recv_many(&mut batch, MAX_FINISH_BATCH).await > 0 {
        let (finishes, answers): (Vec<Arc<FinishTurn>>, Vec<_>) =
            std::mem::take(&mut batch).into_iter().unzip();
        metrics::histogram!("antler_finish_batch_size").record(finishes.len() as f64);
        let turns: Vec<&FinishTurn> = finishes.iter().map(AsRef::as_ref).collect();
        let written = std::panic::AssertUnwindSafe(store.finish_turns(&turns))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(StoreError::backend("writing finished turns panicked")));
        match written {
            Ok(items) => {
                for (answer, items) in answers.into_iter().zip(items) {
                    let _ = answer.send(Ok(items));
                }
            }
            Err(e) => {
                // Each turn retries on its own (or gives up, as the error says).
                for answer in answers {
                    let _ = answer.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The span of one turn: every line logged in it names the conversation, the channel, the
/// thread, the trace id (also in the run's hidden context) and the inbox number. In the
/// message's trace it is a child of the span that accepted the message.
fn turn_span(item: &InboxItem) -> tracing::Span {
    let span = tracing::info_span!(
        "turn",
        conversation = %item.event.conversation,
        channel = %item.event.channel,
        thread = %item.thread_id,
        trace = %item.trace.trace_hex(),
        seq = item.seq,
        attempt = item.attempts,
    );
    item.trace.adopt(&span);
    span
}
