//! The decisions behind the store's records, which every backend applies and none makes:
//! when a conversation gets a fresh thread and how its id is made, whose memory a thread
//! feeds, what a new inbox or outbox record holds, how long a dedupe key is remembered, how
//! turns and deliveries change their records, what the sweep may forget, and who holds the
//! store's lease.
//!
//! A backend reads, calls these, and writes what they return in one transaction; so two
//! backends cannot disagree on a rule, and the conformance suite checks them once.

use antler_channel::{ChatMove, Receipt};
use serde::{Deserialize, Serialize};

use super::{
    Accept, Accepted, Claimed, ConversationRecord, FinishTurn, InboxItem, InboxStatus, Lease,
    OutboxItem, OutboxStatus, StoreError, ThreadChoice, outbox_seq,
};
use crate::agent::memory::MemoryUpdate;
use crate::agent::subagents::SubagentRecord;
use crate::agent::thread::ThreadState;

/// How long finished subagent records are kept at least (for `/tasks` and the API), even when
/// the store's retention is shorter.
pub(crate) const SUBAGENT_RETAIN_MS: u64 = 7 * 24 * 3600 * 1000;

/// A new thread's id: time-ordered (UUIDv7), so ids sort in creation order.
fn new_thread_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// The conversation after accepting `accept` into it: the record to store and, when the
/// accept starts a thread (a new conversation, or `/new`), the empty thread to store with it.
/// A thread exists from the moment an answer names it.
pub(crate) fn next_conversation(
    current: Option<ConversationRecord>,
    accept: &Accept,
) -> (ConversationRecord, Option<ThreadState>) {
    match (current, accept.thread) {
        (Some(record), ThreadChoice::Current) => (record, None),
        (current, _) => {
            let conversation = accept.event.conversation.as_str().to_owned();
            let record = ConversationRecord {
                key: conversation.clone(),
                generation: current.as_ref().map_or(0, |r| r.generation + 1),
                thread_id: new_thread_id(),
                // The thread's owner: whose memory it feeds.
                user_id: format!("{}:{}", accept.event.channel, accept.event.user.id),
                // `/new` starts a thread, not another chat.
                moved_from_chat: current.as_ref().and_then(|r| r.moved_from_chat.clone()),
            };
            let thread = ThreadState::new(
                record.thread_id.clone(),
                conversation,
                record.generation,
                accept.now_ms,
            );
            (record, Some(thread))
        }
    }
}

/// The record of `chat_move.to` after the move, given the records of both conversations;
/// `None` when there is nothing to change (the move was made already).
///
/// The new chat goes on with the old one's thread (its history, its generation, its owner)
/// unless it has a conversation of its own already, which it keeps; either way it remembers
/// the old chat, for the allowlists. When neither exists, the record starts the thread the
/// first message will fill, owned by whoever made the move.
pub(crate) fn moved_conversation(
    from: Option<ConversationRecord>,
    to: Option<ConversationRecord>,
    chat_move: &ChatMove,
) -> Option<ConversationRecord> {
    let moved_from_chat = Some(chat_move.from_chat.clone());
    let key = chat_move.to.as_str().to_owned();
    match (from, to) {
        (_, Some(to)) if to.moved_from_chat == moved_from_chat => None,
        (_, Some(to)) => Some(ConversationRecord {
            moved_from_chat,
            ..to
        }),
        (Some(from), None) => Some(ConversationRecord {
            key,
            moved_from_chat,
            ..from
        }),
        (None, None) => Some(ConversationRecord {
            key,
            generation: 0,
            thread_id: new_thread_id(),
            user_id: format!("{}:{}", chat_move.to.channel(), chat_move.by),
            moved_from_chat,
        }),
    }
}

/// The inbox record of an accepted event, numbered `seq` by the backend.
pub(crate) fn inbox_item(seq: u64, accept: &Accept, thread_id: &str) -> InboxItem {
    InboxItem {
        seq,
        event: accept.event.clone(),
        thread_id: thread_id.to_owned(),
        fresh_thread: accept.thread == ThreadChoice::Fresh,
        status: InboxStatus::Pending,
        attempts: 0,
        accepted_at_ms: accept.now_ms,
        trace: accept.trace,
        draft: None,
    }
}

/// What the dedupe set remembers about an accepted event's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DedupeEntry {
    pub(crate) expires_at_ms: u64,
    pub(crate) thread_id: String,
    /// The inbox item the first delivery became.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) seq: Option<u64>,
}

