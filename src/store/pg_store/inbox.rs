//! The inbox (with dedupe and conversations), threads and the outbox on PostgreSQL.

use std::collections::{BTreeSet, HashMap, HashSet};

use antler_channel::{ChatMove, Receipt};
use deadpool_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::memory::queue_update;
use super::replicas::ensure_held;
use super::{
    Failure, PgStore, bound, exec, get, int, json, missing, outbox_items, read, row, rows, to_json,
    transaction, uint,
};
use crate::agent::message::ChatMessage;
use crate::agent::thread::ThreadState;
use crate::store::records::Record;
use crate::store::rules::{self, DedupeEntry};
use crate::store::{
    Accept, Accepted, ConversationRecord, FinishTurn, InboxItem, InboxStatus, InboxStore,
    MAX_REPLIES_PER_ITEM, OutboxItem, OutboxStatus, OutboxStore, StoreError, ThreadChoice,
    ThreadStore, outbox_seq,
};

pub(super) fn inbox_status(status: InboxStatus) -> &'static str {
    match status {
        InboxStatus::Pending => "pending",
        InboxStatus::Running => "running",
    }
}

pub(super) fn outbox_status(status: OutboxStatus) -> &'static str {
    match status {
        OutboxStatus::Pending => "pending",
        OutboxStatus::Sent => "sent",
        OutboxStatus::Failed => "failed",
    }
}

/// Changes the counts by the rows a transaction added and removed: in the shard of the
/// connection (one shard per transaction, so two never wait for each other's), last in the
/// transaction, so the row is locked only until the commit.
pub(super) async fn count(
    tx: &Transaction<'_>,
    inbox: i64,
    outbox_pending: i64,
) -> Result<(), Failure> {
    if inbox != 0 || outbox_pending != 0 {
        exec(
            tx,
            "UPDATE antler_counters SET inbox = inbox + $1, outbox_pending = outbox_pending + $2 \
             WHERE shard = pg_backend_pid() % 16",
            &[&inbox, &outbox_pending],
        )
        .await?;
    }
    Ok(())
}

/// Stores `record`: an update when it `existed` (and is locked), else an insert that
/// loses to a concurrent one (the transaction runs again and finds it).
async fn put_conversation(
    tx: &Transaction<'_>,
    record: &ConversationRecord,
    existed: bool,
) -> Result<(), Failure> {
    let value = to_json("conversation", record)?;
    if existed {
        exec(
            tx,
            "UPDATE antler_conversations SET thread_id = $2, record = $3::text::jsonb \
             WHERE key = $1",
            &[&record.key, &record.thread_id, &value],
        )
        .await?;
        return Ok(());
    }
    let inserted = exec(
        tx,
        "INSERT INTO antler_conversations (key, thread_id, record) VALUES ($1, $2, $3::text::jsonb) \
         ON CONFLICT (key) DO NOTHING",
        &[&record.key, &record.thread_id, &value],
    )
    .await?;
    if inserted == 0 {
        return Err(Failure::Again(format!(
            "conversation {} was created meanwhile",
            record.key
        )));
    }
    Ok(())
}

/// Writes a thread's metadata and its messages past `saved_messages`.
pub(super) async fn save_thread(tx: &Transaction<'_>, thread: &ThreadState) -> Result<(), Failure> {
    exec(
        tx,
        "INSERT INTO antler_threads (id, conversation, updated_at_ms, meta) \
         VALUES ($1, $2, $3, $4::text::jsonb) \
         ON CONFLICT (id) DO UPDATE SET conversation = EXCLUDED.conversation, \
         updated_at_ms = EXCLUDED.updated_at_ms, meta = EXCLUDED.meta",
        &[
            &thread.id,
            &thread.conversation,
            &int(thread.updated_at_ms)?,
            &to_json("thread", thread)?,
        ],
    )
    .await?;
    let from = thread.saved_messages.min(thread.messages.len());
    if from == thread.messages.len() {
        return Ok(());
    }
    let mut positions = Vec::with_capacity(thread.messages.len() - from);
    let mut records = Vec::with_capacity(thread.messages.len() - from);
    for (index, message) in thread.messages.iter().enumerate().skip(from) {
        positions.push(int(index as u64)?);
        records.push(message.to_record()?);
    }
    exec(
        tx,
        "INSERT INTO antler_messages (thread_id, position, record) \
         SELECT $1, * FROM unnest($2::bigint[], $3::bytea[]) \
         ON CONFLICT (thread_id, position) DO UPDATE SET record = EXCLUDED.record",
        &[&thread.id, &positions, &records],
    )
    .await?;
    Ok(())
}

