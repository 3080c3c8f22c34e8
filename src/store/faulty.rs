//! A failing disk in a box (tests): [`FaultyStore`] wraps any store and makes the next calls
//! of chosen methods fail with a chosen error, then passes them through again. Fault
//! injection lives here, not in a backend, so every backend is tested the same way.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use antler_channel::{ChatMove, Receipt};

use super::{
    Accept, Accepted, Claimed, ClearedMemory, ConversationRecord, FinishTurn, InboxItem,
    InboxStore, LeaseStore, MaintenanceStore, MemoryQueueStore, MemoryStore, OutboxItem,
    OutboxStore, PairedUser, PairingRequest, PairingStore, SkillStore, Store, StoreError,
    StoreStats, SubagentStore, ThreadStore,
};
use super::{AddedSchedule, ScheduleRecord, ScheduleStore};
use crate::agent::memory::{MemoryDocument, MemoryUpdate};
use crate::agent::subagents::{SubagentChange, SubagentRecord, Transition};
use crate::agent::thread::ThreadState;

/// The calls a fault can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Call {
    AcceptBatch,
    StartTurn,
    FinishTurns,
    Thread,
}

/// A store whose next writes fail as told.
#[derive(Debug)]
pub(crate) struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: Faults,
    /// Failures reported after the call reached the store (the write happened, its sync
    /// failed).
    after: Faults,
}

impl FaultyStore {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            faults: Mutex::default(),
            after: Mutex::default(),
        }
    }

    /// Makes the next `times` calls of `call` fail with `error` (after any failures already
    /// queued for it), without reaching the store.
    pub(crate) fn fail_next(&self, call: Call, times: usize, error: &StoreError) {
        queue_faults(&self.faults, call, times, error);
    }

    /// Makes the next `times` calls of `call` fail as an unavailable disk does.
    pub(crate) fn unavailable_next(&self, call: Call, times: usize) {
        self.fail_next(call, times, &StoreError::unavailable("injected fault"));
    }

    /// Makes the next `times` calls of `call` reach the store and then fail with `error`, as
    /// a write whose sync failed does.
    pub(crate) fn fail_after_next(&self, call: Call, times: usize, error: &StoreError) {
        queue_faults(&self.after, call, times, error);
    }

    fn fault(&self, call: Call) -> Result<(), StoreError> {
        next_fault(&self.faults, call).map_or(Ok(()), Err)
    }

    /// The call's result, unless a failure after it was injected.
    fn after<T>(&self, call: Call, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match next_fault(&self.after, call) {
            Some(error) => Err(error),
            None => result,
        }
    }
}

/// Failures waiting for their calls.
type Faults = Mutex<HashMap<Call, VecDeque<StoreError>>>;

fn queue_faults(faults: &Faults, call: Call, times: usize, error: &StoreError) {
    if let Ok(mut faults) = faults.lock() {
        faults
            .entry(call)
            .or_default()
            .extend(std::iter::repeat_n(error.clone(), times));
    }
}

fn next_fault(faults: &Faults, call: Call) -> Option<StoreError> {
    faults
        .lock()
        .ok()
        .and_then(|mut faults| faults.get_mut(&call)?.pop_front())
}

#[async_trait::async_trait]
impl InboxStore for FaultyStore {
    async fn accept_batch(&self, accepts: Vec<Accept>) -> Result<Vec<Accepted>, StoreError> {
        self.fault(Call::AcceptBatch)?;
        let result = self.inner.accept_batch(accepts).await;
        self.after(Call::AcceptBatch, result)
    }
    async fn inbox(&self) -> Result<Vec<InboxItem>, StoreError> {
        self.inner.inbox().await
    }
    async fn start_turn(&self, seq: u64) -> Result<InboxItem, StoreError> {
        self.fault(Call::StartTurn)?;
        self.inner.start_turn(seq).await
    }
    async fn release_turn(&self, seq: u64) -> Result<(), StoreError> {
        self.inner.release_turn(seq).await
    }
    async fn finish_turns(
        &self,
        finishes: &[&FinishTurn],
    ) -> Result<Vec<Vec<OutboxItem>>, StoreError> {
        self.fault(Call::FinishTurns)?;
        self.inner.finish_turns(finishes).await
    }
    async fn save_draft(&self, seq: u64, draft: &Receipt) -> Result<(), StoreError> {
        self.inner.save_draft(seq, draft).await
    }
}