impl DedupeEntry {
    /// The entry of `accept`'s key once it became inbox item `seq` of `thread_id`: remembered
    /// for the accept's TTL.
    pub(crate) fn of(accept: &Accept, thread_id: &str, seq: u64) -> Self {
        Self {
            expires_at_ms: accept.now_ms.saturating_add(accept.dedupe_ttl_ms),
            thread_id: thread_id.to_owned(),
            seq: Some(seq),
        }
    }

    /// The outcome of a redelivery at `now_ms`: a duplicate while the key is remembered,
    /// `None` once it expired (the event is new again, even if the backend has not yet
    /// forgotten the key).
    pub(crate) fn duplicate_at(&self, now_ms: u64) -> Option<Accepted> {
        (self.expires_at_ms > now_ms).then(|| Accepted::Duplicate {
            thread_id: self.thread_id.clone(),
            seq: self.seq,
        })
    }
}

/// The outbox records of a finished turn's replies: keyed by the inbox item they answer
/// ([`outbox_seq`]), pending, the first one carrying the turn's draft (it is edited into it).
pub(crate) fn outbox_items(finish: &FinishTurn) -> Result<Vec<OutboxItem>, StoreError> {
    let inbox_seq = finish.inbox_seq;
    finish
        .replies
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let seq = outbox_seq(inbox_seq, index as u64).ok_or_else(|| {
                StoreError::Invalid(format!("too many replies for inbox item {inbox_seq}"))
            })?;
            Ok(OutboxItem {
                seq,
                trace: finish.trace,
                message: message.clone(),
                status: OutboxStatus::Pending,
                attempts: 0,
                last_error: None,
                receipt: None,
                parts: Vec::new(),
                draft: if index == 0 {
                    finish.draft.clone()
                } else {
                    None
                },
                created_at_ms: finish.now_ms,
                finished_at_ms: None,
            })
        })
        .collect()
}

/// A turn starts: running, one more attempt (a crash during it counts).
pub(crate) fn start_turn(item: &mut InboxItem) {
    item.status = InboxStatus::Running;
    item.attempts += 1;
}

/// A turn interrupted on purpose gives its attempt back.
pub(crate) fn release_turn(item: &mut InboxItem) {
    item.status = InboxStatus::Pending;
    item.attempts = item.attempts.saturating_sub(1);
}

/// A delivery attempt failed; `give_up` ends the item's delivery for good.
pub(crate) fn delivery_failed(item: &mut OutboxItem, error: &str, give_up: bool, now_ms: u64) {
    item.attempts += 1;
    item.last_error = Some(error.to_owned());
    if give_up {
        item.status = OutboxStatus::Failed;
        item.finished_at_ms = Some(now_ms);
    }
}

/// An operator retries an item given up on: pending again, its attempts counted afresh (the
/// last error stays, to say what happened before). Whether it changed.
pub(crate) fn requeued(item: &mut OutboxItem) -> bool {
    if item.status != OutboxStatus::Failed {
        return false;
    }
    item.status = OutboxStatus::Pending;
    item.attempts = 0;
    item.finished_at_ms = None;
    true
}

/// The next part of an item was sent; `complete`: it was the last, the item is sent and its
/// receipt is the first part's.
pub(crate) fn part_delivered(
    item: &mut OutboxItem,
    receipt: &Receipt,
    complete: bool,
    now_ms: u64,
) {
    item.parts.push(receipt.clone());
    if complete {
        item.attempts += 1;
        item.status = OutboxStatus::Sent;
        item.receipt = item.parts.first().cloned();
        item.finished_at_ms = Some(now_ms);
    }
}

/// What the queue holds after `update` is queued where `queued` waited (same user and
/// thread): `update`, with the messages of `queued` the updater has not read yet.
pub(crate) fn queued_update(queued: Option<&MemoryUpdate>, update: &MemoryUpdate) -> MemoryUpdate {
    let mut next = update.clone();
    if let Some(queued) = queued {
        next.take_unseen(queued);
    }
    next
}

/// Whether a queued memory update is still the one `processed` was read as (not replaced by
/// a newer context of its user and thread).
pub(crate) fn still_queued(queued: &MemoryUpdate, processed: &MemoryUpdate) -> bool {
    queued.enqueued_at_ms == processed.enqueued_at_ms
}