/// The conversations of an accept batch as the batch goes: each record (`None`: none yet)
/// and whether the table holds a row for it.
struct BatchConversations(HashMap<String, (Option<ConversationRecord>, bool)>);

impl BatchConversations {
    /// Locks the conversations `accepts` go to, in key order (so two batches never wait for
    /// each other in a circle), and reads them. Locked before any inbox number is drawn, the
    /// accepts of one conversation are numbered in the order they commit.
    async fn lock(tx: &Transaction<'_>, accepts: &[Accept]) -> Result<Self, Failure> {
        let keys: BTreeSet<&str> = accepts
            .iter()
            .map(|a| a.event.conversation.as_str())
            .collect();
        let mut conversations: HashMap<String, (Option<ConversationRecord>, bool)> = keys
            .iter()
            .map(|key| ((*key).to_owned(), (None, false)))
            .collect();
        let keys: Vec<&str> = keys.into_iter().collect();
        let found = rows(
            tx,
            "SELECT key, record::text FROM antler_conversations WHERE key = ANY($1) \
             ORDER BY key FOR UPDATE",
            &[&keys],
        )
        .await?;
        for row in &found {
            let key: String = get(row, 0)?;
            let record: ConversationRecord = json("conversation", row, 1)?;
            conversations.insert(key, (Some(record), true));
        }
        Ok(Self(conversations))
    }
}

/// Draws `count` inbox numbers, in increasing order.
async fn draw_seqs(tx: &Transaction<'_>, count: usize) -> Result<Vec<u64>, Failure> {
    let count = int(count as u64)?;
    rows(
        tx,
        "SELECT nextval('antler_inbox_seq') FROM generate_series(1, $1::bigint) ORDER BY 1",
        &[&count],
    )
    .await?
    .iter()
    .map(|row| Ok(uint("inbox item", get(row, 0)?)?))
    .collect()
}

/// Takes an event's dedupe key unless a live one holds it (an expired one is taken over),
/// and inserts its inbox item with it: one statement, which changes one row when the event
/// is new and none when it is a duplicate.
const ACCEPT_SQL: &str = "WITH taken AS (\
     INSERT INTO antler_dedupe (conversation, event_id, expires_at_ms, thread_id, seq) \
     VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (conversation, event_id) DO UPDATE SET \
     expires_at_ms = EXCLUDED.expires_at_ms, thread_id = EXCLUDED.thread_id, seq = EXCLUDED.seq \
     WHERE antler_dedupe.expires_at_ms <= $6 \
     RETURNING seq) \
     INSERT INTO antler_inbox (seq, conversation, thread_id, status, accepted_at_ms, record) \
     SELECT seq, $1, $4, $7, $8, $9 FROM taken";

/// The parameters of [`ACCEPT_SQL`] for one event.
struct AcceptRow<'a> {
    conversation: &'a str,
    event_id: &'a str,
    expires_at_ms: i64,
    thread_id: String,
    seq: i64,
    now_ms: i64,
    status: &'static str,
    accepted_at_ms: i64,
    record: Vec<u8>,
    item: InboxItem,
}

impl<'a> AcceptRow<'a> {
    /// The row of `accept` into the thread `thread_id`, numbered `seq`.
    fn of(accept: &'a Accept, thread_id: &str, seq: u64) -> Result<Self, StoreError> {
        let entry = DedupeEntry::of(accept, thread_id, seq);
        let item = rules::inbox_item(seq, accept, thread_id);
        Ok(Self {
            conversation: accept.event.conversation.as_str(),
            event_id: &accept.event.event_id,
            expires_at_ms: bound(entry.expires_at_ms),
            thread_id: entry.thread_id,
            seq: int(seq)?,
            now_ms: bound(accept.now_ms),
            status: inbox_status(item.status),
            accepted_at_ms: int(item.accepted_at_ms)?,
            record: item.to_record()?,
            item,
        })
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 9] {
        [
            &self.conversation,
            &self.event_id,
            &self.expires_at_ms,
            &self.thread_id,
            &self.seq,
            &self.now_ms,
            &self.status,
            &self.accepted_at_ms,
            &self.record,
        ]
    }
}

