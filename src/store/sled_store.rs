//! The [`Store`] on sled: one tree per collection, big-endian sequence keys so scans come
//! back in arrival order, tuple-encoded keys (`keys`) where a key has several parts. The
//! records written with every message are the store's own (`records`: a format byte, then
//! postcard); the rest are JSON.
//!
//! | tree | key | value |
//! |---|---|---|
//! | `meta` | `schema_version`, `lease` | layout version (u32), [`Lease`] |
//! | `conversations` | conversation key | [`ConversationRecord`] |
//! | `threads` | thread id | thread metadata ([`ThreadState`] without messages) |
//! | `messages` | (thread id) + index | one [`ChatMessage`] record |
//! | `inbox` | seq | an [`InboxItem`] record |
//! | `outbox2` | [`super::outbox_seq`] | an [`OutboxItem`] record |
//! | `dedupe.<start>.<length>` | (conversation, event id) | a `DedupeEntry` record |
//! | `memory`, `memory_queue` | user key, (user key, thread id) | their records |
//! | `subagents` | task id (sorts in creation order) | [`SubagentRecord`] |
//! | `subagent_calls` | (thread id, turn, call id) | task id |
//! | `skills` | skill name | `{"on": bool}` |
//! | `pairing_requests`, `paired_users` | (channel, user id) | [`PairingRequest`], [`PairedUser`] |
//! | `schedules` | schedule name | [`ScheduleRecord`] |
//! | `schedule_marks` | schedule name | fire time enqueued last (ms, big-endian u64) |
//! | `approvals`, `approval_calls`, `approvals_open` | see `approvals` | approval records |

mod approvals;
mod copy;
mod migrate;
#[cfg(test)]
mod schema2;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use antler_channel::{ChatMove, ConversationKey, Receipt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};

use super::group_commit::{GroupCommit, SyncFiles};
use super::records::Record;
use super::rules::{self, DedupeEntry};
use super::{
    Accept, Accepted, ClearedMemory, ConversationRecord, FinishTurn, InboxItem, InboxStore,
    MaintenanceStore, MemoryQueueStore, MemoryStore, OutboxItem, OutboxStatus, OutboxStore,
    PairedUser, PairingRequest, PairingStore, SCHEMA_VERSION, SkillStore, StoreError, StoreStats,
    SubagentStore, ThreadStore, keys, outbox_seq,
};
use super::{AddedSchedule, ScheduleRecord, ScheduleStore};
use super::{Claimed, Lease, LeaseStore};
use crate::agent::memory::{MemoryDocument, MemoryUpdate};
use crate::agent::message::ChatMessage;
use crate::agent::subagents::{SubagentChange, SubagentRecord, SubagentStatus, Transition};
use crate::agent::thread::ThreadState;

const SCHEMA_KEY: &[u8] = b"schema_version";
const LEASE_KEY: &[u8] = b"lease";
const OUTBOX_TREE: &str = "outbox2";
const DEDUPE_PREFIX: &str = "dedupe.";
/// How often a compare-and-swap (a memory document, the lease) reads and tries again when
/// other writers keep changing the record; past that, something is writing it in a loop.
const CAS_ATTEMPTS: usize = 64;

/// The sled-backed store.
#[derive(Clone)]
pub(crate) struct SledStore {
    db: sled::Db,
    conversations: sled::Tree,
    threads: sled::Tree,
    messages: sled::Tree,
    inbox: sled::Tree,
    outbox: sled::Tree,
    /// The dedupe set in generations: keys accepted in `[start, start + length)` live in the
    /// tree `dedupe.<start>.<length>`, where the length is the TTL they were accepted with.
    /// The sweep drops a whole generation once every key in it has expired, so forgetting keys
    /// costs neither a scan nor a write per message; recording the length in the name keeps a
    /// key findable until it really expires, also after the TTL setting changes.
    dedupe_generations: Arc<Mutex<Option<DedupeGenerations>>>,
    /// Inbox items, counted at open and kept in step, so readiness checks never scan.
    inbox_len: Arc<AtomicUsize>,
    /// Outbox items still to deliver, counted at open and kept in step.
    outbox_pending: Arc<AtomicUsize>,
    memory: sled::Tree,
    memory_queue: sled::Tree,
    subagents: sled::Tree,
    /// Which task a turn's tool call started, and a thread's tasks by prefix.
    subagent_calls: sled::Tree,
    /// Skill name → `{"on": bool}`.
    skills: sled::Tree,
    /// (channel, user id) → [`PairingRequest`] (JSON).
    pairing_requests: sled::Tree,
    /// (channel, user id) → [`PairedUser`] (JSON).
    paired_users: sled::Tree,
    /// Schedule name → [`ScheduleRecord`] (JSON): the chat-made schedules.
    schedules: sled::Tree,
    /// Schedule name → the fire time enqueued last.
    schedule_marks: sled::Tree,
    /// Held while a schedule is added: the count and the insert are one step.
    adding_schedule: Arc<Mutex<()>>,
    commit: GroupCommit,
    /// `meta`: the schema version and the lease.
    meta: sled::Tree,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").finish_non_exhaustive()
    }
}

/// The `subagent_calls` key of a turn's tool call.
fn subagent_call_key(thread_id: &str, turn: u64, call_id: &str) -> Vec<u8> {
    keys::tuple(&[
        thread_id.as_bytes(),
        &turn.to_be_bytes(),
        call_id.as_bytes(),
    ])
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

/// Runs `work` (a whole scan, a sweep) on the blocking pool: a scan of a large tree must not
/// hold up the async workers that answer webhooks.
async fn off_the_workers<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::backend(format!("a store scan failed: {e}")))?
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

