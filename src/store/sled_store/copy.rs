//! [`CopyStore`] on sled: each kind is one tree read in key order (dedupe keys: every
//! generation's), and each record written under the key the store's own writes use.

use std::ops::Bound;
use std::sync::atomic::Ordering;

use super::{
    SkillSwitch, SledStore, decode, encode, generation_name, keys, memory_queue_key,
    off_the_workers, pairing_key, parse_generation, seq_key, subagent_call_key,
};
use crate::store::copy::{CopyItem, CopyKind, CopyStore};
use crate::store::records::Record;
use crate::store::rules::DedupeEntry;
use crate::store::{OutboxStatus, StoreError};

/// How long an imported dedupe generation is: a key is placed in the generation its expiry
/// falls in, which the sweep keeps until one length after its end.
const IMPORTED_GENERATION_MS: u64 = 60 * 60 * 1000;

fn bad_key(what: &'static str) -> StoreError {
    StoreError::Codec {
        what,
        detail: "malformed key".to_owned(),
    }
}

fn text(what: &'static str, bytes: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| bad_key(what))
}

fn number(what: &'static str, bytes: &[u8]) -> Result<u64, StoreError> {
    <[u8; 8]>::try_from(bytes)
        .map(u64::from_be_bytes)
        .map_err(|_| bad_key(what))
}

/// The sled key `item` is stored under (dedupe keys: within their generation).
fn key_of(item: &CopyItem) -> Vec<u8> {
    match item {
        CopyItem::Conversation(record) => record.key.as_bytes().to_vec(),
        CopyItem::Thread(thread) => thread.id.as_bytes().to_vec(),
        CopyItem::Message {
            thread_id,
            position,
            ..
        } => keys::with_index(thread_id, *position),
        CopyItem::Inbox(item) => seq_key(item.seq).to_vec(),
        CopyItem::Outbox(item) => seq_key(item.seq).to_vec(),
        CopyItem::Dedupe {
            conversation,
            event_id,
            ..
        } => super::dedupe_key(conversation, event_id),
        CopyItem::Memory { user_key, .. } => user_key.as_bytes().to_vec(),
        CopyItem::MemoryUpdate(update) => memory_queue_key(update),
        CopyItem::Subagent(record) => record.id.as_bytes().to_vec(),
        CopyItem::SubagentCall {
            thread_id,
            turn,
            call_id,
            ..
        } => subagent_call_key(thread_id, *turn, call_id),
        CopyItem::Skill { name, .. } | CopyItem::ScheduleMark { name, .. } => {
            name.as_bytes().to_vec()
        }
        CopyItem::PairingRequest(request) => pairing_key(&request.channel, &request.user_id),
        CopyItem::PairedUser(user) => pairing_key(&user.channel, &user.user_id),
        CopyItem::Schedule(record) => record.name.as_bytes().to_vec(),
        CopyItem::Approval(record) => record.id.as_bytes().to_vec(),
    }
}

impl SledStore {
    /// The tree `kind` lives in (dedupe keys live in several).
    fn copy_tree(&self, kind: CopyKind) -> Result<sled::Tree, StoreError> {
        Ok(match kind {
            CopyKind::Conversations => self.conversations.clone(),
            CopyKind::Threads => self.threads.clone(),
            CopyKind::Messages => self.messages.clone(),
            CopyKind::Inbox => self.inbox.clone(),
            CopyKind::Outbox => self.outbox.clone(),
            CopyKind::Dedupe => {
                return Err(StoreError::backend("dedupe keys live in generations"));
            }
            CopyKind::Memory => self.memory.clone(),
            CopyKind::MemoryQueue => self.memory_queue.clone(),
            CopyKind::Subagents => self.subagents.clone(),
            CopyKind::SubagentCalls => self.subagent_calls.clone(),
            CopyKind::Skills => self.skills.clone(),
            CopyKind::PairingRequests => self.pairing_requests.clone(),
            CopyKind::PairedUsers => self.paired_users.clone(),
            CopyKind::Schedules => self.schedules.clone(),
            CopyKind::ScheduleMarks => self.schedule_marks.clone(),
            CopyKind::Approvals => self.db.open_tree("approvals")?,
        })
    }