/// The outcome of an event whose key a live entry holds: the duplicate of what it records.
async fn duplicate(tx: &Transaction<'_>, accept: &Accept) -> Result<Accepted, Failure> {
    let seen = row(
        tx,
        "SELECT expires_at_ms, thread_id, seq FROM antler_dedupe \
         WHERE conversation = $1 AND event_id = $2",
        &[&accept.event.conversation.as_str(), &accept.event.event_id],
    )
    .await?
    .ok_or_else(|| Failure::Again("a dedupe key went away meanwhile".to_owned()))?;
    let seen = DedupeEntry {
        expires_at_ms: uint("dedupe entry", get(&seen, 0)?)?,
        thread_id: get(&seen, 1)?,
        seq: get::<Option<i64>>(&seen, 2)?
            .map(|seq| uint("dedupe entry", seq))
            .transpose()?,
    };
    seen.duplicate_at(accept.now_ms)
        .ok_or_else(|| Failure::Again("a dedupe key expired meanwhile".to_owned()))
}

/// One event of an accept batch, numbered `seq` if it is new: a duplicate, or a new inbox
/// item (with its conversation and, for a new conversation or `/new`, its thread).
async fn accept_one(
    tx: &Transaction<'_>,
    accept: &Accept,
    seq: u64,
    conversations: &mut BatchConversations,
) -> Result<Accepted, Failure> {
    let conversation = accept.event.conversation.as_str();
    let (current, stored) = conversations
        .0
        .get(conversation)
        .cloned()
        .unwrap_or((None, false));
    let (record, fresh) = rules::next_conversation(current, accept);
    let accept_row = AcceptRow::of(accept, &record.thread_id, seq)?;
    if exec(tx, ACCEPT_SQL, &accept_row.params()).await? == 0 {
        return duplicate(tx, accept).await;
    }
    // The conversation changes only when it starts a thread.
    if let Some(thread) = fresh {
        save_thread(tx, &thread).await?;
        put_conversation(tx, &record, stored).await?;
        conversations
            .0
            .insert(conversation.to_owned(), (Some(record), true));
    }
    Ok(Accepted::New(accept_row.item))
}

/// The rows of a batch whose events all go to the current thread of a stored conversation,
/// each with its own key; `None` for any other batch. Such events change nothing but their
/// own rows, so their statements may be sent together.
fn independent_rows<'a>(
    accepts: &'a [Accept],
    seqs: &[u64],
    conversations: &BatchConversations,
) -> Result<Option<Vec<AcceptRow<'a>>>, StoreError> {
    let mut keys = HashSet::with_capacity(accepts.len());
    let mut accept_rows = Vec::with_capacity(accepts.len());
    for (accept, seq) in accepts.iter().zip(seqs) {
        let conversation = accept.event.conversation.as_str();
        let current = match conversations.0.get(conversation) {
            Some((Some(record), true)) if accept.thread == ThreadChoice::Current => record,
            _ => return Ok(None),
        };
        if !keys.insert((conversation, accept.event.event_id.as_str())) {
            return Ok(None);
        }
        accept_rows.push(AcceptRow::of(accept, &current.thread_id, *seq)?);
    }
    Ok(Some(accept_rows))
}

/// Accepts independent events ([`independent_rows`]): their statements are sent at once
/// (the connection pipelines them), so a batch costs about one round trip, not one each.
async fn accept_independent(
    tx: &Transaction<'_>,
    accepts: &[Accept],
    accept_rows: Vec<AcceptRow<'_>>,
) -> Result<Vec<Accepted>, Failure> {
    let statement = tx.prepare_cached(ACCEPT_SQL).await?;
    let taken = futures_util::future::try_join_all(
        accept_rows
            .iter()
            .map(|accept_row| tx.execute_raw(&statement, accept_row.params())),
    )
    .await?;
    let mut outcomes = Vec::with_capacity(accepts.len());
    for ((accept, accept_row), taken) in accepts.iter().zip(accept_rows).zip(taken) {
        outcomes.push(if taken == 0 {
            duplicate(tx, accept).await?
        } else {
            Accepted::New(accept_row.item)
        });
    }
    Ok(outcomes)
}

