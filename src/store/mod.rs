//! Durable state behind one trait: conversations, threads, the inbox, the dedupe set, the
//! outbox, memory documents, the memory update queue, the subagent registry, the skill
//! switches, DM pairing (pending codes, approved users) and schedules.
//!
//! Each method that changes more than one collection is one transaction, so a crash leaves
//! the state before or the state after, never half (docs/architecture.md, "Crash safety").
//! Every write is durable when it returns: the change is on disk (written and `fdatasync`ed
//! by sled; committed by a database). How a backend makes that cheap is its own detail (sled:
//! concurrent writers share one sync, see `group_commit`).
//!
//! Keys made of several parts are tuple-encoded (`keys`), never joined with a separator, so no
//! two different tuples can meet in one key.

pub(crate) mod copy;
mod group_commit;
mod keys;
mod pg_store;
mod records;
mod replicas;
mod rules;
mod sled_store;

#[cfg(test)]
pub(crate) mod conformance;
#[cfg(test)]
pub(crate) mod faulty;
#[cfg(test)]
mod mem_store;

#[cfg(test)]
pub(crate) use mem_store::MemStore;
pub(crate) use pg_store::{PgOptions, PgStore, mask_url as mask_pg_url};
pub(crate) use replicas::{Adopted, Held, ReplicaStore};
pub(crate) use sled_store::SledStore;

use std::collections::BTreeMap;
use std::sync::Arc;

use antler_channel::{ChatMove, InboundEvent, OutboundMessage, Receipt};
use serde::{Deserialize, Serialize};

use crate::agent::approvals::{ApprovalRecord, ApprovalState, Opened};
use crate::agent::memory::{MemoryDocument, MemoryDocuments, MemoryUpdate};
use crate::agent::skills::SkillSwitches;
use crate::agent::subagents::{
    RegistryError, SubagentChange, SubagentRecord, SubagentRegistry, Transition,
};
use crate::agent::thread::ThreadState;
use crate::telemetry::TraceContext;

/// The store layout version this build writes. Bump it when a stored type changes
/// incompatibly, and teach `SledStore::open` to migrate.
pub(crate) const SCHEMA_VERSION: u32 = 3;

/// The cause an error of a backend keeps (shared, so an error can answer several waiters).
pub(crate) type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// The errors of the store boundary. [`StoreError::is_retryable`] says which a caller may
/// try again: the turn runner waits out an unavailable store and fails fast on the rest.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum StoreError {
    /// The backend cannot do it now (I/O, its sync thread, a lock): trying again may succeed.
    #[error("store unavailable: {0}")]
    Unavailable(#[source] Cause),
    /// Concurrent writers kept changing the record for longer than the write retries.
    #[error("store conflict: {0}")]
    Conflict(String),
    /// The backend failed in a way that trying again does not mend (corruption, a bug).
    #[error("store: {0}")]
    Backend(#[source] Cause),
    /// A stored record could not be decoded.
    #[error("store: cannot decode {what}: {detail}")]
    Codec { what: &'static str, detail: String },
    /// The request breaks a limit of the store (too many replies to one message).
    #[error("store: {0}")]
    Invalid(String),
    /// The store was written by a newer antler.
    #[error(
        "store at {path} has schema version {found}, but this antler supports at most {supported}; \
         run a newer antler or point [store] path elsewhere"
    )]
    NewerSchema {
        path: String,
        found: u32,
        supported: u32,
    },
    /// A record that must exist does not.
    #[error("store: no {what} {key}")]
    Missing { what: &'static str, key: String },
    /// Another process holds the store's lock.
    #[error("another antler is using the store at {path} (one process per store)")]
    InUse { path: String },
    /// Another owner's lease on the store's work is live.
    #[error(
        "another antler ({owner}) holds the store's lease for {remaining_ms} ms more; \
         one antler works on a store at a time"
    )]
    Leased { owner: String, remaining_ms: u64 },
    /// This owner's lease is gone: another owner took it (or it was given up).
    #[error("the store's lease is no longer ours ({holder} holds it); stop working on it")]
    LeaseLost { holder: String },
    /// This replica does not hold the conversation (any more): another replica runs it.
    #[error("conversation {conversation} is held by another replica")]
    NotHeld { conversation: String },
}

