//! [`CopyStore`] on PostgreSQL: each kind is one table read in primary-key order (keyset
//! pages), each page written in one transaction with the columns the store's own writes fill.

use deadpool_postgres::Transaction;
use tokio_postgres::Row;

use super::inbox::{inbox_status, outbox_status};
use super::registry::{STORE_LEASE, put_subagent};
use super::{
    Failure, PgStore, bound, exec, get, int, json, read, row, rows, to_json, transaction, uint,
};
use crate::agent::approvals::ApprovalRecord;
use crate::store::copy::{CopyItem, CopyKind, CopyStore};
use crate::store::records::Record;
use crate::store::rules::DedupeEntry;
use crate::store::{MAX_REPLIES_PER_ITEM, StoreError};

/// The page after `after`: `SELECT`s whose first parameters are the last key of the previous
/// page (NULL: from the start) and whose last is the limit.
fn export_sql(kind: CopyKind) -> &'static str {
    match kind {
        CopyKind::Conversations => {
            "SELECT record::text FROM antler_conversations WHERE ($1::text IS NULL OR key > $1) \
             ORDER BY key LIMIT $2"
        }
        CopyKind::Threads => {
            "SELECT meta::text FROM antler_threads WHERE ($1::text IS NULL OR id > $1) \
             ORDER BY id LIMIT $2"
        }
        CopyKind::Messages => {
            "SELECT thread_id, position, record FROM antler_messages \
             WHERE ($1::text IS NULL OR (thread_id, position) > ($1, $2::bigint)) \
             ORDER BY thread_id, position LIMIT $3"
        }
        CopyKind::Inbox => "SELECT record FROM antler_inbox WHERE seq > $1 ORDER BY seq LIMIT $2",
        CopyKind::Outbox => "SELECT record FROM antler_outbox WHERE seq > $1 ORDER BY seq LIMIT $2",
        CopyKind::Dedupe => {
            "SELECT conversation, event_id, expires_at_ms, thread_id, seq FROM antler_dedupe \
             WHERE expires_at_ms > $4 \
             AND ($1::text IS NULL OR (conversation, event_id) > ($1, $2::text)) \
             ORDER BY conversation, event_id LIMIT $3"
        }
        CopyKind::Memory => {
            "SELECT user_key, document::text FROM antler_memory \
             WHERE ($1::text IS NULL OR user_key > $1) ORDER BY user_key LIMIT $2"
        }
        CopyKind::MemoryQueue => {
            "SELECT record::text FROM antler_memory_queue \
             WHERE ($1::text IS NULL OR (user_id, thread_id) > ($1, $2::text)) \
             ORDER BY user_id, thread_id LIMIT $3"
        }
        CopyKind::Subagents => {
            "SELECT record::text FROM antler_subagents WHERE ($1::text IS NULL OR id > $1) \
             ORDER BY id LIMIT $2"
        }
        CopyKind::SubagentCalls => {
            "SELECT thread_id, turn, call_id, subagent_id FROM antler_subagent_calls \
             WHERE ($1::text IS NULL OR (thread_id, turn, call_id) > ($1, $2::bigint, $3::text)) \
             ORDER BY thread_id, turn, call_id LIMIT $4"
        }
        CopyKind::Skills => {
            "SELECT name, enabled FROM antler_skills WHERE ($1::text IS NULL OR name > $1) \
             ORDER BY name LIMIT $2"
        }
        CopyKind::PairingRequests => {
            "SELECT record::text FROM antler_pairing_requests \
             WHERE ($1::text IS NULL OR (channel, user_id) > ($1, $2::text)) \
             ORDER BY channel, user_id LIMIT $3"
        }
        CopyKind::PairedUsers => {
            "SELECT record::text FROM antler_paired_users \
             WHERE ($1::text IS NULL OR (channel, user_id) > ($1, $2::text)) \
             ORDER BY channel, user_id LIMIT $3"
        }
        CopyKind::Schedules => {
            "SELECT record::text FROM antler_schedules WHERE ($1::text IS NULL OR name > $1) \
             ORDER BY name LIMIT $2"
        }
        CopyKind::ScheduleMarks => {
            "SELECT name, fire_ms FROM antler_schedule_marks \
             WHERE ($1::text IS NULL OR name > $1) ORDER BY name LIMIT $2"
        }
        CopyKind::Approvals => {
            "SELECT record::text FROM antler_approvals WHERE ($1::text IS NULL OR id > $1) \
             ORDER BY id LIMIT $2"
        }
    }
}