/// Reads, changes and writes back inbox item `seq`, locked meanwhile.
async fn update_inbox(
    tx: &Transaction<'_>,
    seq: u64,
    change: impl FnOnce(&mut InboxItem),
) -> Result<InboxItem, Failure> {
    let key = int(seq)?;
    let found = row(
        tx,
        "SELECT record FROM antler_inbox WHERE seq = $1 FOR UPDATE",
        &[&key],
    )
    .await?
    .ok_or_else(|| missing(InboxItem::WHAT, seq))?;
    let mut item = InboxItem::from_record(get(&found, 0)?)?;
    change(&mut item);
    exec(
        tx,
        "UPDATE antler_inbox SET status = $2, record = $3 WHERE seq = $1",
        &[&key, &inbox_status(item.status), &item.to_record()?],
    )
    .await?;
    Ok(item)
}

/// A finish whose inbox item is gone already: this replica's own earlier attempt committed
/// (its answer was lost), or another replica finished the item after taking the
/// conversation over. Only the first may write again (nothing changes: the writes are
/// idempotent), so the conversation must still be this replica's.
async fn ensure_finished_here(
    tx: &Transaction<'_>,
    owner: Option<&str>,
    finish: &FinishTurn,
) -> Result<(), Failure> {
    let conversation = match (finish.replies.first(), &finish.thread) {
        (Some(reply), _) => Some(reply.conversation.as_str().to_owned()),
        (None, Some(thread)) => row(
            tx,
            "SELECT conversation FROM antler_threads WHERE id = $1",
            &[&thread.id],
        )
        .await?
        .map(|row| get::<String>(&row, 0))
        .transpose()?,
        (None, None) => None,
    };
    match conversation {
        Some(conversation) => ensure_held(tx, owner, &conversation).await,
        None => Ok(()),
    }
}

/// Reads, changes and writes back outbox item `seq`, locked meanwhile, keeping the pending
/// count in step.
async fn update_outbox(
    tx: &Transaction<'_>,
    seq: u64,
    change: impl FnOnce(&mut OutboxItem),
) -> Result<OutboxItem, Failure> {
    let key = int(seq)?;
    let found = row(
        tx,
        "SELECT record FROM antler_outbox WHERE seq = $1 FOR UPDATE",
        &[&key],
    )
    .await?
    .ok_or_else(|| missing(OutboxItem::WHAT, seq))?;
    let mut item = OutboxItem::from_record(get(&found, 0)?)?;
    let was_pending = item.status == OutboxStatus::Pending;
    change(&mut item);
    let finished = item.finished_at_ms.map(int).transpose()?;
    exec(
        tx,
        "UPDATE antler_outbox SET status = $2, finished_at_ms = $3, record = $4 WHERE seq = $1",
        &[
            &key,
            &outbox_status(item.status),
            &finished,
            &item.to_record()?,
        ],
    )
    .await?;
    let is_pending = item.status == OutboxStatus::Pending;
    if was_pending && !is_pending {
        count(tx, 0, -1).await?;
    } else if is_pending && !was_pending {
        count(tx, 0, 1).await?;
    }
    Ok(item)
}

#[async_trait::async_trait]
impl InboxStore for PgStore {
    async fn accept_batch(&self, accepts: Vec<Accept>) -> Result<Vec<Accepted>, StoreError> {
        if accepts.is_empty() {
            return Ok(Vec::new());
        }
        transaction!(self, |tx| {
            let mut conversations = BatchConversations::lock(&tx, &accepts).await?;
            let seqs = draw_seqs(&tx, accepts.len()).await?;
            let outcomes = match independent_rows(&accepts, &seqs, &conversations)? {
                Some(accept_rows) => accept_independent(&tx, &accepts, accept_rows).await?,
                None => {
                    let mut outcomes = Vec::with_capacity(accepts.len());
                    for (accept, seq) in accepts.iter().zip(seqs) {
                        outcomes.push(accept_one(&tx, accept, seq, &mut conversations).await?);
                    }
                    outcomes
                }
            };
            let new = outcomes
                .iter()
                .filter(|o| matches!(o, Accepted::New(_)))
                .count();
            count(&tx, new as i64, 0).await?;
            Ok(outcomes)
        })
    }