impl StoreError {
    /// An unavailable store, with what happened.
    pub(crate) fn unavailable(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unavailable(Arc::from(cause.into()))
    }

    /// A backend failure that trying again does not mend, with what happened.
    pub(crate) fn backend(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Backend(Arc::from(cause.into()))
    }

    /// Whether the same call may succeed if made again (the store comes back, the other
    /// writers stop); the rest fail the same way every time.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Conflict(_))
    }
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        match e {
            // The disk or the file system: it may come back (space freed, a device remounted).
            sled::Error::Io(_) => Self::unavailable(e),
            _ => Self::backend(e),
        }
    }
}

/// Where a conversation stands: its current thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ConversationRecord {
    pub(crate) key: String,
    /// Incremented by `/new`.
    pub(crate) generation: u64,
    /// The current thread's id.
    pub(crate) thread_id: String,
    /// The user who started the current thread.
    pub(crate) user_id: String,
    /// The platform chat this conversation continues (a group upgraded to a supergroup): the
    /// allowlists that name that chat name this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) moved_from_chat: Option<String>,
}

/// What to do with the conversation when accepting an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThreadChoice {
    /// Use the current thread (create the conversation if it is new).
    Current,
    /// Start a fresh thread (`/new`): the next generation, history kept under the old id.
    Fresh,
}

/// A request to accept an inbound event. Its dedupe key is the pair (conversation, event id).
#[derive(Debug, Clone)]
pub(crate) struct Accept {
    /// How long the event id is remembered.
    pub(crate) dedupe_ttl_ms: u64,
    /// The message's trace, begun by the span that accepts it.
    pub(crate) trace: TraceContext,
    pub(crate) event: InboundEvent,
    pub(crate) thread: ThreadChoice,
    pub(crate) now_ms: u64,
}

/// The outcome of [`Store::accept`].
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one short-lived value per accepted event; boxing would add an allocation to every accept"
)]
pub(crate) enum Accepted {
    /// Stored and flushed: it will run.
    New(InboxItem),
    /// Seen before (within the dedupe TTL): nothing stored.
    Duplicate {
        thread_id: String,
        /// The inbox item of the first delivery (unknown for keys stored before schema 2).
        seq: Option<u64>,
    },
}

/// An inbox item's place in its life. Finished items are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum InboxStatus {
    Pending,
    Running,
}

/// An accepted event waiting for (or in) its turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct InboxItem {
    /// Arrival order, unique for the store's lifetime.
    pub(crate) seq: u64,
    pub(crate) event: InboundEvent,
    /// The thread it was accepted into.
    pub(crate) thread_id: String,
    /// Whether this item started a fresh thread (`/new`).
    pub(crate) fresh_thread: bool,
    pub(crate) status: InboxStatus,
    /// Turns started for it and cut short by a crash, the one running now included. A turn
    /// interrupted by a clean shutdown gives its attempt back.
    pub(crate) attempts: u32,
    pub(crate) accepted_at_ms: u64,
    /// The message's trace: its turn's span and its replies' delivery spans are children of
    /// the span that accepted it. (Its `trace_hex` is the trace id people see.)
    #[serde(default = "TraceContext::fresh")]
    pub(crate) trace: TraceContext,
    /// The draft message a live reply is being written into, saved as soon as the platform
    /// created it: a re-run after a crash writes into it again, and the answer replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) draft: Option<Receipt>,
}

/// An outbox item's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OutboxStatus {
    Pending,
    Sent,
    /// Given up after the last attempt; kept for inspection.
    Failed,
}

