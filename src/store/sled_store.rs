//! The [`Store`] on sled: one tree per collection, JSON values, big-endian sequence keys so
//! scans come back in arrival order.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use antler_channel::{OutboundMessage, Receipt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};

use super::group_commit::GroupCommit;
use super::{
    Accept, Accepted, ConversationRecord, FinishTurn, InboxItem, InboxStatus, OutboxItem,
    OutboxStatus, SCHEMA_VERSION, Store, StoreError, StoreStats, ThreadChoice, Transition,
};
use crate::agent::subagents::{SubagentRecord, SubagentStatus};
use crate::agent::thread::ThreadState;
use crate::memory::{MemoryDocument, MemoryUpdate};

const SCHEMA_KEY: &[u8] = b"schema_version";

/// What the dedupe set remembers about a key.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct DedupeEntry {
    expires_at_ms: u64,
    thread_id: String,
}

/// The sled-backed store.
#[derive(Clone)]
pub(crate) struct SledStore {
    db: sled::Db,
    conversations: sled::Tree,
    threads: sled::Tree,
    inbox: sled::Tree,
    /// The dedupe set in generations: keys accepted in `[start, start + ttl)` live in the
    /// tree `dedupe.<start>`. A lookup reads this generation and the previous one; the sweep
    /// drops whole generations once everything in them has expired, so forgetting keys costs
    /// neither a scan nor a write per message. The two open generations are cached here.
    dedupe_generations: Arc<Mutex<Option<DedupeGenerations>>>,
    outbox: sled::Tree,
    /// How many outbox items are still to deliver, counted once at open and kept in step
    /// after, so readiness checks never scan the sent items kept for inspection.
    outbox_pending: Arc<AtomicUsize>,
    #[allow(
        dead_code,
        reason = "read by the memory methods, which serve a later issue"
    )]
    memory: sled::Tree,
    memory_queue: sled::Tree,
    #[allow(
        dead_code,
        reason = "read by the subagent methods, which serve a later issue"
    )]
    subagents: sled::Tree,
    commit: GroupCommit,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").finish_non_exhaustive()
    }
}

fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Codec {
        what,
        detail: e.to_string(),
    })
}

fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Codec {
        what,
        detail: e.to_string(),
    })
}

/// Aborts a transaction with a store error.
fn abort<T>(e: StoreError) -> Result<T, ConflictableTransactionError<StoreError>> {
    Err(ConflictableTransactionError::Abort(e))
}

fn tx_encode<T: Serialize>(
    what: &'static str,
    value: &T,
) -> Result<Vec<u8>, ConflictableTransactionError<StoreError>> {
    encode(what, value).map_err(ConflictableTransactionError::Abort)
}

fn tx_decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, ConflictableTransactionError<StoreError>> {
    decode(what, bytes).map_err(ConflictableTransactionError::Abort)
}

fn from_tx(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => e.into(),
    }
}

fn new_thread_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

const DEDUPE_PREFIX: &str = "dedupe.";

/// The current and previous dedupe generations for one generation length.
#[derive(Clone)]
struct DedupeGenerations {
    ttl_ms: u64,
    start_ms: u64,
    current: sled::Tree,
    previous: sled::Tree,
}

impl SledStore {
    /// Opens (or creates) the store in `path`, checking the schema version.
    pub(crate) fn open(path: &Path) -> Result<Self, StoreError> {
        let db = sled::Config::new().path(path).open()?;
        Self::from_db(db, &path.display().to_string())
    }

    /// A store in a temporary directory that sled deletes on drop (tests).
    #[cfg(test)]
    pub(crate) fn temporary() -> Result<Self, StoreError> {
        let db = sled::Config::new().temporary(true).open()?;
        Self::from_db(db, "<temporary>")
    }