    async fn inbox(&self) -> Result<Vec<InboxItem>, StoreError> {
        read!(self, |db| {
            rows(&db, "SELECT record FROM antler_inbox ORDER BY seq", &[])
                .await?
                .iter()
                .map(|row| Ok(InboxItem::from_record(get(row, 0)?)?))
                .collect::<Result<Vec<_>, Failure>>()
        })
    }

    async fn start_turn(&self, seq: u64) -> Result<InboxItem, StoreError> {
        let owner = self.owner.as_deref();
        transaction!(self, |tx| {
            let item = update_inbox(&tx, seq, rules::start_turn).await?;
            ensure_held(&tx, owner, item.event.conversation.as_str()).await?;
            Ok(item)
        })
    }

    async fn release_turn(&self, seq: u64) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            update_inbox(&tx, seq, rules::release_turn).await.map(drop)
        })
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
        let owner = self.owner.as_deref();
        transaction!(self, |tx| {
            let mut removed = 0;
            let mut added = 0;
            for (finish, items) in finishes.iter().zip(&items) {
                let seqs = std::iter::once(finish.inbox_seq)
                    .chain(finish.absorbed.iter().copied())
                    .map(int)
                    .collect::<Result<Vec<i64>, _>>()?;
                let gone = rows(
                    &tx,
                    "DELETE FROM antler_inbox WHERE seq = ANY($1) RETURNING conversation",
                    &[&seqs],
                )
                .await?;
                removed += gone.len() as u64;
                if owner.is_some() {
                    // Only the replica holding the conversation writes its turn: one that
                    // stalled past its mark must not write over what its successor ran.
                    match gone.first() {
                        Some(row) => ensure_held(&tx, owner, get(row, 0)?).await?,
                        None => ensure_finished_here(&tx, owner, finish).await?,
                    }
                }
                if let Some(thread) = &finish.thread {
                    save_thread(&tx, thread).await?;
                }
                if let Some(update) = &finish.memory_update {
                    queue_update(&tx, update).await?;
                }
                for item in items {
                    // A retry of a finish that committed after all keeps what is there.
                    added += exec(
                        &tx,
                        "INSERT INTO antler_outbox \
                         (seq, inbox_seq, conversation, status, created_at_ms, finished_at_ms, record) \
                         VALUES ($1, $2, $3, $4, $5, NULL, $6) ON CONFLICT (seq) DO NOTHING",
                        &[
                            &int(item.seq)?,
                            &int(finish.inbox_seq)?,
                            &item.message.conversation.as_str(),
                            &outbox_status(item.status),
                            &int(item.created_at_ms)?,
                            &item.to_record()?,
                        ],
                    )
                    .await?;
                }
            }
            count(&tx, -(removed as i64), added as i64).await?;
            Ok(())
        })?;
        Ok(items)
    }

    async fn save_draft(&self, seq: u64, draft: &Receipt) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            update_inbox(&tx, seq, |item| item.draft = Some(draft.clone()))
                .await
                .map(drop)
        })
    }
}

#[async_trait::async_trait]
impl ThreadStore for PgStore {
    async fn checkpoint_thread(&self, thread: &mut ThreadState) -> Result<(), StoreError> {
        let saving = &*thread;
        transaction!(self, |tx| { save_thread(&tx, saving).await })?;
        thread.saved_messages = thread.messages.len();
        Ok(())
    }

    async fn conversation(&self, key: &str) -> Result<Option<ConversationRecord>, StoreError> {
        read!(self, |db| {
            row(
                &db,
                "SELECT record::text FROM antler_conversations WHERE key = $1",
                &[&key],
            )
            .await?
            .map(|row| json("conversation", &row, 0))
            .transpose()
        })
    }

    async fn conversations(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ConversationRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        read!(self, |db| {
            rows(
                &db,
                "SELECT record::text FROM antler_conversations \
                 WHERE $1::text IS NULL OR key > $1 ORDER BY key LIMIT $2",
                &[&after, &limit],
            )
            .await?
            .iter()
            .map(|row| json("conversation", row, 0))
            .collect()
        })
    }