/// One reply to deliver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct OutboxItem {
    /// The inbox item that produced it and its place among that item's replies, packed by
    /// [`outbox_seq`]: replies sort in arrival order of what they answer, and the replies to
    /// one message are found without an index.
    pub(crate) seq: u64,
    /// The trace of the message it answers: delivery attempts are spans in it.
    #[serde(default = "TraceContext::fresh")]
    pub(crate) trace: TraceContext,
    pub(crate) message: OutboundMessage,
    pub(crate) status: OutboxStatus,
    pub(crate) attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_error: Option<String>,
    /// The first part's receipt, once every part was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) receipt: Option<Receipt>,
    /// The parts sent so far (the channel renders a reply into one or more messages), so a
    /// retry goes on from the first part not sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) parts: Vec<Receipt>,
    /// The turn's draft message (live replies): the first part is edited into it rather than
    /// sent anew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) draft: Option<Receipt>,
    pub(crate) created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) finished_at_ms: Option<u64>,
}

/// Replies one inbox item may produce.
pub(crate) const MAX_REPLIES_PER_ITEM: u64 = 1 << 16;

/// The outbox key of reply `index` to inbox item `inbox_seq`.
pub(crate) fn outbox_seq(inbox_seq: u64, index: u64) -> Option<u64> {
    if index >= MAX_REPLIES_PER_ITEM {
        return None;
    }
    inbox_seq
        .checked_mul(MAX_REPLIES_PER_ITEM)
        .and_then(|base| base.checked_add(index))
}

/// A finished turn: everything written together.
#[derive(Debug, Clone)]
pub(crate) struct FinishTurn {
    pub(crate) inbox_seq: u64,
    /// The answered message's trace, which its replies carry.
    pub(crate) trace: TraceContext,
    /// The thread after the turn (None: unchanged, e.g. a command that touches no thread).
    /// Only its messages past `saved_messages` are written.
    pub(crate) thread: Option<ThreadState>,
    /// Replies to deliver, in order.
    pub(crate) replies: Vec<OutboundMessage>,
    /// A memory update to queue with the turn, if any.
    pub(crate) memory_update: Option<MemoryUpdate>,
    /// The turn's draft message, which the first reply replaces.
    pub(crate) draft: Option<Receipt>,
    /// Other inbox items the turn answered with this one (the rest of an album), removed with
    /// it; they get no reply of their own.
    pub(crate) absorbed: Vec<u64>,
    pub(crate) now_ms: u64,
}

/// What [`MemoryStore::clear_memory`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClearedMemory {
    /// Whether there was a document.
    pub(crate) document: bool,
    /// Queued updates dropped.
    pub(crate) updates: usize,
}

/// Who does the store's work: one owner at a time, until its lease ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub(crate) owner: String,
    pub(crate) until_ms: u64,
    /// Given up by a clean stop: the next owner need not wait for it to end.
    pub(crate) released: bool,
}

/// How the previous owner of the store's work left it, as [`LeaseStore::claim`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Nobody held it before.
    First,
    /// The previous owner stopped cleanly and gave it up.
    Released { owner: String },
    /// The previous owner's lease ran out, or its process is gone (it stopped unexpectedly):
    /// what it left unfinished is unfinished for good.
    Expired { owner: String },
    /// This owner held it already (a second claim renews it).
    Held,
}

/// Counts for `/status`, `/readyz` and metrics, kept up to date as records change, so
/// reading them never scans a collection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StoreStats {
    /// Bytes the store occupies on disk.
    pub(crate) disk_bytes: u64,
    pub(crate) inbox: usize,
    /// When the oldest item still in the inbox was accepted: how long work has waited.
    pub(crate) oldest_inbox_at_ms: Option<u64>,
    pub(crate) outbox_pending: usize,
}