/// The key of `after` as the parameters of [`export_sql`]: text parts, then numbers.
struct After {
    first: Option<String>,
    second: Option<String>,
    number: i64,
}

fn after_of(after: Option<&CopyItem>) -> Result<After, StoreError> {
    let text = |first: &str, second: Option<&str>| After {
        first: Some(first.to_owned()),
        second: second.map(str::to_owned),
        number: 0,
    };
    let Some(item) = after else {
        return Ok(After {
            first: None,
            second: None,
            number: -1,
        });
    };
    Ok(match item {
        CopyItem::Conversation(record) => text(&record.key, None),
        CopyItem::Thread(thread) => text(&thread.id, None),
        CopyItem::Message {
            thread_id,
            position,
            ..
        } => After {
            number: int(*position)?,
            ..text(thread_id, None)
        },
        CopyItem::Inbox(item) => After {
            first: None,
            second: None,
            number: int(item.seq)?,
        },
        CopyItem::Outbox(item) => After {
            first: None,
            second: None,
            number: int(item.seq)?,
        },
        CopyItem::Dedupe {
            conversation,
            event_id,
            ..
        } => text(conversation, Some(event_id)),
        CopyItem::Memory { user_key, .. } => text(user_key, None),
        CopyItem::MemoryUpdate(update) => text(&update.user_id, Some(&update.thread_id)),
        CopyItem::Subagent(record) => text(&record.id, None),
        CopyItem::SubagentCall {
            thread_id,
            turn,
            call_id,
            ..
        } => After {
            number: int(*turn)?,
            ..text(thread_id, Some(call_id))
        },
        CopyItem::Skill { name, .. } | CopyItem::ScheduleMark { name, .. } => text(name, None),
        CopyItem::PairingRequest(request) => text(&request.channel, Some(&request.user_id)),
        CopyItem::PairedUser(user) => text(&user.channel, Some(&user.user_id)),
        CopyItem::Schedule(record) => text(&record.name, None),
        CopyItem::Approval(record) => text(&record.id, None),
    })
}

/// The record of `kind` in `row` (as [`export_sql`] selects it).
fn item_of(kind: CopyKind, row: &Row) -> Result<CopyItem, Failure> {
    Ok(match kind {
        CopyKind::Conversations => CopyItem::Conversation(json("conversation", row, 0)?),
        CopyKind::Threads => CopyItem::Thread(json("thread", row, 0)?),
        CopyKind::Messages => CopyItem::Message {
            thread_id: get(row, 0)?,
            position: uint("message", get(row, 1)?)?,
            record: get(row, 2)?,
        },
        CopyKind::Inbox => CopyItem::Inbox(Record::from_record(get::<&[u8]>(row, 0)?)?),
        CopyKind::Outbox => CopyItem::Outbox(Record::from_record(get::<&[u8]>(row, 0)?)?),
        CopyKind::Dedupe => CopyItem::Dedupe {
            conversation: get(row, 0)?,
            event_id: get(row, 1)?,
            entry: DedupeEntry {
                expires_at_ms: uint("dedupe key", get(row, 2)?)?,
                thread_id: get(row, 3)?,
                seq: get::<Option<i64>>(row, 4)?
                    .map(|seq| uint("dedupe key", seq))
                    .transpose()?,
            },
        },
        CopyKind::Memory => CopyItem::Memory {
            user_key: get(row, 0)?,
            document: json("memory document", row, 1)?,
        },
        CopyKind::MemoryQueue => CopyItem::MemoryUpdate(json("memory update", row, 0)?),
        CopyKind::Subagents => CopyItem::Subagent(json("subagent", row, 0)?),
        CopyKind::SubagentCalls => CopyItem::SubagentCall {
            thread_id: get(row, 0)?,
            turn: uint("subagent call", get(row, 1)?)?,
            call_id: get(row, 2)?,
            subagent_id: get(row, 3)?,
        },
        CopyKind::Skills => CopyItem::Skill {
            name: get(row, 0)?,
            on: get(row, 1)?,
        },
        CopyKind::PairingRequests => CopyItem::PairingRequest(json("pairing request", row, 0)?),
        CopyKind::PairedUsers => CopyItem::PairedUser(json("paired user", row, 0)?),
        CopyKind::Schedules => CopyItem::Schedule(json("schedule", row, 0)?),
        CopyKind::ScheduleMarks => CopyItem::ScheduleMark {
            name: get(row, 0)?,
            fire_ms: uint("schedule mark", get(row, 1)?)?,
        },
        CopyKind::Approvals => CopyItem::Approval(json::<ApprovalRecord>("approval", row, 0)?),
    })
}