/// The due updates of `queued` at `now_ms`, oldest first, at most `limit`.
pub(crate) fn due_updates(
    queued: impl IntoIterator<Item = MemoryUpdate>,
    now_ms: u64,
    limit: usize,
) -> Vec<MemoryUpdate> {
    let mut due: Vec<MemoryUpdate> = queued
        .into_iter()
        .filter(|u| u.due_at_ms <= now_ms)
        .collect();
    due.sort_by_key(|u| u.enqueued_at_ms);
    due.truncate(limit);
    due
}

/// Whether the sweep may forget an outbox item: delivered or given up before `cutoff`.
pub(crate) fn outbox_expired(item: &OutboxItem, cutoff: u64) -> bool {
    item.status != OutboxStatus::Pending && item.finished_at_ms.is_some_and(|t| t <= cutoff)
}

/// Before when finished subagent records may go, for a sweep at `now_ms` keeping finished
/// outbox items for `retain_ms`.
pub(crate) fn subagent_cutoff(now_ms: u64, retain_ms: u64) -> u64 {
    now_ms.saturating_sub(retain_ms.max(SUBAGENT_RETAIN_MS))
}

/// Whether the sweep may forget a subagent record: finished before `cutoff`.
pub(crate) fn subagent_expired(record: &SubagentRecord, cutoff: u64) -> bool {
    record.status.is_terminal() && record.finished_at_ms.is_none_or(|t| t <= cutoff)
}

/// Whether the sweep may forget an approval: decided before `cutoff` and its resume queued
/// (what is still open, the timer and `/approvals` need).
pub(crate) fn approval_expired(
    record: &crate::agent::approvals::ApprovalRecord,
    cutoff: u64,
) -> bool {
    record.queued && record.decided_at_ms.is_some_and(|at| at <= cutoff)
}

/// A claim of the lease by `owner` at `now_ms` until `until_ms`, given the stored lease: the
/// lease to store and how the previous owner left. `holder_gone`: the backend knows that no
/// other process can be working (sled's file lock), so a live lease of another owner is a
/// crashed process's.
pub(crate) fn claim_lease(
    current: Option<&Lease>,
    owner: &str,
    now_ms: u64,
    until_ms: u64,
    holder_gone: bool,
) -> Result<(Lease, Claimed), StoreError> {
    let claimed = match current {
        None => Claimed::First,
        Some(lease) if lease.owner == owner && !lease.released => Claimed::Held,
        Some(lease) if lease.released => Claimed::Released {
            owner: lease.owner.clone(),
        },
        Some(lease) if lease.until_ms <= now_ms || holder_gone => Claimed::Expired {
            owner: lease.owner.clone(),
        },
        Some(lease) => {
            return Err(StoreError::Leased {
                owner: lease.owner.clone(),
                remaining_ms: lease.until_ms - now_ms,
            });
        }
    };
    let lease = Lease {
        owner: owner.to_owned(),
        until_ms,
        released: false,
    };
    Ok((lease, claimed))
}

/// `owner`'s lease renewed until `until_ms`, if it is still `owner`'s.
pub(crate) fn renew_lease(
    current: Option<&Lease>,
    owner: &str,
    until_ms: u64,
) -> Result<Lease, StoreError> {
    match current {
        Some(lease) if lease.owner == owner && !lease.released => Ok(Lease {
            until_ms: until_ms.max(lease.until_ms),
            ..lease.clone()
        }),
        Some(lease) => Err(StoreError::LeaseLost {
            holder: if lease.released {
                "nobody".to_owned()
            } else {
                lease.owner.clone()
            },
        }),
        None => Err(StoreError::LeaseLost {
            holder: "nobody".to_owned(),
        }),
    }
}

/// The lease after `owner` gives it up: released if it was `owner`'s, else unchanged.
pub(crate) fn release_lease(current: Option<&Lease>, owner: &str) -> Option<Lease> {
    current.map(|lease| Lease {
        released: lease.released || lease.owner == owner,
        ..lease.clone()
    })
}

/// Applies `decision` to a pending approval; `false` (nothing changed) when it was decided
/// already: the first decision wins.
pub(crate) fn decide_approval(
    record: &mut crate::agent::approvals::ApprovalRecord,
    decision: &super::ApprovalDecision,
) -> bool {
    use crate::agent::approvals::ApprovalState;
    if record.state != ApprovalState::Pending || decision.state == ApprovalState::Pending {
        return false;
    }
    record.state = decision.state;
    record.decided_by = Some(decision.by.clone());
    record.reason.clone_from(&decision.reason);
    record.decided_at_ms = Some(decision.at_ms);
    true
}