/// The inbox: accepting events (with dedupe), turns starting, ending and giving back their attempt, and the running turn's draft.
#[async_trait::async_trait]
pub(crate) trait InboxStore: Send + Sync + std::fmt::Debug {
    /// For each event in order: dedupe key + conversation + inbox item, all in one
    /// transaction (a later event sees what an earlier one wrote, so a redelivery inside the
    /// batch is recognised). *Durable.* One transaction and one sync for many events is what
    /// makes accepting cheap. On an error nothing of the batch may be acknowledged; what the
    /// store kept anyway (its sync failed after the write) is in the inbox, in order, and a
    /// redelivery of it is a duplicate.
    async fn accept_batch(&self, accepts: Vec<Accept>) -> Result<Vec<Accepted>, StoreError>;
    /// [`InboxStore::accept_batch`] of one event.
    #[allow(dead_code, reason = "the contract's; only tests use it in this build")]
    async fn accept(&self, accept: Accept) -> Result<Accepted, StoreError> {
        self.accept_batch(vec![accept])
            .await?
            .pop()
            .ok_or_else(|| StoreError::backend("an accept batch came back empty"))
    }
    /// Inbox items not yet finished, in arrival order.
    async fn inbox(&self) -> Result<Vec<InboxItem>, StoreError>;
    /// Marks an item running and counts the attempt. *Durable*, so a message that crashes the
    /// process every time is recognised after a few restarts.
    async fn start_turn(&self, seq: u64) -> Result<InboxItem, StoreError>;
    /// Gives back the attempt of a turn interrupted on purpose (shutdown): the item is pending
    /// again and the interruption does not count towards giving up on it. *Durable.*
    async fn release_turn(&self, seq: u64) -> Result<(), StoreError>;
    /// For each finished turn: thread (metadata + new messages) + replies into the outbox +
    /// the inbox item removed (+ a memory update); all of them in one transaction. *Durable.*
    /// Returns each turn's new outbox items. Like accepts, finishes are batched because each
    /// transaction costs the store a log write of its own.
    /// The turns are borrowed, so a caller can retry with the same one after a failure.
    async fn finish_turns(
        &self,
        finishes: &[&FinishTurn],
    ) -> Result<Vec<Vec<OutboxItem>>, StoreError>;
    /// [`InboxStore::finish_turns`] of one turn.
    #[allow(dead_code, reason = "the contract's; only tests use it in this build")]
    async fn finish_turn(&self, finish: FinishTurn) -> Result<Vec<OutboxItem>, StoreError> {
        self.finish_turns(&[&finish])
            .await?
            .pop()
            .ok_or_else(|| StoreError::backend("a finish batch came back empty"))
    }
    /// Saves the draft message of the running turn of inbox item `seq`. *Durable.*
    async fn save_draft(&self, seq: u64, draft: &Receipt) -> Result<(), StoreError>;
}