#[async_trait::async_trait]
impl ThreadStore for FaultyStore {
    async fn checkpoint_thread(&self, thread: &mut ThreadState) -> Result<(), StoreError> {
        self.inner.checkpoint_thread(thread).await
    }
    async fn conversation(&self, key: &str) -> Result<Option<ConversationRecord>, StoreError> {
        self.inner.conversation(key).await
    }
    async fn conversations(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ConversationRecord>, StoreError> {
        self.inner.conversations(after, limit).await
    }
    async fn move_conversation(&self, chat_move: &ChatMove) -> Result<(), StoreError> {
        self.inner.move_conversation(chat_move).await
    }
    async fn thread(&self, id: &str) -> Result<Option<ThreadState>, StoreError> {
        self.fault(Call::Thread)?;
        self.inner.thread(id).await
    }
}

#[async_trait::async_trait]
impl OutboxStore for FaultyStore {
    async fn outbox_pending(&self) -> Result<Vec<OutboxItem>, StoreError> {
        self.inner.outbox_pending().await
    }
    async fn outbox_recent(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        self.inner.outbox_recent(limit).await
    }
    async fn requeue_delivery(&self, seq: u64) -> Result<OutboxItem, StoreError> {
        self.inner.requeue_delivery(seq).await
    }
    async fn outbox_item(&self, seq: u64) -> Result<Option<OutboxItem>, StoreError> {
        self.inner.outbox_item(seq).await
    }
    async fn replies(&self, inbox_seq: u64) -> Result<Vec<OutboxItem>, StoreError> {
        self.inner.replies(inbox_seq).await
    }
    async fn delivery_failed(
        &self,
        seq: u64,
        error: &str,
        give_up: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        self.inner
            .delivery_failed(seq, error, give_up, now_ms)
            .await
    }
    async fn part_delivered(
        &self,
        seq: u64,
        receipt: Receipt,
        complete: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        self.inner
            .part_delivered(seq, receipt, complete, now_ms)
            .await
    }
}

#[async_trait::async_trait]
impl MemoryStore for FaultyStore {
    async fn memory(&self, user_id: &str) -> Result<Option<MemoryDocument>, StoreError> {
        self.inner.memory(user_id).await
    }
    async fn put_memory(&self, user_id: &str, doc: &MemoryDocument) -> Result<(), StoreError> {
        self.inner.put_memory(user_id, doc).await
    }
    async fn update_memory(
        &self,
        user_key: &str,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> Option<MemoryDocument> + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        self.inner.update_memory(user_key, change).await
    }
    async fn clear_memory(
        &self,
        user_key: &str,
        queued_for: &[String],
    ) -> Result<ClearedMemory, StoreError> {
        self.inner.clear_memory(user_key, queued_for).await
    }
    async fn memory_keys(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.memory_keys(after, limit).await
    }
}

#[async_trait::async_trait]
impl MemoryQueueStore for FaultyStore {
    async fn queue_memory_update(&self, update: MemoryUpdate) -> Result<(), StoreError> {
        self.inner.queue_memory_update(update).await
    }
    async fn due_memory_updates(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<MemoryUpdate>, StoreError> {
        self.inner.due_memory_updates(now_ms, limit).await
    }
    async fn remove_memory_update(&self, processed: &MemoryUpdate) -> Result<bool, StoreError> {
        self.inner.remove_memory_update(processed).await
    }
    async fn apply_memory_update(
        &self,
        processed: &MemoryUpdate,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> MemoryDocument + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        self.inner.apply_memory_update(processed, change).await
    }
}

#[async_trait::async_trait]
impl SubagentStore for FaultyStore {
    async fn create_subagent(&self, record: &SubagentRecord) -> Result<(), StoreError> {
        self.inner.create_subagent(record).await
    }
    async fn subagent(&self, id: &str) -> Result<Option<SubagentRecord>, StoreError> {
        self.inner.subagent(id).await
    }
    async fn subagent_for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, StoreError> {
        self.inner.subagent_for_call(thread_id, turn, call_id).await
    }
    async fn thread_subagents(
        &self,
        thread_id: &str,
        limit: usize,
    ) -> Result<Vec<SubagentRecord>, StoreError> {
        self.inner.thread_subagents(thread_id, limit).await
    }
    async fn transition_subagent(
        &self,
        id: &str,
        change: &SubagentChange,
    ) -> Result<Transition, StoreError> {
        self.inner.transition_subagent(id, change).await
    }
    async fn fail_unfinished_subagents(
        &self,
        reason: &str,
        now_ms: u64,
    ) -> Result<usize, StoreError> {
        self.inner.fail_unfinished_subagents(reason, now_ms).await
    }
}

#[async_trait::async_trait]
impl MaintenanceStore for FaultyStore {
    async fn sweep(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError> {
        self.inner.sweep(now_ms, retain_ms).await
    }
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        self.inner.stats().await
    }
}

/// One process opens it: nothing to share with replicas.
impl super::ReplicaStore for FaultyStore {}

#[async_trait::async_trait]
impl LeaseStore for FaultyStore {
    async fn claim(&self, owner: &str, now_ms: u64, until_ms: u64) -> Result<Claimed, StoreError> {
        self.inner.claim(owner, now_ms, until_ms).await
    }
    async fn renew(&self, owner: &str, until_ms: u64) -> Result<(), StoreError> {
        self.inner.renew(owner, until_ms).await
    }
    async fn release(&self, owner: &str) -> Result<(), StoreError> {
        self.inner.release(owner).await
    }
}

#[async_trait::async_trait]
impl SkillStore for FaultyStore {
    async fn skill_switches(&self) -> Result<BTreeMap<String, bool>, StoreError> {
        self.inner.skill_switches().await
    }
    async fn set_skill_switch(&self, name: &str, on: bool) -> Result<(), StoreError> {
        self.inner.set_skill_switch(name, on).await
    }
}

#[async_trait::async_trait]
impl PairingStore for FaultyStore {
    async fn pairing_requests(&self) -> Result<Vec<PairingRequest>, StoreError> {
        self.inner.pairing_requests().await
    }
    async fn put_pairing_request(
        &self,
        request: &PairingRequest,
        dropped: &[(String, String)],
    ) -> Result<(), StoreError> {
        self.inner.put_pairing_request(request, dropped).await
    }
    async fn settle_pairing(
        &self,
        channel: &str,
        user_id: &str,
        paired: Option<&PairedUser>,
    ) -> Result<bool, StoreError> {
        self.inner.settle_pairing(channel, user_id, paired).await
    }
    async fn paired_users(&self) -> Result<Vec<PairedUser>, StoreError> {
        self.inner.paired_users().await
    }
}

#[async_trait::async_trait]
impl ScheduleStore for FaultyStore {
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.inner.schedules().await
    }
    async fn add_schedule(
        &self,
        record: &ScheduleRecord,
        limit: usize,
    ) -> Result<AddedSchedule, StoreError> {
        self.inner.add_schedule(record, limit).await
    }
    async fn remove_schedule(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.remove_schedule(name).await
    }
    async fn schedule_marks(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.inner.schedule_marks().await
    }
    async fn set_schedule_mark(&self, name: &str, fire_ms: u64) -> Result<(), StoreError> {
        self.inner.set_schedule_mark(name, fire_ms).await
    }
}

#[async_trait::async_trait]
impl crate::store::ApprovalStore for FaultyStore {
    async fn open_approval(
        &self,
        record: &crate::agent::approvals::ApprovalRecord,
        max_pending: usize,
    ) -> Result<crate::agent::approvals::Opened, StoreError> {
        self.inner.open_approval(record, max_pending).await
    }
    async fn approval(
        &self,
        id: &str,
    ) -> Result<Option<crate::agent::approvals::ApprovalRecord>, StoreError> {
        self.inner.approval(id).await
    }
    async fn approval_for_call(
        &self,
        thread_id: &str,
        call_id: &str,
    ) -> Result<Option<crate::agent::approvals::ApprovalRecord>, StoreError> {
        self.inner.approval_for_call(thread_id, call_id).await
    }
    async fn open_approvals(
        &self,
    ) -> Result<Vec<crate::agent::approvals::ApprovalRecord>, StoreError> {
        self.inner.open_approvals().await
    }
    async fn decide_approval(
        &self,
        id: &str,
        decision: &crate::store::ApprovalDecision,
    ) -> Result<crate::store::Decided, StoreError> {
        self.inner.decide_approval(id, decision).await
    }
    async fn approval_queued(&self, id: &str) -> Result<(), StoreError> {
        self.inner.approval_queued(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[tokio::test]
    async fn injected_faults_fail_the_next_calls_then_pass_through() {
        let store = FaultyStore::new(Arc::new(MemStore::new()));
        store.unavailable_next(Call::StartTurn, 2);
        store.fail_next(Call::StartTurn, 1, &StoreError::backend("corrupt"));
        for _ in 0..2 {
            let error = store.start_turn(0).await.unwrap_err();
            assert!(error.is_retryable(), "{error}");
        }
        let error = store.start_turn(0).await.unwrap_err();
        assert!(!error.is_retryable(), "{error}");
        // Passed through again: the store itself answers (there is no item 0).
        let error = store.start_turn(0).await.unwrap_err();
        assert!(matches!(error, StoreError::Missing { .. }), "{error:?}");
        // Other calls were never affected.
        assert!(store.inbox().await.unwrap().is_empty());
    }
}
