//! The [`Store`](super::Store) in memory, for tests: every collection a map behind one lock,
//! so each call is one transaction. It applies the same [`rules`] as the sled backend and
//! passes the same conformance suite; unit tests of other modules use it instead of a sled
//! store in a temporary folder. Clones share their data, and [`MemStore::reopen`] is a
//! restart that keeps it (what a durable store keeps over a crash).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use antler_channel::{ChatMove, Receipt};

use super::rules::{self, DedupeEntry};
use super::{
    Accept, Accepted, Claimed, ClearedMemory, ConversationRecord, FinishTurn, InboxItem,
    InboxStore, Lease, LeaseStore, MAX_REPLIES_PER_ITEM, MaintenanceStore, MemoryQueueStore,
    MemoryStore, OutboxItem, OutboxStatus, OutboxStore, PairedUser, PairingRequest, PairingStore,
    SkillStore, StoreError, StoreStats, SubagentStore, ThreadStore, outbox_seq,
};
use super::{AddedSchedule, ScheduleRecord, ScheduleStore};
use super::{ApprovalDecision, ApprovalStore, Decided};
use crate::agent::approvals::{ApprovalRecord, ApprovalState, Opened};
use crate::agent::memory::{MemoryDocument, MemoryUpdate};
use crate::agent::subagents::{SubagentChange, SubagentRecord, SubagentStatus, Transition};
use crate::agent::thread::ThreadState;

/// Every collection of the store.
#[derive(Debug, Default)]
struct Collections {
    next_seq: u64,
    conversations: HashMap<String, ConversationRecord>,
    /// Threads with all their messages (`saved_messages` unset).
    threads: HashMap<String, ThreadState>,
    inbox: BTreeMap<u64, InboxItem>,
    outbox: BTreeMap<u64, OutboxItem>,
    /// By (conversation, event id).
    dedupe: HashMap<(String, String), DedupeEntry>,
    memory: BTreeMap<String, MemoryDocument>,
    /// By (user key, thread id).
    memory_queue: BTreeMap<(String, String), MemoryUpdate>,
    subagents: BTreeMap<String, SubagentRecord>,
    /// (thread id, turn, call id) → task id.
    subagent_calls: BTreeMap<(String, u64, String), String>,
    lease: Option<Lease>,
    /// Skill name → on.
    skills: BTreeMap<String, bool>,
    /// By (channel, user id).
    pairing_requests: BTreeMap<(String, String), PairingRequest>,
    /// By (channel, user id).
    paired_users: BTreeMap<(String, String), PairedUser>,
    /// Chat-made schedules by name.
    schedules: BTreeMap<String, ScheduleRecord>,
    /// Schedule name → the fire time enqueued last.
    schedule_marks: BTreeMap<String, u64>,
    /// By id.
    approvals: BTreeMap<String, ApprovalRecord>,
    /// (thread id, call key) → approval id.
    approval_calls: BTreeMap<(String, String), String>,
}

/// The in-memory store.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemStore {
    data: Arc<Mutex<Collections>>,
}

fn missing(what: &'static str, key: impl ToString) -> StoreError {
    StoreError::Missing {
        what,
        key: key.to_string(),
    }
}

impl MemStore {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The same data, as a restarted process finds it.
    pub(crate) fn reopen(&self) -> Self {
        self.clone()
    }

    fn data(&self) -> Result<MutexGuard<'_, Collections>, StoreError> {
        self.data
            .lock()
            .map_err(|_| StoreError::backend("the in-memory store's lock is poisoned"))
    }
}