/// Conversations and their threads.
#[async_trait::async_trait]
pub(crate) trait ThreadStore: Send + Sync + std::fmt::Debug {
    /// Saves a thread mid-turn (after a tool result): its metadata and the messages not yet
    /// saved, then advances `saved_messages`. *Durable.*
    async fn checkpoint_thread(&self, thread: &mut ThreadState) -> Result<(), StoreError>;
    async fn conversation(&self, key: &str) -> Result<Option<ConversationRecord>, StoreError>;
    /// Moves a conversation to the chat that continues it ([`rules::moved_conversation`]):
    /// the new conversation goes on with the old one's thread and remembers the old chat.
    /// Doing it again changes nothing. *Durable.*
    async fn move_conversation(&self, chat_move: &ChatMove) -> Result<(), StoreError>;
    /// The thread with all its messages.
    async fn thread(&self, id: &str) -> Result<Option<ThreadState>, StoreError>;
    /// Up to `limit` conversations in key order, starting after the key `after` (the admin
    /// page's listing).
    async fn conversations(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ConversationRecord>, StoreError>;
}

/// The outbox: replies waiting for delivery, and what became of each attempt.
#[async_trait::async_trait]
pub(crate) trait OutboxStore: Send + Sync + std::fmt::Debug {
    /// Outbox items still to deliver, in order.
    async fn outbox_pending(&self) -> Result<Vec<OutboxItem>, StoreError>;
    #[allow(dead_code, reason = "the contract's; only tests use it in this build")]
    async fn outbox_item(&self, seq: u64) -> Result<Option<OutboxItem>, StoreError>;
    /// The replies produced for one inbox item (any delivery status), in order.
    async fn replies(&self, inbox_seq: u64) -> Result<Vec<OutboxItem>, StoreError>;
    /// Records a failed attempt; `give_up` marks the item failed for good.
    async fn delivery_failed(
        &self,
        seq: u64,
        error: &str,
        give_up: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError>;
    /// Records the next part of an item as sent, with its receipt; `complete` (it was the last
    /// part) marks the item sent, its receipt the first part's. *Durable.*
    async fn part_delivered(
        &self,
        seq: u64,
        receipt: Receipt,
        complete: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError>;
    /// The newest `limit` outbox items, any status, newest first (the admin page's listing).
    async fn outbox_recent(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError>;
    /// An item given up on is pending again, with its attempts counted afresh (an operator
    /// retries it). An item in any other state is answered unchanged. *Durable.*
    async fn requeue_delivery(&self, seq: u64) -> Result<OutboxItem, StoreError>;
}

/// Users' long-term memory documents.
#[async_trait::async_trait]
pub(crate) trait MemoryStore: Send + Sync + std::fmt::Debug {
    async fn memory(&self, user_id: &str) -> Result<Option<MemoryDocument>, StoreError>;
    /// *Durable.*
    #[allow(dead_code, reason = "the contract's; only tests use it in this build")]
    async fn put_memory(&self, user_id: &str, doc: &MemoryDocument) -> Result<(), StoreError>;
    /// Changes the memory document of `user_key` atomically (compare and swap): `change` gets
    /// the stored document (`None`: there is none) and returns the one to store (`None`:
    /// delete it). When another writer (the updater, a command, the API) changed the document
    /// between the read and the write, `change` runs again on the newer document, so it may
    /// be called more than once and must do nothing else. *Durable.* Returns what was stored.
    async fn update_memory(
        &self,
        user_key: &str,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> Option<MemoryDocument> + Send),
    ) -> Result<Option<MemoryDocument>, StoreError>;
    /// Forgets a user: deletes the document of `user_key` and drops every queued update whose
    /// `user_id` is one of `queued_for`, in one transaction, so no update waiting in the queue
    /// brings anything back. *Durable.* An update already taken from the queue (its model
    /// call under way) cannot write afterwards: [`MemoryQueueStore::apply_memory_update`] finds its entry
    /// gone.
    async fn clear_memory(
        &self,
        user_key: &str,
        queued_for: &[String],
    ) -> Result<ClearedMemory, StoreError>;
    /// The user keys that have a document, in key order: those after `after` (exclusive), at
    /// most `limit`. Reads only keys within the page, never every document.
    async fn memory_keys(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;
}

/// The memory update queue, whose processed entries rewrite documents.
#[async_trait::async_trait]
pub(crate) trait MemoryQueueStore: MemoryStore {
    /// Queues an update; a newer one for the same (user, thread) replaces it. *Durable.*
    #[allow(dead_code, reason = "the contract's; only tests use it in this build")]
    async fn queue_memory_update(&self, update: MemoryUpdate) -> Result<(), StoreError>;
    /// Queued updates whose debounce window has ended, oldest first.
    async fn due_memory_updates(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<MemoryUpdate>, StoreError>;
    /// Removes a processed update unless a newer one for its (user, thread) replaced it
    /// meanwhile; says whether it removed it.
    async fn remove_memory_update(&self, processed: &MemoryUpdate) -> Result<bool, StoreError>;
    /// Applies the updater's answer to a queued update: if `processed` is still queued as it
    /// was read (not replaced by a newer context, not dropped by [`MemoryStore::clear_memory`]),
    /// `change` rewrites the document of its `user_id` and the entry is removed, in one
    /// transaction; otherwise nothing is written and `None` is returned. So a user who is
    /// forgotten while the model is answering stays forgotten. *Durable.*
    async fn apply_memory_update(
        &self,
        processed: &MemoryUpdate,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> MemoryDocument + Send),
    ) -> Result<Option<MemoryDocument>, StoreError>;
}

/// The subagent registry: tasks and their state machine.
#[async_trait::async_trait]
pub(crate) trait SubagentStore: Send + Sync + std::fmt::Debug {
    /// Records a new task and indexes it by its parent's tool call. *Durable.*
    async fn create_subagent(&self, record: &SubagentRecord) -> Result<(), StoreError>;
    async fn subagent(&self, id: &str) -> Result<Option<SubagentRecord>, StoreError>;
    /// The task that tool call `call_id` of the turn of inbox item `turn` started, if any.
    async fn subagent_for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, StoreError>;
    /// The thread's most recent tasks (at most `limit`), newest first.
    async fn thread_subagents(
        &self,
        thread_id: &str,
        limit: usize,
    ) -> Result<Vec<SubagentRecord>, StoreError>;
    /// Moves a record along its state machine; the first terminal write wins. *Durable.*
    async fn transition_subagent(
        &self,
        id: &str,
        change: &SubagentChange,
    ) -> Result<Transition, StoreError>;
    /// After a restart: records left PENDING or RUNNING become FAILED with `reason`.
    async fn fail_unfinished_subagents(
        &self,
        reason: &str,
        now_ms: u64,
    ) -> Result<usize, StoreError>;
}

/// Keeping the store small and observable.
#[async_trait::async_trait]
pub(crate) trait MaintenanceStore: Send + Sync + std::fmt::Debug {
    /// Forgets expired dedupe keys (`retain_ms` is also the dedupe TTL) and finished outbox
    /// items older than `retain_ms`; returns how many outbox items and dedupe generations went.
    async fn sweep(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError>;
    async fn stats(&self) -> Result<StoreStats, StoreError>;
}

/// The lease on the store's work: which process runs turns, deliveries and subagents from
/// it. What a previous owner left unfinished (running subagents) is failed only once its
/// lease is gone, never while it may still be working. With sled the store's file lock
/// already keeps other processes out, so a claim always succeeds and only tells how the last
/// owner left.
#[async_trait::async_trait]
pub(crate) trait LeaseStore: Send + Sync + std::fmt::Debug {
    /// Takes the lease for `owner` until `until_ms`, unless another owner's lease is live at
    /// `now_ms` ([`StoreError::Leased`]). *Durable.*
    async fn claim(&self, owner: &str, now_ms: u64, until_ms: u64) -> Result<Claimed, StoreError>;
    /// Extends `owner`'s lease to `until_ms`. [`StoreError::LeaseLost`] if it is not `owner`'s
    /// any more: another owner took it, and this one must stop working. *Durable.*
    async fn renew(&self, owner: &str, until_ms: u64) -> Result<(), StoreError>;
    /// Gives `owner`'s lease up (a clean stop); nothing if it is not `owner`'s. *Durable.*
    async fn release(&self, owner: &str) -> Result<(), StoreError>;
}

/// Which skills an admin turned on or off (`/skills`, the skills API). One store serves one
/// deployment, so the switches are the deployment's; a skill without a switch is on.
#[async_trait::async_trait]
pub(crate) trait SkillStore: Send + Sync + std::fmt::Debug {
    /// Every switch set so far, by skill name (`true`: on).
    async fn skill_switches(&self) -> Result<BTreeMap<String, bool>, StoreError>;
    /// Turns the skill `name` on or off. *Durable.*
    async fn set_skill_switch(&self, name: &str, on: bool) -> Result<(), StoreError>;
}

/// A pending DM pairing request: an unknown user who wrote to the bot privately, and the code
/// they were given to hand to an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PairingRequest {
    pub(crate) channel: String,
    pub(crate) user_id: String,
    /// The display name the platform gave, if any (for `antler pairing list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    pub(crate) code: String,
    pub(crate) created_at_ms: u64,
}

/// A user an operator approved through pairing: allowed on their channel like an
/// `allowed_users` entry (and an admin with `admin`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PairedUser {
    pub(crate) channel: String,
    pub(crate) user_id: String,
    pub(crate) admin: bool,
    pub(crate) approved_at_ms: u64,
}

/// DM pairing: pending requests (few: the pairing module caps them) and approved users. The
/// rules (codes, expiry, the cap) live in the ingress's pairing module; the store keeps what they decide.
#[async_trait::async_trait]
pub(crate) trait PairingStore: Send + Sync + std::fmt::Debug {
    /// Every pending request, in (channel, user) order.
    async fn pairing_requests(&self) -> Result<Vec<PairingRequest>, StoreError>;
    /// Stores `request`, replacing that user's, and removes the requests of the (channel,
    /// user) pairs in `dropped`, in one transaction. *Durable.*
    async fn put_pairing_request(
        &self,
        request: &PairingRequest,
        dropped: &[(String, String)],
    ) -> Result<(), StoreError>;
    /// Removes the request of (`channel`, `user_id`) and, with `paired`, records that user as
    /// approved, in one transaction. Returns whether there was a request. *Durable.*
    async fn settle_pairing(
        &self,
        channel: &str,
        user_id: &str,
        paired: Option<&PairedUser>,
    ) -> Result<bool, StoreError>;
    /// Every approved user, in (channel, user) order.
    async fn paired_users(&self) -> Result<Vec<PairedUser>, StoreError>;
}

/// A schedule made in chat (`/schedule add`): what to send, when and where. Config schedules
/// are read at start and never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScheduleRecord {
    pub(crate) name: String,
    /// When it fires, as written: a cron expression or `every 15m`.
    pub(crate) when: String,
    /// The IANA time zone a cron expression is read in.
    pub(crate) timezone: String,
    /// The conversation its firings go to.
    pub(crate) conversation: String,
    pub(crate) prompt: String,
    /// Who made it (`<channel>:<user id>`).
    pub(crate) created_by: String,
    pub(crate) created_at_ms: u64,
}

/// What [`ScheduleStore::add_schedule`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddedSchedule {
    Added,
    /// A schedule of that name is stored already; nothing changed.
    Exists,
    /// `limit` schedules are stored already; nothing changed.
    Full,
}

/// Chat-made schedules, and how far each schedule's firings (config ones too) were enqueued.
#[async_trait::async_trait]
pub(crate) trait ScheduleStore: Send + Sync + std::fmt::Debug {
    /// Every chat-made schedule, in name order.
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError>;
    /// Stores `record` unless its name is taken or `limit` schedules are stored. *Durable.*
    async fn add_schedule(
        &self,
        record: &ScheduleRecord,
        limit: usize,
    ) -> Result<AddedSchedule, StoreError>;
    /// Removes the chat-made schedule `name` and its mark; says whether there was one. *Durable.*
    async fn remove_schedule(&self, name: &str) -> Result<bool, StoreError>;
    /// Each schedule's mark: the fire time (ms) up to which its firings were enqueued.
    async fn schedule_marks(&self) -> Result<BTreeMap<String, u64>, StoreError>;
    /// Sets the mark of schedule `name`. *Durable.*
    async fn set_schedule_mark(&self, name: &str, fire_ms: u64) -> Result<(), StoreError>;
}

/// A decision on a pending approval, for [`ApprovalStore::decide_approval`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApprovalDecision {
    /// Approved, denied, expired or withdrawn (never pending).
    pub(crate) state: ApprovalState,
    pub(crate) by: String,
    pub(crate) reason: Option<String>,
    pub(crate) at_ms: u64,
}