    async fn move_conversation(&self, chat_move: &ChatMove) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            // Both locked in key order, so two moves never wait for each other in a circle.
            let keys = [chat_move.from.as_str(), chat_move.to.as_str()];
            let found = rows(
                &tx,
                "SELECT key, record::text FROM antler_conversations WHERE key = ANY($1) \
                 ORDER BY key FOR UPDATE",
                &[&keys.as_slice()],
            )
            .await?;
            let mut from = None;
            let mut to = None;
            for row in &found {
                let key: &str = get(row, 0)?;
                let record: ConversationRecord = json("conversation", row, 1)?;
                if key == chat_move.to.as_str() {
                    to = Some(record);
                } else {
                    from = Some(record);
                }
            }
            let existed = to.is_some();
            if let Some(record) = rules::moved_conversation(from, to, chat_move) {
                put_conversation(&tx, &record, existed).await?;
            }
            Ok(())
        })
    }

    async fn thread(&self, id: &str) -> Result<Option<ThreadState>, StoreError> {
        // One snapshot for the metadata and the messages: a reader never pairs new messages
        // with old metadata while a turn commits.
        transaction!(self, tokio_postgres::IsolationLevel::RepeatableRead, |tx| {
            let Some(meta) = row(
                &tx,
                "SELECT meta::text FROM antler_threads WHERE id = $1",
                &[&id],
            )
            .await?
            else {
                return Ok(None);
            };
            let mut thread: ThreadState = json("thread", &meta, 0)?;
            let messages = rows(
                &tx,
                "SELECT record FROM antler_messages WHERE thread_id = $1 ORDER BY position",
                &[&id],
            )
            .await?;
            thread.messages = messages
                .iter()
                .map(|row| Ok(ChatMessage::from_record(get(row, 0)?)?))
                .collect::<Result<Vec<_>, Failure>>()?;
            thread.saved_messages = thread.messages.len();
            Ok(Some(thread))
        })
    }
}

#[async_trait::async_trait]
impl OutboxStore for PgStore {
    async fn outbox_pending(&self) -> Result<Vec<OutboxItem>, StoreError> {
        read!(self, |db| {
            outbox_items(
                &rows(
                    &db,
                    "SELECT record FROM antler_outbox WHERE status = 'pending' ORDER BY seq",
                    &[],
                )
                .await?,
            )
        })
    }

    async fn outbox_item(&self, seq: u64) -> Result<Option<OutboxItem>, StoreError> {
        read!(self, |db| {
            let found = rows(
                &db,
                "SELECT record FROM antler_outbox WHERE seq = $1",
                &[&int(seq)?],
            )
            .await?;
            Ok(outbox_items(&found)?.pop())
        })
    }

    async fn replies(&self, inbox_seq: u64) -> Result<Vec<OutboxItem>, StoreError> {
        let Some(first) = outbox_seq(inbox_seq, 0) else {
            return Ok(Vec::new());
        };
        let (first, end) = (
            int(first)?,
            int(first.saturating_add(MAX_REPLIES_PER_ITEM))?,
        );
        read!(self, |db| {
            outbox_items(
                &rows(
                    &db,
                    "SELECT record FROM antler_outbox WHERE seq >= $1 AND seq < $2 ORDER BY seq",
                    &[&first, &end],
                )
                .await?,
            )
        })
    }

    async fn outbox_recent(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        read!(self, |db| {
            outbox_items(
                &rows(
                    &db,
                    "SELECT record FROM antler_outbox ORDER BY seq DESC LIMIT $1",
                    &[&limit],
                )
                .await?,
            )
        })
    }

    async fn requeue_delivery(&self, seq: u64) -> Result<OutboxItem, StoreError> {
        transaction!(self, |tx| {
            update_outbox(&tx, seq, |item| {
                rules::requeued(item);
            })
            .await
        })
    }

    async fn delivery_failed(
        &self,
        seq: u64,
        error: &str,
        give_up: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        transaction!(self, |tx| {
            update_outbox(&tx, seq, |item| {
                rules::delivery_failed(item, error, give_up, now_ms);
            })
            .await
        })
    }

    async fn part_delivered(
        &self,
        seq: u64,
        receipt: Receipt,
        complete: bool,
        now_ms: u64,
    ) -> Result<OutboxItem, StoreError> {
        transaction!(self, |tx| {
            update_outbox(&tx, seq, |item| {
                rules::part_delivered(item, &receipt, complete, now_ms);
            })
            .await
        })
    }
}
