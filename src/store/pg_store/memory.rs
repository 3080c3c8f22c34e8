//! Memory documents and the memory update queue on PostgreSQL.

use deadpool_postgres::Transaction;

use super::{
    Failure, PgStore, all_json, bound, exec, get, int, json, read, row, rows, to_json, transaction,
};
use crate::agent::memory::{MemoryDocument, MemoryUpdate};
use crate::store::rules;
use crate::store::{ClearedMemory, MemoryQueueStore, MemoryStore, StoreError};

/// The queued update of `update`'s (user, thread), locked until the transaction ends.
async fn locked_update(
    tx: &Transaction<'_>,
    update: &MemoryUpdate,
) -> Result<Option<MemoryUpdate>, Failure> {
    row(
        tx,
        "SELECT record::text FROM antler_memory_queue WHERE user_id = $1 AND thread_id = $2 \
         FOR UPDATE",
        &[&update.user_id, &update.thread_id],
    )
    .await?
    .map(|row| json("memory update", &row, 0))
    .transpose()
}

/// Queues `update`, taking over the unread messages of the one it replaces
/// (`rules::queued_update`).
pub(super) async fn queue_update(
    tx: &Transaction<'_>,
    update: &MemoryUpdate,
) -> Result<(), Failure> {
    let queued = locked_update(tx, update).await?;
    let next = rules::queued_update(queued.as_ref(), update);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &next.user_id,
        &next.thread_id,
        &int(next.enqueued_at_ms)?,
        &int(next.due_at_ms)?,
        &to_json("memory update", &next)?,
    ];
    if queued.is_some() {
        exec(
            tx,
            "UPDATE antler_memory_queue SET enqueued_at_ms = $3, due_at_ms = $4, \
             record = $5::text::jsonb WHERE user_id = $1 AND thread_id = $2",
            &params,
        )
        .await?;
        return Ok(());
    }
    let inserted = exec(
        tx,
        "INSERT INTO antler_memory_queue (user_id, thread_id, enqueued_at_ms, due_at_ms, record) \
         VALUES ($1, $2, $3, $4, $5::text::jsonb) ON CONFLICT (user_id, thread_id) DO NOTHING",
        &params,
    )
    .await?;
    if inserted == 0 {
        return Err(Failure::Again(
            "a memory update was queued meanwhile".to_owned(),
        ));
    }
    Ok(())
}

/// The document of `user_key`, locked until the transaction ends.
async fn locked_document(
    tx: &Transaction<'_>,
    user_key: &str,
) -> Result<Option<MemoryDocument>, Failure> {
    row(
        tx,
        "SELECT document::text FROM antler_memory WHERE user_key = $1 FOR UPDATE",
        &[&user_key],
    )
    .await?
    .map(|row| json("memory document", &row, 0))
    .transpose()
}

/// Stores (or with `None` deletes) the document of `user_key`. When there was none (nothing
/// locked), an insert that loses to a concurrent one runs the transaction again, so the
/// change is made on the document the other writer stored.
async fn write_document(
    tx: &Transaction<'_>,
    user_key: &str,
    existed: bool,
    next: Option<&MemoryDocument>,
) -> Result<(), Failure> {
    match (existed, next) {
        (false, None) => {}
        (true, None) => {
            exec(
                tx,
                "DELETE FROM antler_memory WHERE user_key = $1",
                &[&user_key],
            )
            .await?;
        }
        (true, Some(doc)) => {
            exec(
                tx,
                "UPDATE antler_memory SET document = $2::text::jsonb WHERE user_key = $1",
                &[&user_key, &to_json("memory document", doc)?],
            )
            .await?;
        }
        (false, Some(doc)) => {
            let inserted = exec(
                tx,
                "INSERT INTO antler_memory (user_key, document) VALUES ($1, $2::text::jsonb) \
                 ON CONFLICT (user_key) DO NOTHING",
                &[&user_key, &to_json("memory document", doc)?],
            )
            .await?;
            if inserted == 0 {
                return Err(Failure::Again(
                    "a memory document was stored meanwhile".to_owned(),
                ));
            }
        }
    }
    Ok(())
}

/// Whether `processed` is still queued as it was read; the entry stays locked.
async fn still_queued(tx: &Transaction<'_>, processed: &MemoryUpdate) -> Result<bool, Failure> {
    Ok(locked_update(tx, processed)
        .await?
        .is_some_and(|queued| rules::still_queued(&queued, processed)))
}

async fn remove_update(tx: &Transaction<'_>, update: &MemoryUpdate) -> Result<bool, Failure> {
    Ok(exec(
        tx,
        "DELETE FROM antler_memory_queue WHERE user_id = $1 AND thread_id = $2",
        &[&update.user_id, &update.thread_id],
    )
    .await?
        > 0)
}

#[async_trait::async_trait]
impl MemoryStore for PgStore {
    async fn memory(&self, user_id: &str) -> Result<Option<MemoryDocument>, StoreError> {
        read!(self, |db| {
            row(
                &db,
                "SELECT document::text FROM antler_memory WHERE user_key = $1",
                &[&user_id],
            )
            .await?
            .map(|row| json("memory document", &row, 0))
            .transpose()
        })
    }