/// What [`ApprovalStore::decide_approval`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decided {
    /// This decision was stored: the record as it is now.
    Now(ApprovalRecord),
    /// An earlier decision stands; nothing changed.
    Before(ApprovalRecord),
}

/// Tool calls waiting for a person (`[approvals]`), each decided once.
#[async_trait::async_trait]
pub(crate) trait ApprovalStore: Send + Sync + std::fmt::Debug {
    /// Stores a pending approval unless its (thread, call key) has one, or its conversation holds
    /// `max_pending` pending ones already. *Durable.*
    async fn open_approval(
        &self,
        record: &ApprovalRecord,
        max_pending: usize,
    ) -> Result<Opened, StoreError>;
    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError>;
    /// The approval of a thread's call, by its key (`approval::call_key`).
    async fn approval_for_call(
        &self,
        thread_id: &str,
        call_key: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError>;
    /// Approvals still to act on: pending, or decided with their resume not yet queued.
    async fn open_approvals(&self) -> Result<Vec<ApprovalRecord>, StoreError>;
    /// Decides a pending approval (compare and set): the first decision wins, a later one
    /// changes nothing. *Durable.*
    async fn decide_approval(
        &self,
        id: &str,
        decision: &ApprovalDecision,
    ) -> Result<Decided, StoreError>;
    /// Records that the decision's resume item is in the inbox. *Durable.*
    async fn approval_queued(&self, id: &str) -> Result<(), StoreError>;
}

/// The whole store, one value for the wiring; each consumer takes only the part it uses.
pub(crate) trait Store:
    InboxStore
    + ThreadStore
    + OutboxStore
    + MemoryQueueStore
    + SubagentStore
    + MaintenanceStore
    + LeaseStore
    + ReplicaStore
    + SkillStore
    + PairingStore
    + ScheduleStore
    + ApprovalStore
    + std::fmt::Debug
{
}

impl<T> Store for T where
    T: InboxStore
        + ThreadStore
        + OutboxStore
        + MemoryQueueStore
        + SubagentStore
        + MaintenanceStore
        + LeaseStore
        + ReplicaStore
        + SkillStore
        + PairingStore
        + ScheduleStore
        + ApprovalStore
        + std::fmt::Debug
{
}

/// The subagent registry of the agent, kept in the store.
#[derive(Debug, Clone)]
pub(crate) struct StoreRegistry(pub(crate) Arc<dyn SubagentStore>);

#[async_trait::async_trait]
impl SubagentRegistry for StoreRegistry {
    async fn create(&self, record: &SubagentRecord) -> Result<(), RegistryError> {
        self.0.create_subagent(record).await.map_err(registry_error)
    }