impl Collections {
    fn accept(&mut self, accept: &Accept) -> Accepted {
        let conversation = accept.event.conversation.as_str().to_owned();
        let key = (conversation.clone(), accept.event.event_id.clone());
        if let Some(duplicate) = self
            .dedupe
            .get(&key)
            .and_then(|seen| seen.duplicate_at(accept.now_ms))
        {
            return duplicate;
        }
        let current = self.conversations.get(&conversation).cloned();
        let (record, fresh) = rules::next_conversation(current, accept);
        if let Some(thread) = fresh {
            self.threads.insert(thread.id.clone(), thread);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let item = rules::inbox_item(seq, accept, &record.thread_id);
        self.inbox.insert(seq, item.clone());
        self.dedupe
            .insert(key, DedupeEntry::of(accept, &record.thread_id, seq));
        self.conversations.insert(conversation, record);
        Accepted::New(item)
    }

    /// Writes a thread's metadata and its messages past `saved_messages`.
    fn save_thread(&mut self, thread: &ThreadState) {
        let from = thread.saved_messages.min(thread.messages.len());
        let mut messages = self
            .threads
            .remove(&thread.id)
            .map(|stored| stored.messages)
            .unwrap_or_default();
        for (index, message) in thread.messages.iter().enumerate().skip(from) {
            match messages.get_mut(index) {
                Some(slot) => *slot = message.clone(),
                None => messages.push(message.clone()),
            }
        }
        let mut stored = thread.clone();
        stored.messages = messages;
        stored.saved_messages = 0;
        self.threads.insert(thread.id.clone(), stored);
    }

    fn inbox_item(
        &mut self,
        seq: u64,
        change: impl FnOnce(&mut InboxItem),
    ) -> Result<InboxItem, StoreError> {
        let item = self
            .inbox
            .get_mut(&seq)
            .ok_or_else(|| missing("inbox item", seq))?;
        change(item);
        Ok(item.clone())
    }

    fn outbox_item(
        &mut self,
        seq: u64,
        change: impl FnOnce(&mut OutboxItem),
    ) -> Result<OutboxItem, StoreError> {
        let item = self
            .outbox
            .get_mut(&seq)
            .ok_or_else(|| missing("outbox item", seq))?;
        change(item);
        Ok(item.clone())
    }

    /// Queues `update`, taking over the unread messages of the one it replaces.
    fn queue_memory_update(&mut self, update: &MemoryUpdate) {
        let key = (update.user_id.clone(), update.thread_id.clone());
        let next = rules::queued_update(self.memory_queue.get(&key), update);
        self.memory_queue.insert(key, next);
    }

    fn still_queued(&self, processed: &MemoryUpdate) -> Option<(String, String)> {
        let key = (processed.user_id.clone(), processed.thread_id.clone());
        self.memory_queue
            .get(&key)
            .is_some_and(|queued| rules::still_queued(queued, processed))
            .then_some(key)
    }
}

#[async_trait::async_trait]
impl InboxStore for MemStore {
    async fn accept_batch(&self, accepts: Vec<Accept>) -> Result<Vec<Accepted>, StoreError> {
        let mut data = self.data()?;
        Ok(accepts.iter().map(|accept| data.accept(accept)).collect())
    }
    async fn inbox(&self) -> Result<Vec<InboxItem>, StoreError> {
        Ok(self.data()?.inbox.values().cloned().collect())
    }
    async fn start_turn(&self, seq: u64) -> Result<InboxItem, StoreError> {
        self.data()?.inbox_item(seq, rules::start_turn)
    }
    async fn release_turn(&self, seq: u64) -> Result<(), StoreError> {
        self.data()?.inbox_item(seq, rules::release_turn).map(drop)
    }
    async fn finish_turns(
        &self,
        finishes: &[&FinishTurn],
    ) -> Result<Vec<Vec<OutboxItem>>, StoreError> {
        // Every record is made before anything is written: all or nothing.
        let items = finishes
            .iter()
            .map(|finish| rules::outbox_items(finish))
            .collect::<Result<Vec<_>, _>>()?;
        let mut data = self.data()?;
        for (finish, items) in finishes.iter().zip(&items) {
            data.inbox.remove(&finish.inbox_seq);
            for seq in &finish.absorbed {
                data.inbox.remove(seq);
            }
            if let Some(thread) = &finish.thread {
                data.save_thread(thread);
            }
            if let Some(update) = &finish.memory_update {
                data.queue_memory_update(update);
            }
            for item in items {
                data.outbox.insert(item.seq, item.clone());
            }
        }
        Ok(items)
    }
    async fn save_draft(&self, seq: u64, draft: &Receipt) -> Result<(), StoreError> {
        self.data()?
            .inbox_item(seq, |item| item.draft = Some(draft.clone()))
            .map(drop)
    }
}

#[async_trait::async_trait]
impl ThreadStore for MemStore {
    async fn checkpoint_thread(&self, thread: &mut ThreadState) -> Result<(), StoreError> {
        self.data()?.save_thread(thread);
        thread.saved_messages = thread.messages.len();
        Ok(())
    }
    async fn conversation(&self, key: &str) -> Result<Option<ConversationRecord>, StoreError> {
        Ok(self.data()?.conversations.get(key).cloned())
    }
    async fn conversations(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ConversationRecord>, StoreError> {
        let data = self.data()?;
        let mut keys: Vec<&String> = data
            .conversations
            .keys()
            .filter(|key| after.is_none_or(|after| key.as_str() > after))
            .collect();
        keys.sort_unstable();
        Ok(keys
            .into_iter()
            .take(limit)
            .filter_map(|key| data.conversations.get(key).cloned())
            .collect())
    }
    async fn move_conversation(&self, chat_move: &ChatMove) -> Result<(), StoreError> {
        let mut data = self.data()?;
        let from = data.conversations.get(chat_move.from.as_str()).cloned();
        let to = data.conversations.get(chat_move.to.as_str()).cloned();
        if let Some(record) = rules::moved_conversation(from, to, chat_move) {
            data.conversations.insert(record.key.clone(), record);
        }
        Ok(())
    }
    async fn thread(&self, id: &str) -> Result<Option<ThreadState>, StoreError> {
        Ok(self.data()?.threads.get(id).cloned().map(|mut thread| {
            thread.saved_messages = thread.messages.len();
            thread
        }))
    }
}

#[async_trait::async_trait]
impl OutboxStore for MemStore {
    async fn outbox_pending(&self) -> Result<Vec<OutboxItem>, StoreError> {
        Ok(self
            .data()?
            .outbox
            .values()
            .filter(|item| item.status == OutboxStatus::Pending)
            .cloned()
            .collect())
    }
    async fn outbox_item(&self, seq: u64) -> Result<Option<OutboxItem>, StoreError> {
        Ok(self.data()?.outbox.get(&seq).cloned())
    }
    async fn outbox_recent(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        Ok(self
            .data()?
            .outbox
            .values()
            .rev()
            .take(limit)
            .cloned()
            .collect())
    }
    async fn requeue_delivery(&self, seq: u64) -> Result<OutboxItem, StoreError> {
        self.data()?.outbox_item(seq, |item| {
            rules::requeued(item);
        })
    }
    async fn replies(&self, inbox_seq: u64) -> Result<Vec<OutboxItem>, StoreError> {
        let Some(first) = outbox_seq(inbox_seq, 0) else {
            return Ok(Vec::new());
        };
        let end = first.saturating_add(MAX_REPLIES_PER_ITEM);
        Ok(self
            .data()?
            .outbox
            .range(first..end)
            .map(|(_, item)| item.clone())
            .collect())
    }
    async fn delivery_failed(
        &self,
        seq: u64,
        error: &str,
        give_up: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        self.data()?.outbox_item(seq, |item| {
            rules::delivery_failed(item, error, give_up, now_ms);
        })
    }
    async fn part_delivered(
        &self,
        seq: u64,
        receipt: Receipt,
        complete: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        self.data()?.outbox_item(seq, |item| {
            rules::part_delivered(item, &receipt, complete, now_ms);
        })
    }
}

#[async_trait::async_trait]
impl MemoryStore for MemStore {
    async fn memory(&self, user_id: &str) -> Result<Option<MemoryDocument>, StoreError> {
        Ok(self.data()?.memory.get(user_id).cloned())
    }
    async fn put_memory(&self, user_id: &str, doc: &MemoryDocument) -> Result<(), StoreError> {
        self.data()?.memory.insert(user_id.to_owned(), doc.clone());
        Ok(())
    }
    async fn update_memory(
        &self,
        user_key: &str,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> Option<MemoryDocument> + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        // Under the lock no other writer comes between the read and the write.
        let mut data = self.data()?;
        let next = change(data.memory.get(user_key).cloned());
        match &next {
            Some(doc) => data.memory.insert(user_key.to_owned(), doc.clone()),
            None => data.memory.remove(user_key),
        };
        Ok(next)
    }
    async fn clear_memory(
        &self,
        user_key: &str,
        queued_for: &[String],
    ) -> Result<ClearedMemory, StoreError> {
        let mut data = self.data()?;
        let document = data.memory.remove(user_key).is_some();
        let before = data.memory_queue.len();
        data.memory_queue
            .retain(|_, update| !queued_for.contains(&update.user_id));
        Ok(ClearedMemory {
            document,
            updates: before - data.memory_queue.len(),
        })
    }
    async fn memory_keys(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let data = self.data()?;
        Ok(data
            .memory
            .keys()
            .filter(|key| after.is_none_or(|after| key.as_str() > after))
            .take(limit)
            .cloned()
            .collect())
    }
}

#[async_trait::async_trait]
impl MemoryQueueStore for MemStore {
    async fn queue_memory_update(&self, update: MemoryUpdate) -> Result<(), StoreError> {
        self.data()?.queue_memory_update(&update);
        Ok(())
    }
    async fn due_memory_updates(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<MemoryUpdate>, StoreError> {
        let queued: Vec<MemoryUpdate> = self.data()?.memory_queue.values().cloned().collect();
        Ok(rules::due_updates(queued, now_ms, limit))
    }
    async fn remove_memory_update(&self, processed: &MemoryUpdate) -> Result<bool, StoreError> {
        let mut data = self.data()?;
        let Some(key) = data.still_queued(processed) else {
            return Ok(false);
        };
        Ok(data.memory_queue.remove(&key).is_some())
    }
    async fn apply_memory_update(
        &self,
        processed: &MemoryUpdate,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> MemoryDocument + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        let mut data = self.data()?;
        let Some(key) = data.still_queued(processed) else {
            return Ok(None);
        };
        let next = change(data.memory.get(&processed.user_id).cloned());
        data.memory.insert(processed.user_id.clone(), next.clone());
        data.memory_queue.remove(&key);
        Ok(Some(next))
    }
}

#[async_trait::async_trait]
impl SubagentStore for MemStore {
    async fn create_subagent(&self, record: &SubagentRecord) -> Result<(), StoreError> {
        let mut data = self.data()?;
        let call = (
            record.parent_thread_id.clone(),
            record.parent_turn,
            record.parent_call_id.clone(),
        );
        data.subagent_calls.insert(call, record.id.clone());
        data.subagents.insert(record.id.clone(), record.clone());
        Ok(())
    }
    async fn subagent(&self, id: &str) -> Result<Option<SubagentRecord>, StoreError> {
        Ok(self.data()?.subagents.get(id).cloned())
    }
    async fn subagent_for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, StoreError> {
        let data = self.data()?;
        let call = (thread_id.to_owned(), turn, call_id.to_owned());
        Ok(data
            .subagent_calls
            .get(&call)
            .and_then(|id| data.subagents.get(id))
            .cloned())
    }
    async fn thread_subagents(
        &self,
        thread_id: &str,
        limit: usize,
    ) -> Result<Vec<SubagentRecord>, StoreError> {
        let data = self.data()?;
        // The newest turns' calls first, as the sled index reads them.
        let mut records: Vec<SubagentRecord> = data
            .subagent_calls
            .iter()
            .filter(|((thread, _, _), _)| thread == thread_id)
            .rev()
            .take(limit)
            .filter_map(|(_, id)| data.subagents.get(id).cloned())
            .collect();
        records.sort_by(|a, b| b.id.cmp(&a.id));
        Ok(records)
    }
    async fn transition_subagent(
        &self,
        id: &str,
        change: &SubagentChange,
    ) -> Result<Transition, StoreError> {
        let mut data = self.data()?;
        let record = data
            .subagents
            .get_mut(id)
            .ok_or_else(|| missing("subagent", id))?;
        if !change.apply(record) {
            return Ok(Transition::Refused(record.clone()));
        }
        Ok(Transition::Applied(record.clone()))
    }
    async fn fail_unfinished_subagents(
        &self,
        reason: &str,
        now_ms: u64,
    ) -> Result<usize, StoreError> {
        let mut data = self.data()?;
        let change = SubagentChange::failed(SubagentStatus::Failed, reason, now_ms);
        let mut failed = 0;
        for record in data.subagents.values_mut() {
            if !record.status.is_terminal() && change.apply(record) {
                failed += 1;
            }
        }
        Ok(failed)
    }
}

#[async_trait::async_trait]
impl MaintenanceStore for MemStore {
    async fn sweep(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError> {
        let mut data = self.data()?;
        let before =
            data.dedupe.len() + data.outbox.len() + data.subagents.len() + data.approvals.len();
        data.dedupe
            .retain(|_, entry| entry.duplicate_at(now_ms).is_some());
        let cutoff = now_ms.saturating_sub(retain_ms);
        data.outbox
            .retain(|_, item| !rules::outbox_expired(item, cutoff));
        let cutoff = rules::subagent_cutoff(now_ms, retain_ms);
        let expired: Vec<SubagentRecord> = data
            .subagents
            .values()
            .filter(|record| rules::subagent_expired(record, cutoff))
            .cloned()
            .collect();
        for record in expired {
            data.subagents.remove(&record.id);
            data.subagent_calls.remove(&(
                record.parent_thread_id,
                record.parent_turn,
                record.parent_call_id,
            ));
        }
        let cutoff = now_ms.saturating_sub(retain_ms);
        let swept: Vec<ApprovalRecord> = data
            .approvals
            .values()
            .filter(|record| rules::approval_expired(record, cutoff))
            .cloned()
            .collect();
        for record in swept {
            data.approvals.remove(&record.id);
            data.approval_calls
                .remove(&(record.thread_id.clone(), record.call_key()));
        }
        Ok(before
            - (data.dedupe.len() + data.outbox.len() + data.subagents.len() + data.approvals.len()))
    }
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let data = self.data()?;
        Ok(StoreStats {
            disk_bytes: 0,
            inbox: data.inbox.len(),
            oldest_inbox_at_ms: data
                .inbox
                .first_key_value()
                .map(|(_, item)| item.accepted_at_ms),
            outbox_pending: data
                .outbox
                .values()
                .filter(|item| item.status == OutboxStatus::Pending)
                .count(),
        })
    }
}

/// One process opens it: nothing to share with replicas.
impl super::ReplicaStore for MemStore {}

#[async_trait::async_trait]
impl LeaseStore for MemStore {
    async fn claim(&self, owner: &str, now_ms: u64, until_ms: u64) -> Result<Claimed, StoreError> {
        let mut data = self.data()?;
        // Several processes could share a store like this one: a live lease is respected.
        let (lease, claimed) =
            rules::claim_lease(data.lease.as_ref(), owner, now_ms, until_ms, false)?;
        data.lease = Some(lease);
        Ok(claimed)
    }
    async fn renew(&self, owner: &str, until_ms: u64) -> Result<(), StoreError> {
        let mut data = self.data()?;
        data.lease = Some(rules::renew_lease(data.lease.as_ref(), owner, until_ms)?);
        Ok(())
    }
    async fn release(&self, owner: &str) -> Result<(), StoreError> {
        let mut data = self.data()?;
        data.lease = rules::release_lease(data.lease.as_ref(), owner);
        Ok(())
    }
}

#[async_trait::async_trait]
impl PairingStore for MemStore {
    async fn pairing_requests(&self) -> Result<Vec<PairingRequest>, StoreError> {
        Ok(self.data()?.pairing_requests.values().cloned().collect())
    }
    async fn put_pairing_request(
        &self,
        request: &PairingRequest,
        dropped: &[(String, String)],
    ) -> Result<(), StoreError> {
        let mut data = self.data()?;
        for key in dropped {
            data.pairing_requests.remove(key);
        }
        data.pairing_requests.insert(
            (request.channel.clone(), request.user_id.clone()),
            request.clone(),
        );
        Ok(())
    }
    async fn settle_pairing(
        &self,
        channel: &str,
        user_id: &str,
        paired: Option<&PairedUser>,
    ) -> Result<bool, StoreError> {
        let mut data = self.data()?;
        let found = data
            .pairing_requests
            .remove(&(channel.to_owned(), user_id.to_owned()))
            .is_some();
        if let Some(user) = paired {
            data.paired_users
                .insert((user.channel.clone(), user.user_id.clone()), user.clone());
        }
        Ok(found)
    }
    async fn paired_users(&self) -> Result<Vec<PairedUser>, StoreError> {
        Ok(self.data()?.paired_users.values().cloned().collect())
    }
}

#[async_trait::async_trait]
impl SkillStore for MemStore {
    async fn skill_switches(&self) -> Result<BTreeMap<String, bool>, StoreError> {
        Ok(self.data()?.skills.clone())
    }
    async fn set_skill_switch(&self, name: &str, on: bool) -> Result<(), StoreError> {
        self.data()?.skills.insert(name.to_owned(), on);
        Ok(())
    }
}

#[async_trait::async_trait]
impl ScheduleStore for MemStore {
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        Ok(self.data()?.schedules.values().cloned().collect())
    }
    async fn add_schedule(
        &self,
        record: &ScheduleRecord,
        limit: usize,
    ) -> Result<AddedSchedule, StoreError> {
        let mut data = self.data()?;
        if data.schedules.contains_key(&record.name) {
            return Ok(AddedSchedule::Exists);
        }
        if data.schedules.len() >= limit {
            return Ok(AddedSchedule::Full);
        }
        data.schedules.insert(record.name.clone(), record.clone());
        data.schedule_marks.remove(&record.name);
        Ok(AddedSchedule::Added)
    }
    async fn remove_schedule(&self, name: &str) -> Result<bool, StoreError> {
        let mut data = self.data()?;
        let found = data.schedules.remove(name).is_some();
        if found {
            data.schedule_marks.remove(name);
        }
        Ok(found)
    }
    async fn schedule_marks(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        Ok(self.data()?.schedule_marks.clone())
    }
    async fn set_schedule_mark(&self, name: &str, fire_ms: u64) -> Result<(), StoreError> {
        self.data()?.schedule_marks.insert(name.to_owned(), fire_ms);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::conformance::{Backend, conformance};

    /// In-memory stores; a reopen keeps the data, as a restart of a durable store does.
    struct MemBackend(MemStore);

    impl Backend for MemBackend {
        fn open(&self) -> Arc<dyn Store> {
            Arc::new(self.0.reopen())
        }
    }

    conformance!(MemBackend(MemStore::new()));
}

#[cfg(test)]
mod lease_tests {
    use super::*;