fn tx_record<T: Record>(value: &T) -> Result<Vec<u8>, ConflictableTransactionError<StoreError>> {
    value
        .to_record()
        .map_err(ConflictableTransactionError::Abort)
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

/// How often a thread is read without a transaction before it is read with one, because
/// commits kept changing it meanwhile.
const OPTIMISTIC_THREAD_READS: usize = 3;

fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

fn dedupe_key(conversation: &str, event_id: &str) -> Vec<u8> {
    keys::tuple(&[conversation.as_bytes(), event_id.as_bytes()])
}

/// The tree name of the dedupe generation starting at `start_ms` with length `length_ms`.
fn generation_name(start_ms: u64, length_ms: u64) -> String {
    format!("{DEDUPE_PREFIX}{start_ms}.{length_ms}")
}

/// `(start, length)` of a dedupe generation's tree name.
fn parse_generation(name: &[u8]) -> Option<(u64, u64)> {
    let rest = std::str::from_utf8(name)
        .ok()?
        .strip_prefix(DEDUPE_PREFIX)?;
    let (start, length) = rest.split_once('.')?;
    Some((start.parse().ok()?, length.parse().ok()?))
}

/// The encoded thread metadata and the messages a save must write.
struct ThreadWrite {
    id: String,
    meta: Vec<u8>,
    messages: Vec<(Vec<u8>, Vec<u8>)>,
}

impl ThreadWrite {
    fn of(thread: &ThreadState) -> Result<Self, StoreError> {
        let from = thread.saved_messages.min(thread.messages.len());
        let mut messages = Vec::with_capacity(thread.messages.len() - from);
        for (index, message) in thread.messages.iter().enumerate().skip(from) {
            messages.push((
                keys::with_index(&thread.id, index as u64),
                message.to_record()?,
            ));
        }
        Ok(Self {
            id: thread.id.clone(),
            meta: encode("thread", thread)?,
            messages,
        })
    }

    fn apply(
        &self,
        threads: &TransactionalTree,
        messages: &TransactionalTree,
    ) -> Result<(), ConflictableTransactionError<StoreError>> {
        threads.insert(self.id.as_bytes(), self.meta.as_slice())?;
        for (key, bytes) in &self.messages {
            messages.insert(key.as_slice(), bytes.as_slice())?;
        }
        Ok(())
    }
}

/// The queue key of a memory update: one entry per (user, thread), length-prefixed so no
/// user id and thread id can join into another pair's key.
fn memory_queue_key(update: &MemoryUpdate) -> Vec<u8> {
    keys::tuple(&[update.user_id.as_bytes(), update.thread_id.as_bytes()])
}

/// Queues `update` under `key` inside a transaction, taking over the unread messages of the
/// update it replaces (`rules::queued_update`).
fn queue_in_tx(
    queue: &sled::transaction::TransactionalTree,
    key: &[u8],
    update: &MemoryUpdate,
) -> Result<(), ConflictableTransactionError<StoreError>> {
    let queued = match queue.get(key)? {
        Some(bytes) => Some(tx_decode::<MemoryUpdate>("memory update", &bytes)?),
        None => None,
    };
    let next = rules::queued_update(queued.as_ref(), update);
    queue.insert(key, tx_encode("memory update", &next)?)?;
    Ok(())
}

/// A finished turn, encoded for the finish transaction.
struct FinishWrite {
    /// The turn's inbox item and those it absorbed.
    inbox_seqs: Vec<u64>,
    thread: Option<ThreadWrite>,
    /// Encoded in the transaction: it takes over what an unread queued update held.
    memory: Option<(Vec<u8>, MemoryUpdate)>,
    items: Vec<OutboxItem>,
    encoded: Vec<([u8; 8], Vec<u8>)>,
}

impl FinishWrite {
    fn of(finish: &FinishTurn) -> Result<Self, StoreError> {
        let items = rules::outbox_items(finish)?;
        let encoded = items
            .iter()
            .map(|item| item.to_record().map(|bytes| (seq_key(item.seq), bytes)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            inbox_seqs: std::iter::once(finish.inbox_seq)
                .chain(finish.absorbed.iter().copied())
                .collect(),
            thread: finish.thread.as_ref().map(ThreadWrite::of).transpose()?,
            memory: finish
                .memory_update
                .as_ref()
                .map(|m| (memory_queue_key(m), m.clone())),
            items,
            encoded,
        })
    }
}

/// The dedupe generations a key accepted now is looked up in and written to.
#[derive(Clone)]
struct DedupeGenerations {
    length_ms: u64,
    start_ms: u64,
    current: sled::Tree,
    previous: sled::Tree,
    /// Generations of other lengths (the TTL changed) whose keys may not all have expired.
    /// Nothing writes to them any more, so they are read outside the accept transaction.
    older: Vec<(u64, u64, sled::Tree)>,
}

/// Creates the store directory private to its owner, or makes an existing one so.
fn prepare_dir(path: &Path) -> Result<(), StoreError> {
    let io = |e: std::io::Error| {
        StoreError::unavailable(format!(
            "cannot prepare the store directory {} as uid {}: {e}; make it (or its parent) \
             writable by that user, or set store.path (ANTLER_DATA_DIR)",
            path.display(),
            rustix::process::geteuid().as_raw()
        ))
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(io)?;
        let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
            tracing::info!(path = %path.display(), "store directory made private (0700)");
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(path).map_err(io)?;
    Ok(())
}

/// Makes the files sled created readable by the owner only (the directory already is).
fn tighten_files(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            let mode = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                0o700
            } else {
                0o600
            };
            // Best effort: the 0700 directory already keeps others out.
            let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode));
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// How long opening waits for a lock that this process itself may still hold.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens sled in `path`. A store this process closed a moment ago may still be locked:
/// sled's background threads let go of the lock file shortly after the last handle is
/// dropped. So a lock held by someone is retried for [`LOCK_WAIT`] before it counts as in
/// use; another process's lock outlasts that, and is reported then.
fn open_db(path: &Path, cache_capacity: u64) -> Result<sled::Db, StoreError> {
    let give_up = std::time::Instant::now() + LOCK_WAIT;
    loop {
        let opened = sled::Config::new()
            .path(path)
            .cache_capacity(cache_capacity)
            .open();
        match opened.map_err(|e| open_error(e, path)) {
            Err(StoreError::InUse { .. }) if std::time::Instant::now() < give_up => {
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            result => return result,
        }
    }
}

fn open_error(e: sled::Error, path: &Path) -> StoreError {
    match &e {
        sled::Error::Io(io) if io.to_string().contains("could not acquire lock") => {
            StoreError::InUse {
                path: path.display().to_string(),
            }
        }
        _ => StoreError::backend(format!("cannot open {}: {e}", path.display())),
    }
}

/// The schema version the store in `meta`'s database was written with (`None`: a new store).
fn stored_schema(meta: &sled::Tree) -> Result<Option<u32>, StoreError> {
    let Some(bytes) = meta.get(SCHEMA_KEY)? else {
        return Ok(None);
    };
    <[u8; 4]>::try_from(bytes.as_ref())
        .map(|be| Some(u32::from_be_bytes(be)))
        .map_err(|_| StoreError::Codec {
            what: "schema version",
            detail: format!("{} bytes", bytes.len()),
        })
}

impl SledStore {
    /// Opens (or creates) the store in `path`, migrating an older layout and checking the
    /// schema version. `cache_capacity` bounds sled's page cache.
    pub(crate) fn open(path: &Path, cache_capacity: u64) -> Result<Self, StoreError> {
        prepare_dir(path)?;
        let db = open_db(path, cache_capacity)?;
        tighten_files(path);
        let files = SyncFiles::open(path)?;
        Self::from_db(db, &path.display().to_string(), Some(files))
    }

    /// Opens the store in `path` only to migrate it (`antler migrate`); returns the schema
    /// versions before (0: a new store) and after.
    pub(crate) fn migrate(path: &Path, cache_capacity: u64) -> Result<(u32, u32), StoreError> {
        prepare_dir(path)?;
        let db = open_db(path, cache_capacity)?;
        tighten_files(path);
        let found = stored_schema(&db.open_tree("meta")?)?.unwrap_or(0);
        let files = SyncFiles::open(path)?;
        let store = Self::from_db(db, &path.display().to_string(), Some(files))?;
        store.db.flush()?;
        Ok((found, SCHEMA_VERSION))
    }

    /// A store in a temporary directory that sled deletes on drop (tests).
    #[cfg(test)]
    pub(crate) fn temporary() -> Result<Self, StoreError> {
        let db = sled::Config::new().temporary(true).open()?;
        Self::from_db(db, "<temporary>", None)
    }

    fn from_db(db: sled::Db, path: &str, files: Option<SyncFiles>) -> Result<Self, StoreError> {
        let meta = db.open_tree("meta")?;
        if let Some(found) = stored_schema(&meta)? {
            if found > SCHEMA_VERSION {
                return Err(StoreError::NewerSchema {
                    path: path.to_owned(),
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            if found < 2 {
                migrate::v1_to_v2(&db)?;
                tracing::info!(path, "store migrated to schema version 2");
            }
            if found < 3 {
                let records = migrate::v2_to_v3(&db)?;
                tracing::info!(path, records, "store migrated to schema version 3");
            }
        }
        meta.insert(SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes())?;
        let commit = GroupCommit::start(db.clone(), files)?;
        let store = Self {
            conversations: db.open_tree("conversations")?,
            threads: db.open_tree("threads")?,
            messages: db.open_tree("messages")?,
            inbox: db.open_tree("inbox")?,
            outbox: db.open_tree(OUTBOX_TREE)?,
            dedupe_generations: Arc::default(),
            inbox_len: Arc::new(AtomicUsize::new(0)),
            outbox_pending: Arc::new(AtomicUsize::new(0)),
            memory: db.open_tree("memory")?,
            memory_queue: db.open_tree("memory_queue")?,
            subagents: db.open_tree("subagents")?,
            subagent_calls: db.open_tree("subagent_calls")?,
            skills: db.open_tree("skills")?,
            pairing_requests: db.open_tree("pairing_requests")?,
            paired_users: db.open_tree("paired_users")?,
            schedules: db.open_tree("schedules")?,
            schedule_marks: db.open_tree("schedule_marks")?,
            adding_schedule: Arc::default(),
            meta,
            db,
            commit,
        };
        // Counted once here; every later change keeps the counts in step.
        store.inbox_len.store(store.inbox.len(), Ordering::SeqCst);
        let pending = Self::scan_records::<OutboxItem>(&store.outbox)?
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

    /// Batches the group commit has made durable so far.
    #[cfg(test)]
    pub(crate) fn syncs(&self) -> u64 {
        self.commit.syncs()
    }

    /// [`MaintenanceStore::sweep`]'s walk, on the blocking pool; not yet synced.
    fn sweep_now(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        // Dedupe generations whose every key has expired: keys of a generation were accepted
        // before `start + length` with a TTL of `length`, so they expire before
        // `start + 2 length`.
        for name in self.db.tree_names() {
            let Some((start, length)) = parse_generation(&name) else {
                continue;
            };
            if start.saturating_add(length.saturating_mul(2)) <= now_ms {
                if let Ok(mut cached) = self.dedupe_generations.lock() {
                    // Never leave a dropped tree in the cache.
                    *cached = None;
                }
                if self.db.drop_tree(&name)? {
                    removed += 1;
                }
            }
        }
        // Finished outbox items past retention. Keys follow the arrival order of the messages
        // they answer, which is close to creation order: the walk stops at the first item
        // created after the cutoff, so an item behind a slower one is swept a little later,
        // never early.
        let cutoff = now_ms.saturating_sub(retain_ms);
        for entry in self.outbox.iter() {
            let (key, value) = entry?;
            let item = OutboxItem::from_record(&value)?;
            if item.created_at_ms > cutoff {
                break;
            }
            if rules::outbox_expired(&item, cutoff) {
                self.outbox.remove(&key)?;
                removed += 1;
            }
        }
        removed += self.sweep_subagents(rules::subagent_cutoff(now_ms, retain_ms))?;
        removed += self.sweep_approvals(cutoff)?;
        Ok(removed)
    }

    /// Removes finished subagent records that ended before `cutoff`, with their index
    /// entries. Ids sort in creation order, so the walk stops at the first record created
    /// after the cutoff.
    fn sweep_subagents(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        for entry in self.subagents.iter() {
            let (key, value) = entry?;
            let record: SubagentRecord = decode("subagent", &value)?;
            if record.created_at_ms > cutoff {
                break;
            }
            if !rules::subagent_expired(&record, cutoff) {
                continue;
            }
            let call = subagent_call_key(
                &record.parent_thread_id,
                record.parent_turn,
                &record.parent_call_id,
            );
            (&self.subagents, &self.subagent_calls)
                .transaction(|(subagents, calls)| {
                    subagents.remove(&key)?;
                    calls.remove(call.as_slice())?;
                    Ok(())
                })
                .map_err(from_tx)?;
            removed += 1;
        }
        Ok(removed)
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

    fn scan_records<T: Record>(tree: &sled::Tree) -> Result<Vec<T>, StoreError> {
        tree.iter()
            .values()
            .map(|value| T::from_record(&value?))
            .collect()
    }

    /// A thread from its stored metadata and its messages.
    fn thread_of(meta: &[u8], messages: Vec<ChatMessage>) -> Result<ThreadState, StoreError> {
        let mut thread: ThreadState = decode("thread", meta)?;
        thread.saved_messages = messages.len();
        thread.messages = messages;
        Ok(thread)
    }

    fn get<T: DeserializeOwned>(
        tree: &sled::Tree,
        what: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StoreError> {
        tree.get(key)?.map(|v| decode(what, &v)).transpose()
    }

    /// The dedupe generations for a key accepted at `now_ms` with a TTL of `ttl_ms`.
    fn dedupe_generations(
        &self,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<DedupeGenerations, StoreError> {
        let length_ms = ttl_ms.max(1);
        let start_ms = now_ms - now_ms % length_ms;
        let mut cached = self
            .dedupe_generations
            .lock()
            .map_err(|_| StoreError::backend("dedupe cache lock poisoned"))?;
        if let Some(generations) = cached.as_ref() {
            if generations.length_ms == length_ms && generations.start_ms == start_ms {
                return Ok(generations.clone());
            }
        }
        let previous_start = start_ms.saturating_sub(length_ms);
        let mut older = Vec::new();
        for name in self.db.tree_names() {
            let Some((start, length)) = parse_generation(&name) else {
                continue;
            };
            let ours = length == length_ms && (start == start_ms || start == previous_start);
            let live = start.saturating_add(length.saturating_mul(2)) > now_ms;
            if !ours && live {
                older.push((start, length, self.db.open_tree(&name)?));
            }
        }
        let generations = DedupeGenerations {
            length_ms,
            start_ms,
            current: self.db.open_tree(generation_name(start_ms, length_ms))?,
            previous: self
                .db
                .open_tree(generation_name(previous_start, length_ms))?,
            older,
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
        let (old, item) = update_record(&self.outbox, seq, change)?;
        let was_pending = old.is_some_and(|old| old.status == OutboxStatus::Pending);
        let is_pending = item.status == OutboxStatus::Pending;
        if was_pending && !is_pending {
            self.outbox_pending.fetch_sub(1, Ordering::SeqCst);
        } else if is_pending && !was_pending {
            self.outbox_pending.fetch_add(1, Ordering::SeqCst);
        }
        Ok(item)
    }
}

/// The trees one accept reads and writes, inside the accept transaction.
struct AcceptTrees<'a> {
    dedupe: &'a TransactionalTree,
    previous: &'a TransactionalTree,
    conversations: &'a TransactionalTree,
    inbox: &'a TransactionalTree,
    threads: &'a TransactionalTree,
}

/// One event of an accept batch: a duplicate, or a new inbox item (with its conversation and,
/// for a new conversation or `/new`, its thread).
fn accept_one(
    accept: &Accept,
    conversation: &str,
    key: &[u8],
    trees: AcceptTrees<'_>,
) -> Result<Accepted, ConflictableTransactionError<StoreError>> {
    for generation in [trees.dedupe, trees.previous] {
        if let Some(bytes) = generation.get(key)? {
            let seen =
                DedupeEntry::from_record(&bytes).map_err(ConflictableTransactionError::Abort)?;
            if let Some(duplicate) = seen.duplicate_at(accept.now_ms) {
                return Ok(duplicate);
            }
        }
    }
    let current: Option<ConversationRecord> = trees
        .conversations
        .get(conversation.as_bytes())?
        .map(|b| tx_decode("conversation", &b))
        .transpose()?;
    let (record, fresh) = rules::next_conversation(current, accept);
    // The conversation changes only when it starts a thread: a message into the current
    // thread writes its inbox item and its dedupe key, nothing else.
    if let Some(thread) = fresh {
        trees
            .threads
            .insert(thread.id.as_bytes(), tx_encode("thread", &thread)?)?;
        trees
            .conversations
            .insert(conversation.as_bytes(), tx_encode("conversation", &record)?)?;
    }
    let seq = trees.inbox.generate_id()?;
    let item = rules::inbox_item(seq, accept, &record.thread_id);
    trees.inbox.insert(&seq_key(seq), tx_record(&item)?)?;
    let entry = DedupeEntry::of(accept, &record.thread_id, seq);
    trees.dedupe.insert(key, tx_record(&entry)?)?;
    Ok(Accepted::New(item))
}

/// Reads, changes and writes back the record at `seq`: the record before and after.
fn update_record<T: Record>(
    tree: &sled::Tree,
    seq: u64,
    change: impl Fn(&mut T),
) -> Result<(Option<T>, T), StoreError> {
    let mut updated = None;
    let old = tree.fetch_and_update(seq_key(seq), |old| {
        let mut record = T::from_record(old?).ok()?;
        change(&mut record);
        let bytes = record.to_record().ok()?;
        updated = Some(record);
        Some(bytes)
    })?;
    let record = updated.ok_or_else(|| StoreError::Missing {
        what: T::WHAT,
        key: seq.to_string(),
    })?;
    let old = old.and_then(|bytes| T::from_record(&bytes).ok());
    Ok((old, record))
}

#[async_trait::async_trait]
impl InboxStore for SledStore {
    async fn accept_batch(&self, accepts: Vec<Accept>) -> Result<Vec<Accepted>, StoreError> {
        // One pair of generations for the batch, chosen by its latest time and longest TTL:
        // a key lands in a generation that is swept no earlier than the key expires.
        let (Some(now_ms), Some(ttl_ms)) = (
            accepts.iter().map(|a| a.now_ms).max(),
            accepts.iter().map(|a| a.dedupe_ttl_ms).max(),
        ) else {
            return Ok(Vec::new());
        };
        let generations = self.dedupe_generations(now_ms, ttl_ms)?;
        let mut prepared = Vec::with_capacity(accepts.len());
        for accept in accepts {
            let conversation = accept.event.conversation.as_str().to_owned();
            let key = dedupe_key(&conversation, &accept.event.event_id);
            // Generations of another TTL are read-only, so they are read outside the
            // transaction.
            let mut older = None;
            for (_, _, tree) in &generations.older {
                if let Some(bytes) = tree.get(&key)? {
                    let seen = DedupeEntry::from_record(&bytes)?;
                    if let Some(duplicate) = seen.duplicate_at(accept.now_ms) {
                        older = Some(duplicate);
                        break;
                    }
                }
            }
            prepared.push((accept, conversation, key, older));
        }
        let outcomes = (
            &generations.current,
            &generations.previous,
            &self.conversations,
            &self.inbox,
            &self.threads,
        )
            .transaction(|(dedupe, previous, conversations, inbox, threads)| {
                let mut outcomes = Vec::with_capacity(prepared.len());
                for (accept, conversation, key, older) in &prepared {
                    if let Some(duplicate) = older {
                        outcomes.push(duplicate.clone());
                        continue;
                    }
                    let outcome = accept_one(
                        accept,
                        conversation,
                        key,
                        AcceptTrees {
                            dedupe,
                            previous,
                            conversations,
                            inbox,
                            threads,
                        },
                    )?;
                    outcomes.push(outcome);
                }
                Ok(outcomes)
            })
            .map_err(from_tx)?;
        let new = outcomes
            .iter()
            .filter(|o| matches!(o, Accepted::New(_)))
            .count();
        self.inbox_len.fetch_add(new, Ordering::SeqCst);
        // Every batch waiting for a sync at this moment shares it.
        self.commit.flush().await?;
        Ok(outcomes)
    }
    async fn inbox(&self) -> Result<Vec<InboxItem>, StoreError> {
        let inbox = self.inbox.clone();
        off_the_workers(move || Self::scan_records(&inbox)).await
    }
    async fn start_turn(&self, seq: u64) -> Result<InboxItem, StoreError> {
        let (_, item) = update_record(&self.inbox, seq, rules::start_turn)?;
        self.commit.flush().await?;
        Ok(item)
    }
    async fn release_turn(&self, seq: u64) -> Result<(), StoreError> {
        update_record(&self.inbox, seq, rules::release_turn)?;
        self.commit.flush().await
    }
    async fn finish_turns(
        &self,
        finishes: &[&FinishTurn],
    ) -> Result<Vec<Vec<OutboxItem>>, StoreError> {
        let writes = finishes
            .iter()
            .map(|finish| FinishWrite::of(finish))
            .collect::<Result<Vec<_>, _>>()?;
        let removed = (
            &self.inbox,
            &self.threads,
            &self.messages,
            &self.outbox,
            &self.memory_queue,
        )
            .transaction(|(inbox, threads, messages, outbox, memory_queue)| {
                let mut removed = 0;
                for write in &writes {
                    for seq in &write.inbox_seqs {
                        if inbox.remove(&seq_key(*seq))?.is_some() {
                            removed += 1;
                        }
                    }
                    if let Some(thread) = &write.thread {
                        thread.apply(threads, messages)?;
                    }
                    if let Some((key, update)) = &write.memory {
                        queue_in_tx(memory_queue, key, update)?;
                    }
                    for (key, bytes) in &write.encoded {
                        outbox.insert(key, bytes.as_slice())?;
                    }
                }
                Ok(removed)
            })
            .map_err(from_tx)?;
        self.inbox_len.fetch_sub(removed, Ordering::SeqCst);
        let items: Vec<Vec<OutboxItem>> = writes.into_iter().map(|w| w.items).collect();
        self.outbox_pending
            .fetch_add(items.iter().map(Vec::len).sum(), Ordering::SeqCst);
        self.commit.flush().await?;
        Ok(items)
    }
    async fn save_draft(&self, seq: u64, draft: &Receipt) -> Result<(), StoreError> {
        update_record(&self.inbox, seq, |item: &mut InboxItem| {
            item.draft = Some(draft.clone());
        })?;
        self.commit.flush().await
    }
}

#[async_trait::async_trait]
impl ThreadStore for SledStore {
    async fn checkpoint_thread(&self, thread: &mut ThreadState) -> Result<(), StoreError> {
        let write = ThreadWrite::of(thread)?;
        (&self.threads, &self.messages)
            .transaction(|(threads, messages)| write.apply(threads, messages))
            .map_err(from_tx)?;
        self.commit.flush().await?;
        thread.saved_messages = thread.messages.len();
        Ok(())
    }
    async fn conversation(&self, key: &str) -> Result<Option<ConversationRecord>, StoreError> {
        Self::get(&self.conversations, "conversation", key.as_bytes())
    }
    async fn conversations(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ConversationRecord>, StoreError> {
        let range = match after {
            Some(after) => self.conversations.range::<&[u8], _>((
                std::ops::Bound::Excluded(after.as_bytes()),
                std::ops::Bound::Unbounded,
            )),
            None => self.conversations.iter(),
        };
        range
            .values()
            .take(limit)
            .map(|value| decode("conversation", &value?))
            .collect()
    }
    async fn move_conversation(&self, chat_move: &ChatMove) -> Result<(), StoreError> {
        let read = |tree: &TransactionalTree, key: &ConversationKey| {
            tree.get(key.as_str().as_bytes())?
                .map(|bytes| tx_decode::<ConversationRecord>("conversation", &bytes))
                .transpose()
        };
        self.conversations
            .transaction(|conversations| {
                let from = read(conversations, &chat_move.from)?;
                let to = read(conversations, &chat_move.to)?;
                if let Some(record) = rules::moved_conversation(from, to, chat_move) {
                    conversations
                        .insert(record.key.as_bytes(), tx_encode("conversation", &record)?)?;
                }
                Ok(())
            })
            .map_err(from_tx)?;
        self.commit.flush().await
    }
    async fn thread(&self, id: &str) -> Result<Option<ThreadState>, StoreError> {
        // A finished turn (or a checkpoint) writes the metadata and the messages in one
        // transaction, but a scan is not part of it: the metadata is read again after the
        // messages and the read starts over if it changed, so a reader (the thread view while
        // a turn commits) never pairs new messages with old metadata (failed spans, title).
        // Every commit changes the metadata (`updated_at_ms`).
        for _ in 0..OPTIMISTIC_THREAD_READS {
            let Some(before) = self.threads.get(id.as_bytes())? else {
                return Ok(None);
            };
            let messages: Vec<ChatMessage> = self
                .messages
                .scan_prefix(keys::tuple(&[id.as_bytes()]))
                .values()
                .map(|value| ChatMessage::from_record(&value?))
                .collect::<Result<_, _>>()?;
            if self.threads.get(id.as_bytes())?.as_ref() == Some(&before) {
                return Ok(Some(Self::thread_of(&before, messages)?));
            }
        }
        // Commits keep coming: read inside a transaction, which none can interleave with
        // (one lookup per message, so only as the fallback).
        let read = (&self.threads, &self.messages)
            .transaction(|(threads, messages)| {
                let Some(meta) = threads.get(id.as_bytes())? else {
                    return Ok(None);
                };
                let mut values = Vec::new();
                while let Some(value) = messages.get(keys::with_index(id, values.len() as u64))? {
                    values.push(value);
                }
                Ok(Some((meta, values)))
            })
            .map_err(from_tx)?;
        let Some((meta, values)) = read else {
            return Ok(None);
        };
        let messages = values
            .iter()
            .map(|value| ChatMessage::from_record(value))
            .collect::<Result<_, _>>()?;
        Self::thread_of(&meta, messages).map(Some)
    }
}

#[async_trait::async_trait]
impl OutboxStore for SledStore {
    async fn outbox_pending(&self) -> Result<Vec<OutboxItem>, StoreError> {
        let outbox = self.outbox.clone();
        off_the_workers(move || {
            let all: Vec<OutboxItem> = Self::scan_records(&outbox)?;
            Ok(all
                .into_iter()
                .filter(|i| i.status == OutboxStatus::Pending)
                .collect())
        })
        .await
    }
    async fn outbox_item(&self, seq: u64) -> Result<Option<OutboxItem>, StoreError> {
        self.outbox
            .get(seq_key(seq))?
            .map(|bytes| OutboxItem::from_record(&bytes))
            .transpose()
    }
    async fn outbox_recent(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        self.outbox
            .iter()
            .values()
            .rev()
            .take(limit)
            .map(|value| OutboxItem::from_record(&value?))
            .collect()
    }
    async fn requeue_delivery(&self, seq: u64) -> Result<OutboxItem, StoreError> {
        let item = self.update_outbox(seq, |item| {
            rules::requeued(item);
        })?;
        self.commit.flush().await?;
        Ok(item)
    }
    async fn replies(&self, inbox_seq: u64) -> Result<Vec<OutboxItem>, StoreError> {
        let Some(first) = outbox_seq(inbox_seq, 0) else {
            return Ok(Vec::new());
        };
        let end = first.saturating_add(super::MAX_REPLIES_PER_ITEM);
        self.outbox
            .range(seq_key(first)..seq_key(end))
            .values()
            .map(|value| OutboxItem::from_record(&value?))
            .collect()
    }
    async fn delivery_failed(
        &self,
        seq: u64,
        error: &str,
        give_up: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        let item = self.update_outbox(seq, |item| {
            rules::delivery_failed(item, error, give_up, now_ms);
        })?;
        self.commit.flush().await?;
        Ok(item)
    }
    async fn part_delivered(
        &self,
        seq: u64,
        receipt: Receipt,
        complete: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        let item = self.update_outbox(seq, |item| {
            rules::part_delivered(item, &receipt, complete, now_ms);
        })?;
        self.commit.flush().await?;
        Ok(item)
    }
}

#[async_trait::async_trait]
impl MemoryStore for SledStore {
    async fn memory(&self, user_id: &str) -> Result<Option<MemoryDocument>, StoreError> {
        Self::get(&self.memory, "memory document", user_id.as_bytes())
    }
    async fn put_memory(&self, user_id: &str, doc: &MemoryDocument) -> Result<(), StoreError> {
        self.memory
            .insert(user_id.as_bytes(), encode("memory document", doc)?)?;
        self.commit.flush().await
    }
    async fn update_memory(
        &self,
        user_key: &str,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> Option<MemoryDocument> + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        let key = user_key.as_bytes();
        for _ in 0..CAS_ATTEMPTS {
            let current = self.memory.get(key)?;
            let stored = current
                .as_ref()
                .map(|bytes| decode::<MemoryDocument>("memory document", bytes))
                .transpose()?;
            let next = change(stored);
            let bytes = next
                .as_ref()
                .map(|doc| encode("memory document", doc))
                .transpose()?;
            if self
                .memory
                .compare_and_swap(key, current.as_ref(), bytes)?
                .is_ok()
            {
                self.commit.flush().await?;
                return Ok(next);
            }
        }
        Err(StoreError::Conflict(format!(
            "the memory document kept changing during {CAS_ATTEMPTS} attempts to update it"
        )))
    }
    async fn clear_memory(
        &self,
        user_key: &str,
        queued_for: &[String],
    ) -> Result<ClearedMemory, StoreError> {
        let owned = |bytes: &[u8]| {
            decode::<MemoryUpdate>("memory update", bytes)
                .is_ok_and(|u| queued_for.contains(&u.user_id))
        };
        // Transactions cannot scan, so the queue is scanned first and each entry checked
        // again inside the transaction (it may have been replaced meanwhile).
        let queue = self.memory_queue.clone();
        let owners = queued_for.to_vec();
        let candidates = off_the_workers(move || {
            let mut candidates = Vec::new();
            for entry in &queue {
                let (key, value) = entry?;
                let owned = decode::<MemoryUpdate>("memory update", &value)
                    .is_ok_and(|u| owners.contains(&u.user_id));
                if owned {
                    candidates.push(key);
                }
            }
            Ok(candidates)
        })
        .await?;
        let cleared = (&self.memory, &self.memory_queue)
            .transaction(|(memory, queue)| {
                let document = memory.remove(user_key.as_bytes())?.is_some();
                let mut updates = 0;
                for key in &candidates {
                    if queue.get(key)?.is_some_and(|value| owned(&value)) {
                        queue.remove(key)?;
                        updates += 1;
                    }
                }
                Ok(ClearedMemory { document, updates })
            })
            .map_err(from_tx)?;
        self.commit.flush().await?;
        Ok(cleared)
    }
    async fn memory_keys(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let range = match after {
            Some(after) => self.memory.range::<&[u8], _>((
                std::ops::Bound::Excluded(after.as_bytes()),
                std::ops::Bound::Unbounded,
            )),
            None => self.memory.iter(),
        };
        range
            .keys()
            .take(limit)
            .map(|key| {
                let key = key?;
                String::from_utf8(key.to_vec()).map_err(|e| StoreError::Codec {
                    what: "memory key",
                    detail: e.to_string(),
                })
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl MemoryQueueStore for SledStore {
    async fn queue_memory_update(&self, update: MemoryUpdate) -> Result<(), StoreError> {
        let key = memory_queue_key(&update);
        self.memory_queue
            .transaction(|queue| queue_in_tx(queue, &key, &update))
            .map_err(from_tx)?;
        self.commit.flush().await
    }
    async fn due_memory_updates(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<MemoryUpdate>, StoreError> {
        let queue = self.memory_queue.clone();
        off_the_workers(move || {
            let queued: Vec<MemoryUpdate> = Self::scan(&queue, "memory update")?;
            Ok(rules::due_updates(queued, now_ms, limit))
        })
        .await
    }
    async fn remove_memory_update(&self, processed: &MemoryUpdate) -> Result<bool, StoreError> {
        let key = memory_queue_key(processed);
        let Some(current) = self.memory_queue.get(&key)? else {
            return Ok(false);
        };
        let update: MemoryUpdate = decode("memory update", &current)?;
        if !rules::still_queued(&update, processed) {
            return Ok(false);
        }
        let swapped =
            self.memory_queue
                .compare_and_swap(key, Some(&current), None as Option<&[u8]>)?;
        if swapped.is_ok() {
            self.commit.flush().await?;
        }
        Ok(swapped.is_ok())
    }
    async fn apply_memory_update(
        &self,
        processed: &MemoryUpdate,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> MemoryDocument + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        let queue_key = memory_queue_key(processed);
        let user_key = processed.user_id.as_bytes();
        // A transaction takes an `Fn` (it may run again on a conflict); `change` is `FnMut`.
        let change = std::cell::RefCell::new(change);
        let applied = (&self.memory, &self.memory_queue)
            .transaction(|(memory, queue)| {
                let still_queued = match queue.get(&queue_key)? {
                    Some(bytes) => match decode::<MemoryUpdate>("memory update", &bytes) {
                        Ok(queued) => rules::still_queued(&queued, processed),
                        Err(e) => return abort(e),
                    },
                    None => false,
                };
                if !still_queued {
                    return Ok(None);
                }
                let stored = match memory.get(user_key)? {
                    Some(bytes) => match decode::<MemoryDocument>("memory document", &bytes) {
                        Ok(doc) => Some(doc),
                        Err(e) => return abort(e),
                    },
                    None => None,
                };
                let next = (change.borrow_mut())(stored);
                let bytes = match encode("memory document", &next) {
                    Ok(bytes) => bytes,
                    Err(e) => return abort(e),
                };
                memory.insert(user_key, bytes)?;
                queue.remove(queue_key.as_slice())?;
                Ok(Some(next))
            })
            .map_err(from_tx)?;
        if applied.is_some() {
            self.commit.flush().await?;
        }
        Ok(applied)
    }
}

#[async_trait::async_trait]
impl SubagentStore for SledStore {
    async fn create_subagent(&self, record: &SubagentRecord) -> Result<(), StoreError> {
        let value = encode("subagent", record)?;
        let call = subagent_call_key(
            &record.parent_thread_id,
            record.parent_turn,
            &record.parent_call_id,
        );
        (&self.subagents, &self.subagent_calls)
            .transaction(|(subagents, calls)| {
                subagents.insert(record.id.as_bytes(), value.as_slice())?;
                calls.insert(call.as_slice(), record.id.as_bytes())?;
                Ok(())
            })
            .map_err(from_tx)?;
        self.commit.flush().await
    }
    async fn subagent(&self, id: &str) -> Result<Option<SubagentRecord>, StoreError> {
        Self::get(&self.subagents, "subagent", id.as_bytes())
    }
    async fn subagent_for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, StoreError> {
        let Some(id) = self
            .subagent_calls
            .get(subagent_call_key(thread_id, turn, call_id))?
        else {
            return Ok(None);
        };
        Self::get(&self.subagents, "subagent", &id)
    }
    async fn thread_subagents(
        &self,
        thread_id: &str,
        limit: usize,
    ) -> Result<Vec<SubagentRecord>, StoreError> {
        // Index keys sort by turn, so the last entries are the newest turns' tasks.
        let mut records = Vec::new();
        for entry in self
            .subagent_calls
            .scan_prefix(keys::tuple(&[thread_id.as_bytes()]))
            .rev()
            .take(limit)
        {
            let (_, id) = entry?;
            if let Some(record) = Self::get::<SubagentRecord>(&self.subagents, "subagent", &id)? {
                records.push(record);
            }
        }
        records.sort_by(|a, b| b.id.cmp(&a.id));
        Ok(records)
    }
    async fn transition_subagent(
        &self,
        id: &str,
        change: &SubagentChange,
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
                if !change.apply(&mut record) {
                    return Ok(Transition::Refused(record));
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
        let subagents = self.subagents.clone();
        let records: Vec<SubagentRecord> =
            off_the_workers(move || Self::scan(&subagents, "subagent")).await?;
        let mut failed = 0;
        for record in records.into_iter().filter(|r| !r.status.is_terminal()) {
            let change = SubagentChange::failed(SubagentStatus::Failed, reason, now_ms);
            let outcome = self.transition_subagent(&record.id, &change).await?;
            if matches!(outcome, Transition::Applied(_)) {
                failed += 1;
            }
        }
        Ok(failed)
    }
}

#[async_trait::async_trait]
impl MaintenanceStore for SledStore {
    async fn sweep(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError> {
        let store = self.clone();
        let removed = off_the_workers(move || store.sweep_now(now_ms, retain_ms)).await?;
        if removed > 0 {
            self.commit.flush().await?;
        }
        Ok(removed)
    }
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        Ok(StoreStats {
            disk_bytes: self.db.size_on_disk()?,
            inbox: self.inbox_len.load(Ordering::SeqCst),
            // Inbox keys are sequence numbers: the first is the oldest, one lookup.
            oldest_inbox_at_ms: self
                .inbox
                .first()?
                .map(|(_, bytes)| InboxItem::from_record(&bytes).map(|item| item.accepted_at_ms))
                .transpose()?,
            outbox_pending: self.outbox_pending.load(Ordering::SeqCst),
        })
    }
}

impl SledStore {
    /// Changes the stored lease with `change` (compare and swap), durably; returns what
    /// `change` returned with it.
    async fn change_lease<T>(
        &self,
        change: impl Fn(Option<&Lease>) -> Result<(Option<Lease>, T), StoreError>,
    ) -> Result<T, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let current = self.meta.get(LEASE_KEY)?;
            let lease: Option<Lease> = current
                .as_ref()
                .map(|bytes| decode("lease", bytes))
                .transpose()?;
            let (next, outcome) = change(lease.as_ref())?;
            let bytes = next.as_ref().map(|l| encode("lease", l)).transpose()?;
            if self
                .meta
                .compare_and_swap(LEASE_KEY, current, bytes)?
                .is_ok()
            {
                self.commit.flush().await?;
                return Ok(outcome);
            }
        }
        Err(StoreError::Conflict(
            "the store's lease kept changing".to_owned(),
        ))
    }
}

/// One process opens it: nothing to share with replicas.
impl super::ReplicaStore for SledStore {}

#[async_trait::async_trait]
impl LeaseStore for SledStore {
    async fn claim(&self, owner: &str, now_ms: u64, until_ms: u64) -> Result<Claimed, StoreError> {
        // Opening took the store's file lock: no other process can be working on it.
        self.change_lease(|current| {
            let (lease, claimed) = rules::claim_lease(current, owner, now_ms, until_ms, true)?;
            Ok((Some(lease), claimed))
        })
        .await
    }
    async fn renew(&self, owner: &str, until_ms: u64) -> Result<(), StoreError> {
        self.change_lease(|current| Ok((Some(rules::renew_lease(current, owner, until_ms)?), ())))
            .await
    }
    async fn release(&self, owner: &str) -> Result<(), StoreError> {
        self.change_lease(|current| Ok((rules::release_lease(current, owner), ())))
            .await
    }
}

/// A skill's switch as stored: JSON, so a later field (who switched it, when) fits beside it.
#[derive(Debug, Serialize, Deserialize)]
struct SkillSwitch {
    on: bool,
}

/// The key of a (channel, user id) pair in the pairing trees.
fn pairing_key(channel: &str, user_id: &str) -> Vec<u8> {
    keys::tuple(&[channel.as_bytes(), user_id.as_bytes()])
}

#[async_trait::async_trait]
impl PairingStore for SledStore {
    async fn pairing_requests(&self) -> Result<Vec<PairingRequest>, StoreError> {
        self.pairing_requests
            .iter()
            .values()
            .map(|value| decode("pairing request", &value?))
            .collect()
    }
    async fn put_pairing_request(
        &self,
        request: &PairingRequest,
        dropped: &[(String, String)],
    ) -> Result<(), StoreError> {
        let value = encode("pairing request", request)?;
        let key = pairing_key(&request.channel, &request.user_id);
        self.pairing_requests
            .transaction(|requests| {
                for (channel, user_id) in dropped {
                    requests.remove(pairing_key(channel, user_id))?;
                }
                requests.insert(key.as_slice(), value.as_slice())?;
                Ok(())
            })
            .map_err(from_tx)?;
        self.commit.flush().await
    }
    async fn settle_pairing(
        &self,
        channel: &str,
        user_id: &str,
        paired: Option<&PairedUser>,
    ) -> Result<bool, StoreError> {
        let request_key = pairing_key(channel, user_id);
        let paired = paired
            .map(|user| {
                encode("paired user", user)
                    .map(|value| (pairing_key(&user.channel, &user.user_id), value))
            })
            .transpose()?;
        let found = (&self.pairing_requests, &self.paired_users)
            .transaction(|(requests, users)| {
                let found = requests.remove(request_key.as_slice())?.is_some();
                if let Some((key, value)) = &paired {
                    users.insert(key.as_slice(), value.as_slice())?;
                }
                Ok(found)
            })
            .map_err(from_tx)?;
        self.commit.flush().await?;
        Ok(found)
    }
    async fn paired_users(&self) -> Result<Vec<PairedUser>, StoreError> {
        self.paired_users
            .iter()
            .values()
            .map(|value| decode("paired user", &value?))
            .collect()
    }
}

#[async_trait::async_trait]
impl SkillStore for SledStore {
    async fn skill_switches(&self) -> Result<BTreeMap<String, bool>, StoreError> {
        let mut switches = BTreeMap::new();
        for item in self.skills.iter() {
            let (key, value) = item?;
            let switch: SkillSwitch = decode("skill switch", &value)?;
            switches.insert(String::from_utf8_lossy(&key).into_owned(), switch.on);
        }
        Ok(switches)
    }
    async fn set_skill_switch(&self, name: &str, on: bool) -> Result<(), StoreError> {
        self.skills.insert(
            name.as_bytes(),
            encode("skill switch", &SkillSwitch { on })?,
        )?;
        self.commit.flush().await
    }
}

#[async_trait::async_trait]
impl ScheduleStore for SledStore {
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.schedules
            .iter()
            .values()
            .map(|value| decode("schedule", &value?))
            .collect()
    }
    async fn add_schedule(
        &self,
        record: &ScheduleRecord,
        limit: usize,
    ) -> Result<AddedSchedule, StoreError> {
        let value = encode("schedule", record)?;
        let added = {
            let _adding = self
                .adding_schedule
                .lock()
                .map_err(|_| StoreError::backend("the schedule lock is poisoned"))?;
            if self.schedules.contains_key(record.name.as_bytes())? {
                AddedSchedule::Exists
            } else if self.schedules.len() >= limit {
                AddedSchedule::Full
            } else {
                (&self.schedules, &self.schedule_marks)
                    .transaction(|(schedules, marks)| {
                        schedules.insert(record.name.as_bytes(), value.as_slice())?;
                        // A schedule of the same name removed earlier left no mark; this
                        // one starts from its own creation.
                        marks.remove(record.name.as_bytes())?;
                        Ok(())
                    })
                    .map_err(from_tx)?;
                AddedSchedule::Added
            }
        };
        if added == AddedSchedule::Added {
            self.commit.flush().await?;
        }
        Ok(added)
    }
    async fn remove_schedule(&self, name: &str) -> Result<bool, StoreError> {
        let found = (&self.schedules, &self.schedule_marks)
            .transaction(|(schedules, marks)| {
                let found = schedules.remove(name.as_bytes())?.is_some();
                if found {
                    marks.remove(name.as_bytes())?;
                }
                Ok(found)
            })
            .map_err(from_tx)?;
        self.commit.flush().await?;
        Ok(found)
    }
    async fn schedule_marks(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let mut marks = BTreeMap::new();
        for item in self.schedule_marks.iter() {
            let (key, value) = item?;
            let fire_ms = <[u8; 8]>::try_from(value.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| StoreError::Codec {
                    what: "schedule mark",
                    detail: format!("{} bytes", value.len()),
                })?;
            marks.insert(String::from_utf8_lossy(&key).into_owned(), fire_ms);
        }
        Ok(marks)
    }
    async fn set_schedule_mark(&self, name: &str, fire_ms: u64) -> Result<(), StoreError> {
        self.schedule_marks
            .insert(name.as_bytes(), &fire_ms.to_be_bytes())?;
        self.commit.flush().await
    }
}

#[cfg(test)]
mod tests;