    async fn get(&self, id: &str) -> Result<Option<SubagentRecord>, RegistryError> {
        self.0.subagent(id).await.map_err(registry_error)
    }

    async fn for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, RegistryError> {
        self.0
            .subagent_for_call(thread_id, turn, call_id)
            .await
            .map_err(registry_error)
    }

    async fn transition(
        &self,
        id: &str,
        change: &SubagentChange,
    ) -> Result<Transition, RegistryError> {
        self.0
            .transition_subagent(id, change)
            .await
            .map_err(registry_error)
    }
}

fn registry_error(e: StoreError) -> RegistryError {
    RegistryError(e.to_string())
}

/// The agent's [`SkillSwitches`], read from the store.
#[derive(Debug, Clone)]
pub(crate) struct StoreSkillSwitches(pub(crate) Arc<dyn SkillStore>);

#[async_trait::async_trait]
impl SkillSwitches for StoreSkillSwitches {
    async fn switches(&self) -> Result<BTreeMap<String, bool>, String> {
        self.0.skill_switches().await.map_err(|e| e.to_string())
    }
}

/// The agent's [`MemoryDocuments`], read from the store.
pub(crate) struct StoreDocuments(pub(crate) Arc<dyn MemoryStore>);

#[async_trait::async_trait]
impl MemoryDocuments for StoreDocuments {
    async fn document(&self, key: &str) -> Result<Option<MemoryDocument>, String> {
        self.0.memory(key).await.map_err(|e| e.to_string())
    }
}