    fn from_db(db: sled::Db, path: &str) -> Result<Self, StoreError> {
        let meta = db.open_tree("meta")?;
        match meta.get(SCHEMA_KEY)? {
            Some(bytes) => {
                let found = <[u8; 4]>::try_from(bytes.as_ref())
                    .map(u32::from_be_bytes)
                    .map_err(|_| StoreError::Codec {
                        what: "schema version",
                        detail: format!("{} bytes", bytes.len()),
                    })?;
                if found > SCHEMA_VERSION {
                    return Err(StoreError::NewerSchema {
                        path: path.to_owned(),
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
            }
            None => {
                meta.insert(SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes())?;
                db.flush()?;
            }
        }
        let commit = GroupCommit::start(db.clone())?;
        let store = Self {
            conversations: db.open_tree("conversations")?,
            threads: db.open_tree("threads")?,
            inbox: db.open_tree("inbox")?,
            dedupe_generations: Arc::default(),
            outbox: db.open_tree("outbox")?,
            outbox_pending: Arc::new(AtomicUsize::new(0)),
            memory: db.open_tree("memory")?,
            memory_queue: db.open_tree("memory_queue")?,
            subagents: db.open_tree("subagents")?,
            db,
            commit,
        };
        let pending = Self::scan::<OutboxItem>(&store.outbox, "outbox item")?
            .iter()
            .filter(|item| item.status == OutboxStatus::Pending)
            .count();
        store.outbox_pending.store(pending, Ordering::SeqCst);
        Ok(store)
    }

    #[cfg(test)]
    pub(crate) fn write_schema_version(&self, version: u32) -> Result<(), StoreError> {
        self.db
            .open_tree("meta")?
            .insert(SCHEMA_KEY, &version.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    fn scan<T: DeserializeOwned>(
        tree: &sled::Tree,
        what: &'static str,
    ) -> Result<Vec<T>, StoreError> {
        tree.iter()
            .values()
            .map(|value| decode(what, &value?))
            .collect()
    }

    fn get<T: DeserializeOwned>(
        tree: &sled::Tree,
        what: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StoreError> {
        tree.get(key)?.map(|v| decode(what, &v)).transpose()
    }

    /// The dedupe generations a key accepted at `now_ms` is looked up in and written to.
    fn dedupe_generations(
        &self,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<DedupeGenerations, StoreError> {
        let ttl_ms = ttl_ms.max(1);
        let start_ms = now_ms - now_ms % ttl_ms;
        let mut cached = self
            .dedupe_generations
            .lock()
            .map_err(|_| StoreError::Backend("dedupe cache lock poisoned".to_owned()))?;
        if let Some(generations) = cached.as_ref() {
            if generations.ttl_ms == ttl_ms && generations.start_ms == start_ms {
                return Ok(generations.clone());
            }
        }
        let open = |start: u64| self.db.open_tree(format!("{DEDUPE_PREFIX}{start}"));
        let generations = DedupeGenerations {
            ttl_ms,
            start_ms,
            current: open(start_ms)?,
            previous: open(start_ms.saturating_sub(ttl_ms))?,
        };
        *cached = Some(generations.clone());
        Ok(generations)
    }

    /// Reads, changes and writes back one outbox record, keeping the pending count in step.
    fn update_outbox(
        &self,
        seq: u64,
        change: impl Fn(&mut OutboxItem),
    ) -> Result<OutboxItem, StoreError> {
        let key = seq_key(seq);
        let mut updated = None;
        let old = self.outbox.fetch_and_update(key, |old| {
            let mut item: OutboxItem = decode("outbox item", old?).ok()?;
            change(&mut item);
            let bytes = encode("outbox item", &item).ok()?;
            updated = Some(item);
            Some(bytes)
        })?;
        let item = updated.ok_or_else(|| StoreError::Missing {
            what: "outbox item",
            key: seq.to_string(),
        })?;
        let was_pending = old
            .and_then(|bytes| decode::<OutboxItem>("outbox item", &bytes).ok())
            .is_some_and(|old| old.status == OutboxStatus::Pending);
        if was_pending && item.status != OutboxStatus::Pending {
            self.outbox_pending.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(item)
    }
}

#[async_trait::async_trait]
impl Store for SledStore {
    async fn accept(&self, accept: Accept) -> Result<Accepted, StoreError> {
        let Accept {
            dedupe_key,
            dedupe_ttl_ms,
            event,
            thread,
            now_ms,
        } = accept;
        let conversation_key = event.conversation.as_str().to_owned();
        let user_id = format!("{}:{}", event.channel, event.user.id);
        let expires_at_ms = now_ms.saturating_add(dedupe_ttl_ms);
        let generations = self.dedupe_generations(now_ms, dedupe_ttl_ms)?;
        let outcome = (
            &generations.current,
            &generations.previous,
            &self.conversations,
            &self.inbox,
            &self.threads,
        )
            .transaction(|(dedupe, previous, conversations, inbox, threads)| {
                for generation in [dedupe, previous] {
                    if let Some(bytes) = generation.get(dedupe_key.as_bytes())? {
                        let seen: DedupeEntry = tx_decode("dedupe entry", &bytes)?;
                        if seen.expires_at_ms > now_ms {
                            return Ok(Accepted::Duplicate {
                                thread_id: seen.thread_id,
                            });
                        }
                    }
                }
                let current: Option<ConversationRecord> = conversations
                    .get(conversation_key.as_bytes())?
                    .map(|b| tx_decode("conversation", &b))
                    .transpose()?;
                let record = match (current, thread) {
                    (Some(record), ThreadChoice::Current) => record,
                    (current, _) => {
                        let record = ConversationRecord {
                            key: conversation_key.clone(),
                            generation: current.map_or(0, |r| r.generation + 1),
                            thread_id: new_thread_id(),
                            user_id: user_id.clone(),
                        };
                        // The thread exists from the moment it is named in an answer.
                        let state = ThreadState::new(
                            record.thread_id.clone(),
                            conversation_key.clone(),
                            record.generation,
                            now_ms,
                        );
                        threads
                            .insert(record.thread_id.as_bytes(), tx_encode("thread", &state)?)?;
                        record
                    }
                };
                conversations.insert(
                    conversation_key.as_bytes(),
                    tx_encode("conversation", &record)?,
                )?;
                let seq = inbox.generate_id()?;
                let item = InboxItem {
                    seq,
                    event: event.clone(),
                    thread_id: record.thread_id.clone(),
                    fresh_thread: thread == ThreadChoice::Fresh,
                    status: InboxStatus::Pending,
                    attempts: 0,
                    accepted_at_ms: now_ms,
                };
                inbox.insert(&seq_key(seq), tx_encode("inbox item", &item)?)?;
                let entry = DedupeEntry {
                    expires_at_ms,
                    thread_id: record.thread_id.clone(),
                };
                dedupe.insert(dedupe_key.as_bytes(), tx_encode("dedupe entry", &entry)?)?;
                Ok(Accepted::New(item))
            })
            .map_err(from_tx)?;
        // A duplicate is flushed too: its first delivery may still be waiting for its flush, and
        // acknowledging the redelivery must not get ahead of the data it stands for.
        self.commit.flush().await?;
        Ok(outcome)
    }

    async fn inbox(&self) -> Result<Vec<InboxItem>, StoreError> {
        Self::scan(&self.inbox, "inbox item")
    }

    async fn start_turn(&self, seq: u64) -> Result<InboxItem, StoreError> {
        let mut updated = None;
        self.inbox.fetch_and_update(seq_key(seq), |old| {
            let mut item: InboxItem = decode("inbox item", old?).ok()?;
            item.status = InboxStatus::Running;
            item.attempts += 1;
            let bytes = encode("inbox item", &item).ok()?;
            updated = Some(item);
            Some(bytes)
        })?;
        let item = updated.ok_or_else(|| StoreError::Missing {
            what: "inbox item",
            key: seq.to_string(),
        })?;
        self.commit.flush().await?;
        Ok(item)
    }

    async fn finish_turn(&self, finish: FinishTurn) -> Result<Vec<OutboxItem>, StoreError> {
        let FinishTurn {
            inbox_seq,
            thread,
            replies,
            memory_update,
            now_ms,
        } = finish;
        let thread_bytes = thread
            .as_ref()
            .map(|t| Ok::<_, StoreError>((t.id.clone(), encode("thread", t)?)))
            .transpose()?;
        let memory_bytes = memory_update
            .as_ref()
            .map(|m| Ok::<_, StoreError>((m.thread_id.clone(), encode("memory update", m)?)))
            .transpose()?;
        let items = (&self.inbox, &self.threads, &self.outbox, &self.memory_queue)
            .transaction(|(inbox, threads, outbox, memory_queue)| {
                inbox.remove(&seq_key(inbox_seq))?;
                if let Some((id, bytes)) = &thread_bytes {
                    threads.insert(id.as_bytes(), bytes.as_slice())?;
                }
                if let Some((thread_id, bytes)) = &memory_bytes {
                    memory_queue.insert(thread_id.as_bytes(), bytes.as_slice())?;
                }
                let mut items = Vec::with_capacity(replies.len());
                for message in &replies {
                    items.push(push_outbox(outbox, message.clone(), now_ms)?);
                }
                Ok(items)
            })
            .map_err(from_tx)?;
        self.outbox_pending.fetch_add(items.len(), Ordering::SeqCst);
        self.commit.flush().await?;
        Ok(items)
    }

    async fn checkpoint_thread(&self, thread: &ThreadState) -> Result<(), StoreError> {
        self.threads
            .insert(thread.id.as_bytes(), encode("thread", thread)?)?;
        self.commit.flush().await
    }

    async fn conversation(&self, key: &str) -> Result<Option<ConversationRecord>, StoreError> {
        Self::get(&self.conversations, "conversation", key.as_bytes())
    }

    async fn thread(&self, id: &str) -> Result<Option<ThreadState>, StoreError> {
        Self::get(&self.threads, "thread", id.as_bytes())
    }

    async fn outbox_pending(&self) -> Result<Vec<OutboxItem>, StoreError> {
        let all: Vec<OutboxItem> = Self::scan(&self.outbox, "outbox item")?;
        Ok(all
            .into_iter()
            .filter(|i| i.status == OutboxStatus::Pending)
            .collect())
    }

    async fn outbox_item(&self, seq: u64) -> Result<Option<OutboxItem>, StoreError> {
        Self::get(&self.outbox, "outbox item", &seq_key(seq))
    }

    async fn delivery_failed(
        &self,
        seq: u64,
        error: &str,
        give_up: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        let item = self.update_outbox(seq, |item| {
            item.attempts += 1;
            item.last_error = Some(error.to_owned());
            if give_up {
                item.status = OutboxStatus::Failed;
                item.finished_at_ms = Some(now_ms);
            }
        })?;
        if give_up {
            self.commit.flush().await?;
        }
        Ok(item)
    }

    async fn delivered(
        &self,
        seq: u64,
        receipt: Receipt,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        let item = self.update_outbox(seq, |item| {
            item.attempts += 1;
            item.status = OutboxStatus::Sent;
            item.receipt = Some(receipt.clone());
            item.finished_at_ms = Some(now_ms);
        })?;
        self.commit.flush().await?;
        Ok(item)
    }

    async fn sweep(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        // Dedupe generations whose every key has expired: keys of `dedupe.<start>` were
        // accepted before `start + ttl` and so expire before `start + 2 ttl`.
        let ttl_ms = retain_ms.max(1);
        for name in self.db.tree_names() {
            let Some(start) = std::str::from_utf8(&name)
                .ok()
                .and_then(|n| n.strip_prefix(DEDUPE_PREFIX))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if start.saturating_add(ttl_ms.saturating_mul(2)) <= now_ms {
                if let Ok(mut cached) = self.dedupe_generations.lock() {
                    // Never leave a dropped tree in the cache.
                    *cached = None;
                }
                if self.db.drop_tree(&name)? {
                    removed += 1;
                }
            }
        }
        // Finished outbox items past retention. Sequence order is creation order and an item
        // finishes after it is created, so nothing after the first too-young item can be due.
        let cutoff = now_ms.saturating_sub(retain_ms);
        for entry in self.outbox.iter() {
            let (key, value) = entry?;
            let item: OutboxItem = decode("outbox item", &value)?;
            if item.created_at_ms > cutoff {
                break;
            }
            let due = item.finished_at_ms.is_some_and(|t| t <= cutoff);
            if item.status != OutboxStatus::Pending && due {
                self.outbox.remove(&key)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        Ok(StoreStats {
            disk_bytes: self.db.size_on_disk()?,
            inbox: self.inbox.len(),
            outbox_pending: self.outbox_pending.load(Ordering::SeqCst),
            threads: self.threads.len(),
        })
    }

    async fn memory(&self, user_id: &str) -> Result<Option<MemoryDocument>, StoreError> {
        Self::get(&self.memory, "memory document", user_id.as_bytes())
    }

    async fn put_memory(&self, user_id: &str, doc: &MemoryDocument) -> Result<(), StoreError> {
        self.memory
            .insert(user_id.as_bytes(), encode("memory document", doc)?)?;
        self.commit.flush().await
    }

    async fn queue_memory_update(&self, update: MemoryUpdate) -> Result<(), StoreError> {
        self.memory_queue.insert(
            update.thread_id.as_bytes(),
            encode("memory update", &update)?,
        )?;
        self.commit.flush().await
    }

    async fn due_memory_updates(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<MemoryUpdate>, StoreError> {
        let mut due: Vec<MemoryUpdate> = Self::scan(&self.memory_queue, "memory update")?
            .into_iter()
            .filter(|u: &MemoryUpdate| u.due_at_ms <= now_ms)
            .collect();
        due.sort_by_key(|u| u.enqueued_at_ms);
        due.truncate(limit);
        Ok(due)
    }

    async fn remove_memory_update(
        &self,
        thread_id: &str,
        enqueued_at_ms: u64,
    ) -> Result<bool, StoreError> {
        let Some(current) = self.memory_queue.get(thread_id.as_bytes())? else {
            return Ok(false);
        };
        let update: MemoryUpdate = decode("memory update", &current)?;
        if update.enqueued_at_ms != enqueued_at_ms {
            return Ok(false);
        }
        let swapped = self.memory_queue.compare_and_swap(
            thread_id.as_bytes(),
            Some(&current),
            None as Option<&[u8]>,
        )?;
        Ok(swapped.is_ok())
    }

    async fn create_subagent(&self, record: &SubagentRecord) -> Result<(), StoreError> {
        self.subagents
            .insert(record.id.as_bytes(), encode("subagent", record)?)?;
        self.commit.flush().await
    }

    async fn subagent(&self, id: &str) -> Result<Option<SubagentRecord>, StoreError> {
        Self::get(&self.subagents, "subagent", id.as_bytes())
    }

    async fn transition_subagent(
        &self,
        id: &str,
        to: SubagentStatus,
        result: Option<String>,
        error: Option<String>,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let outcome = self
            .subagents
            .transaction(|tree| {
                let Some(bytes) = tree.get(id.as_bytes())? else {
                    return abort(StoreError::Missing {
                        what: "subagent",
                        key: id.to_owned(),
                    });
                };
                let mut record: SubagentRecord = tx_decode("subagent", &bytes)?;
                if !record.status.can_become(to) {
                    return Ok(Transition::Refused(record));
                }
                record.status = to;
                if to.is_terminal() {
                    record.result.clone_from(&result);
                    record.error.clone_from(&error);
                    record.finished_at_ms = Some(now_ms);
                }
                tree.insert(id.as_bytes(), tx_encode("subagent", &record)?)?;
                Ok(Transition::Applied(record))
            })
            .map_err(from_tx)?;
        if matches!(outcome, Transition::Applied(_)) {
            self.commit.flush().await?;
        }
        Ok(outcome)
    }

    async fn fail_unfinished_subagents(
        &self,
        reason: &str,
        now_ms: u64,
    ) -> Result<usize, StoreError> {
        let records: Vec<SubagentRecord> = Self::scan(&self.subagents, "subagent")?;
        let mut failed = 0;
        for record in records.into_iter().filter(|r| !r.status.is_terminal()) {
            let outcome = self
                .transition_subagent(
                    &record.id,
                    SubagentStatus::Failed,
                    None,
                    Some(reason.to_owned()),
                    now_ms,
                )
                .await?;
            if matches!(outcome, Transition::Applied(_)) {
                failed += 1;
            }
        }
        Ok(failed)
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.commit.flush().await
    }
}

fn push_outbox(
    outbox: &TransactionalTree,
    message: OutboundMessage,
    now_ms: u64,
) -> Result<OutboxItem, ConflictableTransactionError<StoreError>> {
    let seq = outbox.generate_id()?;
    let item = OutboxItem {
        seq,
        message,
        status: OutboxStatus::Pending,
        attempts: 0,
        last_error: None,
        receipt: None,
        created_at_ms: now_ms,
        finished_at_ms: None,
    };
    outbox.insert(&seq_key(seq), tx_encode("outbox item", &item)?)?;
    Ok(item)
}

#[cfg(test)]
mod tests;