    async fn put_memory(&self, user_id: &str, doc: &MemoryDocument) -> Result<(), StoreError> {
        let value = to_json("memory document", doc)?;
        transaction!(self, |tx| {
            exec(
                &tx,
                "INSERT INTO antler_memory (user_key, document) VALUES ($1, $2::text::jsonb) \
                 ON CONFLICT (user_key) DO UPDATE SET document = EXCLUDED.document",
                &[&user_id, &value],
            )
            .await
            .map(drop)
        })
    }

    async fn update_memory(
        &self,
        user_key: &str,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> Option<MemoryDocument> + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        transaction!(self, |tx| {
            let stored = locked_document(&tx, user_key).await?;
            let existed = stored.is_some();
            let next = change(stored);
            write_document(&tx, user_key, existed, next.as_ref()).await?;
            Ok(next)
        })
    }

    async fn clear_memory(
        &self,
        user_key: &str,
        queued_for: &[String],
    ) -> Result<ClearedMemory, StoreError> {
        transaction!(self, |tx| {
            let document = exec(
                &tx,
                "DELETE FROM antler_memory WHERE user_key = $1",
                &[&user_key],
            )
            .await?
                > 0;
            let updates = exec(
                &tx,
                "DELETE FROM antler_memory_queue WHERE user_id = ANY($1)",
                &[&queued_for],
            )
            .await?;
            Ok(ClearedMemory {
                document,
                updates: updates as usize,
            })
        })
    }

    async fn memory_keys(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = bound(limit as u64);
        read!(self, |db| {
            let found = rows(
                &db,
                "SELECT user_key FROM antler_memory WHERE $1::text IS NULL OR user_key > $1 \
                 ORDER BY user_key LIMIT $2",
                &[&after, &limit],
            )
            .await?;
            found
                .iter()
                .map(|row| get::<String>(row, 0))
                .collect::<Result<Vec<_>, _>>()
        })
    }
}

/// How long a replica has the memory updates it read before another may take them.
const MEMORY_CLAIM_MS: u64 = 60_000;

#[async_trait::async_trait]
impl MemoryQueueStore for PgStore {
    async fn queue_memory_update(&self, update: MemoryUpdate) -> Result<(), StoreError> {
        transaction!(self, |tx| { queue_update(&tx, &update).await })
    }

    async fn due_memory_updates(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<MemoryUpdate>, StoreError> {
        let (now, max) = (bound(now_ms), bound(limit as u64));
        // With replicas, each takes the updates it reads for a while (rows another replica
        // is taking are skipped): two replicas do not ask the model about the same
        // conversation. A flush at shutdown (`now_ms` far ahead) reads everything; applying
        // compares and swaps, so an update two replicas both answer is written once.
        if self.owner.is_some() && now_ms <= crate::now_ms().saturating_add(MEMORY_CLAIM_MS) {
            let claim = bound(MEMORY_CLAIM_MS);
            let queued: Vec<MemoryUpdate> = transaction!(self, |tx| {
                let found = rows(
                    &tx,
                    "WITH picked AS (SELECT user_id, thread_id FROM antler_memory_queue \
                     WHERE due_at_ms <= $1 ORDER BY enqueued_at_ms, user_id, thread_id \
                     LIMIT $2 FOR UPDATE SKIP LOCKED) \
                     UPDATE antler_memory_queue q SET due_at_ms = $1 + $3 FROM picked \
                     WHERE q.user_id = picked.user_id AND q.thread_id = picked.thread_id \
                     RETURNING q.record::text",
                    &[&now, &max, &claim],
                )
                .await?;
                all_json("memory update", &found)
            })?;
            return Ok(rules::due_updates(queued, now_ms, limit));
        }
        let queued: Vec<MemoryUpdate> = read!(self, |db| {
            let found = rows(
                &db,
                "SELECT record::text FROM antler_memory_queue WHERE due_at_ms <= $1 \
                 ORDER BY enqueued_at_ms, user_id, thread_id LIMIT $2",
                &[&now, &max],
            )
            .await?;
            all_json("memory update", &found)
        })?;
        Ok(rules::due_updates(queued, now_ms, limit))
    }

    async fn remove_memory_update(&self, processed: &MemoryUpdate) -> Result<bool, StoreError> {
        transaction!(self, |tx| {
            if !still_queued(&tx, processed).await? {
                return Ok(false);
            }
            remove_update(&tx, processed).await
        })
    }

    async fn apply_memory_update(
        &self,
        processed: &MemoryUpdate,
        change: &mut (dyn FnMut(Option<MemoryDocument>) -> MemoryDocument + Send),
    ) -> Result<Option<MemoryDocument>, StoreError> {
        transaction!(self, |tx| {
            if !still_queued(&tx, processed).await? {
                return Ok(None);
            }
            let stored = locked_document(&tx, &processed.user_id).await?;
            let existed = stored.is_some();
            let next = change(stored);
            write_document(&tx, &processed.user_id, existed, Some(&next)).await?;
            remove_update(&tx, processed).await?;
            Ok(Some(next))
        })
    }
}