/// Writes one record with the columns the store's own writes fill, replacing a row with the
/// same key.
async fn put(tx: &Transaction<'_>, item: &CopyItem) -> Result<(), Failure> {
    match item {
        CopyItem::Conversation(record) => {
            exec(
                tx,
                "INSERT INTO antler_conversations (key, thread_id, record) \
                 VALUES ($1, $2, $3::text::jsonb) ON CONFLICT (key) DO UPDATE SET \
                 thread_id = EXCLUDED.thread_id, record = EXCLUDED.record",
                &[
                    &record.key,
                    &record.thread_id,
                    &to_json("conversation", record)?,
                ],
            )
            .await?;
        }
        CopyItem::Thread(thread) => {
            exec(
                tx,
                "INSERT INTO antler_threads (id, conversation, updated_at_ms, meta) \
                 VALUES ($1, $2, $3, $4::text::jsonb) ON CONFLICT (id) DO UPDATE SET \
                 conversation = EXCLUDED.conversation, updated_at_ms = EXCLUDED.updated_at_ms, \
                 meta = EXCLUDED.meta",
                &[
                    &thread.id,
                    &thread.conversation,
                    &int(thread.updated_at_ms)?,
                    &to_json("thread", thread)?,
                ],
            )
            .await?;
        }
        CopyItem::Message {
            thread_id,
            position,
            record,
        } => {
            exec(
                tx,
                "INSERT INTO antler_messages (thread_id, position, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (thread_id, position) DO UPDATE SET record = EXCLUDED.record",
                &[thread_id, &int(*position)?, record],
            )
            .await?;
        }
        CopyItem::Inbox(item) => {
            exec(
                tx,
                "INSERT INTO antler_inbox (seq, conversation, thread_id, status, accepted_at_ms, \
                 record) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (seq) DO UPDATE SET \
                 conversation = EXCLUDED.conversation, thread_id = EXCLUDED.thread_id, \
                 status = EXCLUDED.status, accepted_at_ms = EXCLUDED.accepted_at_ms, \
                 record = EXCLUDED.record",
                &[
                    &int(item.seq)?,
                    &item.event.conversation.as_str(),
                    &item.thread_id,
                    &inbox_status(item.status),
                    &int(item.accepted_at_ms)?,
                    &item.to_record()?,
                ],
            )
            .await?;
        }
        CopyItem::Outbox(item) => {
            exec(
                tx,
                "INSERT INTO antler_outbox (seq, inbox_seq, conversation, status, created_at_ms, \
                 finished_at_ms, record) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (seq) DO UPDATE SET inbox_seq = EXCLUDED.inbox_seq, \
                 conversation = EXCLUDED.conversation, status = EXCLUDED.status, \
                 created_at_ms = EXCLUDED.created_at_ms, finished_at_ms = EXCLUDED.finished_at_ms, \
                 record = EXCLUDED.record",
                &[
                    &int(item.seq)?,
                    &int(item.seq / MAX_REPLIES_PER_ITEM)?,
                    &item.message.conversation.as_str(),
                    &outbox_status(item.status),
                    &int(item.created_at_ms)?,
                    &item.finished_at_ms.map(int).transpose()?,
                    &item.to_record()?,
                ],
            )
            .await?;
        }
        CopyItem::Dedupe {
            conversation,
            event_id,
            entry,
        } => {
            exec(
                tx,
                "INSERT INTO antler_dedupe (conversation, event_id, expires_at_ms, thread_id, seq) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (conversation, event_id) DO UPDATE SET \
                 expires_at_ms = EXCLUDED.expires_at_ms, thread_id = EXCLUDED.thread_id, \
                 seq = EXCLUDED.seq",
                &[
                    conversation,
                    event_id,
                    &int(entry.expires_at_ms)?,
                    &entry.thread_id,
                    &entry.seq.map(int).transpose()?,
                ],
            )
            .await?;
        }
        CopyItem::Memory { user_key, document } => {
            exec(
                tx,
                "INSERT INTO antler_memory (user_key, document) VALUES ($1, $2::text::jsonb) \
                 ON CONFLICT (user_key) DO UPDATE SET document = EXCLUDED.document",
                &[user_key, &to_json("memory document", document)?],
            )
            .await?;
        }
        CopyItem::MemoryUpdate(update) => {
            exec(
                tx,
                "INSERT INTO antler_memory_queue (user_id, thread_id, enqueued_at_ms, due_at_ms, \
                 record) VALUES ($1, $2, $3, $4, $5::text::jsonb) \
                 ON CONFLICT (user_id, thread_id) DO UPDATE SET \
                 enqueued_at_ms = EXCLUDED.enqueued_at_ms, due_at_ms = EXCLUDED.due_at_ms, \
                 record = EXCLUDED.record",
                &[
                    &update.user_id,
                    &update.thread_id,
                    &int(update.enqueued_at_ms)?,
                    &int(update.due_at_ms)?,
                    &to_json("memory update", update)?,
                ],
            )
            .await?;
        }
        CopyItem::Subagent(record) => put_subagent(tx, record).await?,
        CopyItem::SubagentCall {
            thread_id,
            turn,
            call_id,
            subagent_id,
        } => {
            exec(
                tx,
                "INSERT INTO antler_subagent_calls (thread_id, turn, call_id, subagent_id) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (thread_id, turn, call_id) \
                 DO UPDATE SET subagent_id = EXCLUDED.subagent_id",
                &[thread_id, &int(*turn)?, call_id, subagent_id],
            )
            .await?;
        }
        CopyItem::Skill { name, on } => {
            exec(
                tx,
                "INSERT INTO antler_skills (name, enabled) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET enabled = EXCLUDED.enabled",
                &[name, on],
            )
            .await?;
        }
        CopyItem::PairingRequest(request) => {
            exec(
                tx,
                "INSERT INTO antler_pairing_requests (channel, user_id, record) \
                 VALUES ($1, $2, $3::text::jsonb) \
                 ON CONFLICT (channel, user_id) DO UPDATE SET record = EXCLUDED.record",
                &[
                    &request.channel,
                    &request.user_id,
                    &to_json("pairing request", request)?,
                ],
            )
            .await?;
        }
        CopyItem::PairedUser(user) => {
            exec(
                tx,
                "INSERT INTO antler_paired_users (channel, user_id, record) \
                 VALUES ($1, $2, $3::text::jsonb) \
                 ON CONFLICT (channel, user_id) DO UPDATE SET record = EXCLUDED.record",
                &[&user.channel, &user.user_id, &to_json("paired user", user)?],
            )
            .await?;
        }
        CopyItem::Schedule(record) => {
            exec(
                tx,
                "INSERT INTO antler_schedules (name, record) VALUES ($1, $2::text::jsonb) \
                 ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record",
                &[&record.name, &to_json("schedule", record)?],
            )
            .await?;
        }
        CopyItem::ScheduleMark { name, fire_ms } => {
            exec(
                tx,
                "INSERT INTO antler_schedule_marks (name, fire_ms) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET fire_ms = EXCLUDED.fire_ms",
                &[name, &int(*fire_ms)?],
            )
            .await?;
        }
        CopyItem::Approval(record) => {
            exec(
                tx,
                "INSERT INTO antler_approvals (id, conversation, thread_id, call_key, state, \
                 queued, created_at_ms, decided_at_ms, record) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb) \
                 ON CONFLICT (id) DO UPDATE SET conversation = EXCLUDED.conversation, \
                 thread_id = EXCLUDED.thread_id, call_key = EXCLUDED.call_key, \
                 state = EXCLUDED.state, queued = EXCLUDED.queued, \
                 created_at_ms = EXCLUDED.created_at_ms, decided_at_ms = EXCLUDED.decided_at_ms, \
                 record = EXCLUDED.record",
                &[
                    &record.id,
                    &record.conversation,
                    &record.thread_id,
                    &record.call_key(),
                    &record.state.as_str(),
                    &record.queued,
                    &int(record.created_at_ms)?,
                    &record.decided_at_ms.map(int).transpose()?,
                    &to_json("approval", record)?,
                ],
            )
            .await?;
        }
    }
    Ok(())
}