    #[tokio::test]
    async fn a_live_lease_of_another_owner_is_respected_until_it_ends() {
        let store = MemStore::new();
        assert_eq!(store.claim("a", 0, 100).await.unwrap(), Claimed::First);
        let refused = store.claim("b", 40, 140).await.unwrap_err();
        assert!(
            matches!(&refused, StoreError::Leased { owner, remaining_ms: 60 } if owner == "a"),
            "{refused:?}"
        );
        assert!(!refused.is_retryable());
        assert_eq!(
            store.claim("b", 100, 200).await.unwrap(),
            Claimed::Expired {
                owner: "a".to_owned()
            }
        );
    }
}

#[async_trait::async_trait]
impl ApprovalStore for MemStore {
    async fn open_approval(
        &self,
        record: &ApprovalRecord,
        max_pending: usize,
    ) -> Result<Opened, StoreError> {
        let mut data = self.data()?;
        let call = (record.thread_id.clone(), record.call_key());
        if let Some(id) = data.approval_calls.get(&call) {
            let existing = data
                .approvals
                .get(id)
                .cloned()
                .ok_or_else(|| missing("approval", id))?;
            return Ok(Opened::Existing(existing));
        }
        let pending = data
            .approvals
            .values()
            .filter(|r| r.conversation == record.conversation && r.state == ApprovalState::Pending)
            .count();
        if pending >= max_pending {
            return Ok(Opened::Full);
        }
        if data.approvals.contains_key(&record.id) {
            return Err(StoreError::Conflict(format!(
                "approval id {} is taken",
                record.id
            )));
        }
        data.approvals.insert(record.id.clone(), record.clone());
        data.approval_calls.insert(call, record.id.clone());
        Ok(Opened::New(record.clone()))
    }
    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        Ok(self.data()?.approvals.get(id).cloned())
    }
    async fn approval_for_call(
        &self,
        thread_id: &str,
        call_id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        let data = self.data()?;
        Ok(data
            .approval_calls
            .get(&(thread_id.to_owned(), call_id.to_owned()))
            .and_then(|id| data.approvals.get(id))
            .cloned())
    }
    async fn open_approvals(&self) -> Result<Vec<ApprovalRecord>, StoreError> {
        let mut open: Vec<ApprovalRecord> = self
            .data()?
            .approvals
            .values()
            .filter(|r| !r.queued)
            .cloned()
            .collect();
        open.sort_by_key(|record| record.created_at_ms);
        Ok(open)
    }
    async fn decide_approval(
        &self,
        id: &str,
        decision: &ApprovalDecision,
    ) -> Result<Decided, StoreError> {
        let mut data = self.data()?;
        let record = data
            .approvals
            .get_mut(id)
            .ok_or_else(|| missing("approval", id))?;
        Ok(if rules::decide_approval(record, decision) {
            Decided::Now(record.clone())
        } else {
            Decided::Before(record.clone())
        })
    }
    async fn approval_queued(&self, id: &str) -> Result<(), StoreError> {
        let mut data = self.data()?;
        let record = data
            .approvals
            .get_mut(id)
            .ok_or_else(|| missing("approval", id))?;
        record.queued = true;
        Ok(())
    }
}

/// The first `limit` of `entries` whose keys come after `after`, in key order.
fn page_of<K: Ord + Clone, V>(
    entries: impl Iterator<Item = (K, V)>,
    after: Option<K>,
    limit: usize,
) -> Vec<(K, V)> {
    let mut found: Vec<(K, V)> = entries
        .filter(|(key, _)| after.as_ref().is_none_or(|after| key > after))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found.truncate(limit);
    found
}

#[async_trait::async_trait]
impl super::copy::CopyStore for MemStore {
    async fn export_page(
        &self,
        kind: super::copy::CopyKind,
        after: Option<&super::copy::CopyItem>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<super::copy::CopyItem>, StoreError> {
        use super::copy::{CopyItem as Item, CopyKind as Kind};
        use super::records::Record;
        let data = self.data()?;
        // The key of `after` as one text, two texts and a number: each kind uses its part.
        let (one, two, number) = match after {
            None => (None, None, None),
            Some(Item::Conversation(r)) => (Some(r.key.clone()), None, None),
            Some(Item::Thread(t)) => (Some(t.id.clone()), None, None),
            Some(Item::Message {
                thread_id,
                position,
                ..
            }) => (Some(thread_id.clone()), None, Some(*position)),
            Some(Item::Inbox(i)) => (None, None, Some(i.seq)),
            Some(Item::Outbox(i)) => (None, None, Some(i.seq)),
            Some(Item::Dedupe {
                conversation,
                event_id,
                ..
            }) => (Some(conversation.clone()), Some(event_id.clone()), None),
            Some(Item::Memory { user_key, .. }) => (Some(user_key.clone()), None, None),
            Some(Item::MemoryUpdate(u)) => {
                (Some(u.user_id.clone()), Some(u.thread_id.clone()), None)
            }
            Some(Item::Subagent(r)) => (Some(r.id.clone()), None, None),
            Some(Item::SubagentCall {
                thread_id,
                turn,
                call_id,
                ..
            }) => (Some(thread_id.clone()), Some(call_id.clone()), Some(*turn)),
            Some(Item::Skill { name, .. } | Item::ScheduleMark { name, .. }) => {
                (Some(name.clone()), None, None)
            }
            Some(Item::PairingRequest(r)) => {
                (Some(r.channel.clone()), Some(r.user_id.clone()), None)
            }
            Some(Item::PairedUser(u)) => (Some(u.channel.clone()), Some(u.user_id.clone()), None),
            Some(Item::Schedule(r)) => (Some(r.name.clone()), None, None),
            Some(Item::Approval(r)) => (Some(r.id.clone()), None, None),
        };
        let pair = one.clone().zip(two.clone());
        let items = match kind {
            Kind::Conversations => page_of(
                data.conversations.iter().map(|(k, v)| (k.clone(), v)),
                one,
                limit,
            )
            .into_iter()
            .map(|(_, v)| Item::Conversation(v.clone()))
            .collect(),
            Kind::Threads => page_of(data.threads.iter().map(|(k, v)| (k.clone(), v)), one, limit)
                .into_iter()
                .map(|(_, thread)| {
                    let mut meta = thread.clone();
                    meta.messages = Vec::new();
                    meta.saved_messages = 0;
                    Item::Thread(meta)
                })
                .collect(),
            Kind::Messages => {
                let entries = data.threads.iter().flat_map(|(id, thread)| {
                    thread
                        .messages
                        .iter()
                        .enumerate()
                        .map(move |(index, message)| ((id.clone(), index as u64), message))
                });
                let mut items = Vec::new();
                for ((thread_id, position), message) in page_of(entries, one.zip(number), limit) {
                    items.push(Item::Message {
                        thread_id,
                        position,
                        record: message.to_record()?,
                    });
                }
                items
            }
            Kind::Inbox => page_of(data.inbox.iter().map(|(k, v)| (*k, v)), number, limit)
                .into_iter()
                .map(|(_, v)| Item::Inbox(v.clone()))
                .collect(),
            Kind::Outbox => page_of(data.outbox.iter().map(|(k, v)| (*k, v)), number, limit)
                .into_iter()
                .map(|(_, v)| Item::Outbox(v.clone()))
                .collect(),
            Kind::Dedupe => page_of(
                data.dedupe
                    .iter()
                    .filter(|(_, entry)| entry.expires_at_ms > now_ms)
                    .map(|(k, v)| (k.clone(), v)),
                pair,
                limit,
            )
            .into_iter()
            .map(|((conversation, event_id), entry)| Item::Dedupe {
                conversation,
                event_id,
                entry: entry.clone(),
            })
            .collect(),
            Kind::Memory => page_of(data.memory.iter().map(|(k, v)| (k.clone(), v)), one, limit)
                .into_iter()
                .map(|(user_key, document)| Item::Memory {
                    user_key,
                    document: document.clone(),
                })
                .collect(),
            Kind::MemoryQueue => page_of(
                data.memory_queue.iter().map(|(k, v)| (k.clone(), v)),
                pair,
                limit,
            )
            .into_iter()
            .map(|(_, v)| Item::MemoryUpdate(v.clone()))
            .collect(),
            Kind::Subagents => page_of(
                data.subagents.iter().map(|(k, v)| (k.clone(), v)),
                one,
                limit,
            )
            .into_iter()
            .map(|(_, v)| Item::Subagent(v.clone()))
            .collect(),
            Kind::SubagentCalls => {
                let after = match (one, number, two) {
                    (Some(thread), Some(turn), Some(call)) => Some((thread, turn, call)),
                    _ => None,
                };
                page_of(
                    data.subagent_calls.iter().map(|(k, v)| (k.clone(), v)),
                    after,
                    limit,
                )
                .into_iter()
                .map(|((thread_id, turn, call_id), id)| Item::SubagentCall {
                    thread_id,
                    turn,
                    call_id,
                    subagent_id: id.clone(),
                })
                .collect()
            }
            Kind::Skills => page_of(data.skills.iter().map(|(k, v)| (k.clone(), *v)), one, limit)
                .into_iter()
                .map(|(name, on)| Item::Skill { name, on })
                .collect(),
            Kind::PairingRequests => page_of(
                data.pairing_requests.iter().map(|(k, v)| (k.clone(), v)),
                pair,
                limit,
            )
            .into_iter()
            .map(|(_, v)| Item::PairingRequest(v.clone()))
            .collect(),
            Kind::PairedUsers => page_of(
                data.paired_users.iter().map(|(k, v)| (k.clone(), v)),
                pair,
                limit,
            )
            .into_iter()
            .map(|(_, v)| Item::PairedUser(v.clone()))
            .collect(),
            Kind::Schedules => page_of(
                data.schedules.iter().map(|(k, v)| (k.clone(), v)),
                one,
                limit,
            )
            .into_iter()
            .map(|(_, v)| Item::Schedule(v.clone()))
            .collect(),
            Kind::ScheduleMarks => page_of(
                data.schedule_marks.iter().map(|(k, v)| (k.clone(), *v)),
                one,
                limit,
            )
            .into_iter()
            .map(|(name, fire_ms)| Item::ScheduleMark { name, fire_ms })
            .collect(),
            Kind::Approvals => page_of(
                data.approvals.iter().map(|(k, v)| (k.clone(), v)),
                one,
                limit,
            )
            .into_iter()
            .map(|(_, v)| Item::Approval(v.clone()))
            .collect(),
        };
        Ok(items)
    }

    async fn import_page(&self, items: &[super::copy::CopyItem]) -> Result<(), StoreError> {
        use super::copy::CopyItem as Item;
        use super::records::Record;
        let mut data = self.data()?;
        for item in items {
            match item.clone() {
                Item::Conversation(record) => {
                    data.conversations.insert(record.key.clone(), record);
                }
                Item::Thread(mut meta) => {
                    if let Some(stored) = data.threads.remove(&meta.id) {
                        meta.messages = stored.messages;
                    }
                    data.threads.insert(meta.id.clone(), meta);
                }
                Item::Message {
                    thread_id,
                    position,
                    record,
                } => {
                    let message = Record::from_record(&record)?;
                    let thread = data
                        .threads
                        .get_mut(&thread_id)
                        .ok_or_else(|| missing("thread", &thread_id))?;
                    let index = usize::try_from(position)
                        .map_err(|_| StoreError::Invalid(format!("message {position}")))?;
                    if index < thread.messages.len() {
                        thread.messages[index] = message;
                    } else if index == thread.messages.len() {
                        thread.messages.push(message);
                    } else {
                        return Err(missing("message before", position));
                    }
                }
                Item::Inbox(inbox) => {
                    data.next_seq = data.next_seq.max(inbox.seq + 1);
                    data.inbox.insert(inbox.seq, inbox);
                }
                Item::Outbox(outbox) => {
                    data.next_seq = data.next_seq.max(outbox.seq / MAX_REPLIES_PER_ITEM + 1);
                    data.outbox.insert(outbox.seq, outbox);
                }
                Item::Dedupe {
                    conversation,
                    event_id,
                    entry,
                } => {
                    data.dedupe.insert((conversation, event_id), entry);
                }
                Item::Memory { user_key, document } => {
                    data.memory.insert(user_key, document);
                }
                Item::MemoryUpdate(update) => {
                    let key = (update.user_id.clone(), update.thread_id.clone());
                    data.memory_queue.insert(key, update);
                }
                Item::Subagent(record) => {
                    data.subagents.insert(record.id.clone(), record);
                }
                Item::SubagentCall {
                    thread_id,
                    turn,
                    call_id,
                    subagent_id,
                } => {
                    data.subagent_calls
                        .insert((thread_id, turn, call_id), subagent_id);
                }
                Item::Skill { name, on } => {
                    data.skills.insert(name, on);
                }
                Item::PairingRequest(request) => {
                    let key = (request.channel.clone(), request.user_id.clone());
                    data.pairing_requests.insert(key, request);
                }
                Item::PairedUser(user) => {
                    let key = (user.channel.clone(), user.user_id.clone());
                    data.paired_users.insert(key, user);
                }
                Item::Schedule(record) => {
                    data.schedules.insert(record.name.clone(), record);
                }
                Item::ScheduleMark { name, fire_ms } => {
                    data.schedule_marks.insert(name, fire_ms);
                }
                Item::Approval(record) => {
                    let key = (record.thread_id.clone(), record.call_key());
                    data.approval_calls.insert(key, record.id.clone());
                    data.approvals.insert(record.id.clone(), record);
                }
            }
        }
        Ok(())
    }

    async fn holds_conversations(&self) -> Result<bool, StoreError> {
        Ok(!self.data()?.conversations.is_empty())
    }

    async fn finish_import(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