    fn export_sync(
        &self,
        kind: CopyKind,
        after: Option<Vec<u8>>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<CopyItem>, StoreError> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        if kind == CopyKind::Dedupe {
            return self.export_dedupe(from, limit, now_ms);
        }
        let tree = self.copy_tree(kind)?;
        let mut items = Vec::with_capacity(limit);
        for entry in tree.range::<Vec<u8>, _>((from, Bound::Unbounded)) {
            if items.len() == limit {
                break;
            }
            let (key, value) = entry?;
            items.push(item_of(kind, &key, &value)?);
        }
        Ok(items)
    }

    /// The next live dedupe keys in key order, over every generation (a key is live in one
    /// generation at most: a new accept of it writes only once the old one expired).
    fn export_dedupe(
        &self,
        from: Bound<Vec<u8>>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<CopyItem>, StoreError> {
        let mut found: Vec<(Vec<u8>, DedupeEntry)> = Vec::new();
        for name in self.db.tree_names() {
            if parse_generation(&name).is_none() {
                continue;
            }
            let tree = self.db.open_tree(&name)?;
            let mut taken = 0;
            for entry in tree.range::<Vec<u8>, _>((from.clone(), Bound::Unbounded)) {
                if taken == limit {
                    break;
                }
                let (key, value) = entry?;
                let entry = DedupeEntry::from_record(&value)?;
                if entry.expires_at_ms > now_ms {
                    found.push((key.to_vec(), entry));
                    taken += 1;
                }
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found.dedup_by(|later, earlier| later.0 == earlier.0);
        found.truncate(limit);
        found
            .into_iter()
            .map(|(key, entry)| {
                let (parts, rest) = keys::split(&key, 2).ok_or_else(|| bad_key("dedupe key"))?;
                if !rest.is_empty() {
                    return Err(bad_key("dedupe key"));
                }
                Ok(CopyItem::Dedupe {
                    conversation: text("dedupe key", parts[0])?,
                    event_id: text("dedupe key", parts[1])?,
                    entry,
                })
            })
            .collect()
    }

    fn import_sync(&self, items: &[CopyItem]) -> Result<(), StoreError> {
        for item in items {
            let key = key_of(item);
            match item {
                CopyItem::Conversation(record) => {
                    self.conversations
                        .insert(key, encode("conversation", record)?)?;
                }
                CopyItem::Thread(thread) => {
                    self.threads.insert(key, encode("thread", thread)?)?;
                }
                CopyItem::Message { record, .. } => {
                    self.messages.insert(key, record.as_slice())?;
                }
                CopyItem::Inbox(item) => {
                    if self.inbox.insert(key, item.to_record()?)?.is_none() {
                        self.inbox_len.fetch_add(1, Ordering::SeqCst);
                    }
                }
                CopyItem::Outbox(item) => {
                    let old = self.outbox.insert(key, item.to_record()?)?;
                    if old.is_none() && item.status == OutboxStatus::Pending {
                        self.outbox_pending.fetch_add(1, Ordering::SeqCst);
                    }
                }
                CopyItem::Dedupe { entry, .. } => {
                    let start = entry.expires_at_ms - entry.expires_at_ms % IMPORTED_GENERATION_MS;
                    let tree = self
                        .db
                        .open_tree(generation_name(start, IMPORTED_GENERATION_MS))?;
                    tree.insert(key, entry.to_record()?)?;
                }
                CopyItem::Memory { document, .. } => {
                    self.memory
                        .insert(key, encode("memory document", document)?)?;
                }
                CopyItem::MemoryUpdate(update) => {
                    self.memory_queue
                        .insert(key, encode("memory update", update)?)?;
                }
                CopyItem::Subagent(record) => {
                    self.subagents.insert(key, encode("subagent", record)?)?;
                }
                CopyItem::SubagentCall { subagent_id, .. } => {
                    self.subagent_calls.insert(key, subagent_id.as_bytes())?;
                }
                CopyItem::Skill { on, .. } => {
                    self.skills
                        .insert(key, encode("skill switch", &SkillSwitch { on: *on })?)?;
                }
                CopyItem::PairingRequest(request) => {
                    self.pairing_requests
                        .insert(key, encode("pairing request", request)?)?;
                }
                CopyItem::PairedUser(user) => {
                    self.paired_users
                        .insert(key, encode("paired user", user)?)?;
                }
                CopyItem::Schedule(record) => {
                    self.schedules.insert(key, encode("schedule", record)?)?;
                }
                CopyItem::ScheduleMark { fire_ms, .. } => {
                    self.schedule_marks.insert(key, &fire_ms.to_be_bytes())?;
                }
                CopyItem::Approval(record) => {
                    let (records, calls, open) = self.approval_trees()?;
                    records.insert(key, encode("approval", record)?)?;
                    calls.insert(
                        super::approvals::call_key(&record.thread_id, &record.call_key()),
                        record.id.as_bytes(),
                    )?;
                    if record.queued {
                        open.remove(record.id.as_bytes())?;
                    } else {
                        open.insert(record.id.as_bytes(), &[])?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The record of `kind` stored under `key` as `value`.
fn item_of(kind: CopyKind, key: &[u8], value: &[u8]) -> Result<CopyItem, StoreError> {
    Ok(match kind {
        CopyKind::Conversations => CopyItem::Conversation(decode("conversation", value)?),
        CopyKind::Threads => CopyItem::Thread(decode("thread", value)?),
        CopyKind::Messages => {
            let (parts, rest) = keys::split(key, 1).ok_or_else(|| bad_key("message"))?;
            CopyItem::Message {
                thread_id: text("message", parts[0])?,
                position: number("message", rest)?,
                record: value.to_vec(),
            }
        }
        CopyKind::Inbox => CopyItem::Inbox(Record::from_record(value)?),
        CopyKind::Outbox => CopyItem::Outbox(Record::from_record(value)?),
        CopyKind::Dedupe => return Err(bad_key("dedupe key")),
        CopyKind::Memory => CopyItem::Memory {
            user_key: text("memory document", key)?,
            document: decode("memory document", value)?,
        },
        CopyKind::MemoryQueue => CopyItem::MemoryUpdate(decode("memory update", value)?),
        CopyKind::Subagents => CopyItem::Subagent(decode("subagent", value)?),
        CopyKind::SubagentCalls => {
            let (parts, _) = keys::split(key, 3).ok_or_else(|| bad_key("subagent call"))?;
            CopyItem::SubagentCall {
                thread_id: text("subagent call", parts[0])?,
                turn: number("subagent call", parts[1])?,
                call_id: text("subagent call", parts[2])?,
                subagent_id: text("subagent call", value)?,
            }
        }
        CopyKind::Skills => {
            let switch: SkillSwitch = decode("skill switch", value)?;
            CopyItem::Skill {
                name: text("skill switch", key)?,
                on: switch.on,
            }
        }
        CopyKind::PairingRequests => CopyItem::PairingRequest(decode("pairing request", value)?),
        CopyKind::PairedUsers => CopyItem::PairedUser(decode("paired user", value)?),
        CopyKind::Schedules => CopyItem::Schedule(decode("schedule", value)?),
        CopyKind::ScheduleMarks => CopyItem::ScheduleMark {
            name: text("schedule mark", key)?,
            fire_ms: number("schedule mark", value)?,
        },
        CopyKind::Approvals => CopyItem::Approval(decode("approval", value)?),
    })
}

#[async_trait::async_trait]
impl CopyStore for SledStore {
    async fn export_page(
        &self,
        kind: CopyKind,
        after: Option<&CopyItem>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<CopyItem>, StoreError> {
        let store = self.clone();
        let after = after.map(key_of);
        off_the_workers(move || store.export_sync(kind, after, limit, now_ms)).await
    }

    async fn import_page(&self, items: &[CopyItem]) -> Result<(), StoreError> {
        let store = self.clone();
        let items = items.to_vec();
        off_the_workers(move || store.import_sync(&items)).await
    }

    async fn holds_conversations(&self) -> Result<bool, StoreError> {
        Ok(!self.conversations.is_empty())
    }

    async fn finish_import(&self) -> Result<(), StoreError> {
        self.commit.flush().await
    }
}