impl PgStore {
    /// [`StoreError::Leased`] when another antler's lease on the store is live at `now_ms`:
    /// it is working on the database.
    pub(crate) async fn refuse_live_lease(&self, now_ms: u64) -> Result<(), StoreError> {
        let lease = read!(self, |db| {
            let Some(found) = row(
                &db,
                "SELECT owner, until_ms, released FROM antler_leases WHERE name = $1",
                &[&STORE_LEASE],
            )
            .await?
            else {
                return Ok(None);
            };
            let owner: String = get(&found, 0)?;
            let until_ms = uint("lease", get(&found, 1)?)?;
            let released: bool = get(&found, 2)?;
            Ok(Some((owner, until_ms, released)))
        })?;
        match lease {
            Some((owner, until_ms, false)) if until_ms > now_ms => {
                return Err(StoreError::Leased {
                    owner,
                    remaining_ms: until_ms - now_ms,
                });
            }
            _ => {}
        }
        // Any replica alive works on the store too (its mark, by the database's clock).
        let replica = read!(self, |db| {
            row(
                &db,
                "SELECT owner, expires_at_ms - (extract(epoch from clock_timestamp()) * 1000)::bigint \
                 FROM antler_replicas WHERE expires_at_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint \
                 ORDER BY owner LIMIT 1",
                &[],
            )
            .await?
            .map(|found| Ok((get::<String>(&found, 0)?, get::<i64>(&found, 1)?)))
            .transpose()
        })?;
        match replica {
            Some((owner, left)) => Err(StoreError::Leased {
                owner,
                remaining_ms: u64::try_from(left).unwrap_or(0),
            }),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl CopyStore for PgStore {
    async fn export_page(
        &self,
        kind: CopyKind,
        after: Option<&CopyItem>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<CopyItem>, StoreError> {
        let after = after_of(after)?;
        let limit = bound(limit as u64);
        let now = bound(now_ms);
        read!(self, |db| {
            let sql = export_sql(kind);
            let found = match kind {
                CopyKind::Inbox | CopyKind::Outbox => {
                    rows(&db, sql, &[&after.number, &limit]).await?
                }
                CopyKind::Messages => {
                    rows(&db, sql, &[&after.first, &after.number, &limit]).await?
                }
                CopyKind::Dedupe => {
                    rows(&db, sql, &[&after.first, &after.second, &limit, &now]).await?
                }
                CopyKind::MemoryQueue | CopyKind::PairingRequests | CopyKind::PairedUsers => {
                    rows(&db, sql, &[&after.first, &after.second, &limit]).await?
                }
                CopyKind::SubagentCalls => {
                    rows(
                        &db,
                        sql,
                        &[&after.first, &after.number, &after.second, &limit],
                    )
                    .await?
                }
                _ => rows(&db, sql, &[&after.first, &limit]).await?,
            };
            found.iter().map(|row| item_of(kind, row)).collect()
        })
    }

    async fn import_page(&self, items: &[CopyItem]) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            for item in items {
                put(&tx, item).await?;
            }
            Ok(())
        })
    }

    async fn holds_conversations(&self) -> Result<bool, StoreError> {
        read!(self, |db| {
            Ok(row(&db, "SELECT 1 FROM antler_conversations LIMIT 1", &[])
                .await?
                .is_some())
        })
    }

    async fn finish_import(&self) -> Result<(), StoreError> {
        // Inbox numbers go on past the highest copied one, and the counts start from what
        // the tables hold (every shard's row but one zero). A commit is durable.
        transaction!(self, |tx| {
            exec(
                &tx,
                "SELECT setval('antler_inbox_seq', \
                 GREATEST((SELECT max(seq) FROM antler_inbox), \
                 (SELECT max(inbox_seq) FROM antler_outbox), \
                 (SELECT last_value FROM antler_inbox_seq), 1))",
                &[],
            )
            .await?;
            exec(
                &tx,
                "UPDATE antler_counters SET \
                 inbox = CASE WHEN shard = 0 THEN (SELECT count(*) FROM antler_inbox) ELSE 0 END, \
                 outbox_pending = CASE WHEN shard = 0 THEN \
                 (SELECT count(*) FROM antler_outbox WHERE status = 'pending') ELSE 0 END",
                &[],
            )
            .await?;
            Ok(())
        })
    }
}
