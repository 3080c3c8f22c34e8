//! Older layouts, migrated on open. Every step can run again after a crash halfway, with the
//! same result, and the schema version is written only after the last one.
//!
//! Schema 1 → 2:
//! - Threads were stored whole, messages inside; now the metadata stays in `threads` and each
//!   message is its own record in `messages`. A checkpoint's `checkpoint_of` becomes
//!   `running` (the turn's start is its last user message).
//! - Dedupe keys were `<conversation>:<event id>`, ambiguous when either part holds a `:`;
//!   now they are tuple-encoded. The conversation is read from the thread each entry names,
//!   so the split is exact. Generation trees get their length in the name.
//! - Outbox items were keyed by a counter; now by the inbox item they answer, recovered from
//!   their idempotency key (`<thread>:<inbox seq>:<index>`).
//!
//! Schema 2 → 3: the records written with every message (inbox items, dedupe entries, outbox
//! items, thread messages) were the domain types' JSON; now they are the store's own records
//! (`store::records`). A record already converted starts with its format byte and is left as
//! it is.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use sled::Transactional;

use super::{
    DEDUPE_PREFIX, DedupeEntry, OUTBOX_TREE, decode, encode, from_tx, generation_name, keys,
    parse_generation, seq_key,
};
use crate::agent::message::ChatMessage;
use crate::agent::thread::{RunningTurn, ThreadState};
use crate::store::records::{self, Record};
use crate::store::{InboxItem, OutboxItem, StoreError, outbox_seq};

/// Records converted per write while migrating: a large store is not held in memory whole.
const CONVERT_BATCH: usize = 1024;

/// The parts of a schema-1 thread record that schema 2 keeps elsewhere.
#[derive(Deserialize)]
struct LegacyThreadParts {
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    checkpoint_of: Option<u64>,
}

/// Migrates a schema-1 database in place.
pub(super) fn v1_to_v2(db: &sled::Db) -> Result<(), StoreError> {
    let threads = db.open_tree("threads")?;
    split_threads(&threads, &db.open_tree("messages")?)?;
    rekey_dedupe(db, &threads)?;
    rekey_outbox(db)?;
    db.flush()?;
    Ok(())
}

fn split_threads(threads: &sled::Tree, messages: &sled::Tree) -> Result<(), StoreError> {
    for entry in threads.iter() {
        let (id, bytes) = entry?;
        let legacy: LegacyThreadParts = decode("thread", &bytes)?;
        // Already split (a migration that crashed halfway): nothing to do.
        let Some(history) = legacy.messages else {
            continue;
        };
        let mut meta: ThreadState = decode("thread", &bytes)?;
        meta.running = legacy.checkpoint_of.map(|inbox_seq| RunningTurn {
            inbox_seq,
            start: history
                .iter()
                .rposition(|m| matches!(m, ChatMessage::User { .. }))
                .unwrap_or(0),
        });
        let id_text = String::from_utf8_lossy(&id).into_owned();
        let mut records = Vec::with_capacity(history.len());
        for (index, message) in history.iter().enumerate() {
            records.push((
                keys::with_index(&id_text, index as u64),
                encode("message", message)?,
            ));
        }
        let meta_bytes = encode("thread", &meta)?;
        (threads, messages)
            .transaction(|(threads, messages)| {
                for (key, value) in &records {
                    messages.insert(key.as_slice(), value.as_slice())?;
                }
                threads.insert(&id, meta_bytes.as_slice())?;
                Ok(())
            })
            .map_err(from_tx)?;
    }
    Ok(())
}

fn rekey_dedupe(db: &sled::Db, threads: &sled::Tree) -> Result<(), StoreError> {
    for name in db.tree_names() {
        let Some(start) = std::str::from_utf8(&name)
            .ok()
            .and_then(|n| n.strip_prefix(DEDUPE_PREFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let legacy = db.open_tree(&name)?;
        let mut entries = Vec::new();
        let mut last_expiry = start;
        for entry in legacy.iter() {
            let (key, bytes) = entry?;
            let seen: DedupeEntry = decode("dedupe entry", &bytes)?;
            let conversation = threads
                .get(seen.thread_id.as_bytes())?
                .map(|b| decode::<ThreadState>("thread", &b))
                .transpose()?
                .map(|t| t.conversation);
            let key = String::from_utf8_lossy(&key).into_owned();
            let event_id = conversation
                .as_deref()
                .and_then(|c| key.strip_prefix(c))
                .and_then(|rest| rest.strip_prefix(':'));
            let (Some(conversation), Some(event_id)) = (conversation.as_deref(), event_id) else {
                // Its thread is gone; the key cannot be split exactly, and nothing can be
                // redelivered into a thread that does not exist.
                continue;
            };
            last_expiry = last_expiry.max(seen.expires_at_ms);
            entries.push((
                keys::tuple(&[conversation.as_bytes(), event_id.as_bytes()]),
                bytes,
            ));
        }
        // The length is unknown; one that keeps the tree until its last key expires will do.
        let length = last_expiry.saturating_sub(start).div_ceil(2).max(1);
        let target = db.open_tree(generation_name(start, length))?;
        let mut batch = sled::Batch::default();
        for (key, bytes) in entries {
            batch.insert(key, bytes);
        }
        target.apply_batch(batch)?;
        db.drop_tree(&name)?;
    }
    Ok(())
}

fn rekey_outbox(db: &sled::Db) -> Result<(), StoreError> {
    if !db.tree_names().iter().any(|n| n.as_ref() == b"outbox") {
        return Ok(());
    }
    let legacy = db.open_tree("outbox")?;
    let target = db.open_tree(OUTBOX_TREE)?;
    let mut batch = sled::Batch::default();
    for entry in legacy.iter() {
        let (_, bytes) = entry?;
        let mut item: OutboxItem = decode("outbox item", &bytes)?;
        let mut parts = item.message.idempotency_key.rsplitn(3, ':');
        let index = parts.next().and_then(|p| p.parse::<u64>().ok());
        let inbox_seq = parts.next().and_then(|p| p.parse::<u64>().ok());
        let Some(seq) = index.zip(inbox_seq).and_then(|(i, s)| outbox_seq(s, i)) else {
            tracing::warn!(
                key = %item.message.idempotency_key,
                "outbox item with an unexpected idempotency key dropped in migration"
            );
            continue;
        };
        item.seq = seq;
        batch.insert(&seq_key(seq), encode("outbox item", &item)?);
    }
    target.apply_batch(batch)?;
    db.drop_tree("outbox")?;
    Ok(())
}

/// Migrates a schema-2 database in place; returns how many records it converted.
pub(super) fn v2_to_v3(db: &sled::Db) -> Result<usize, StoreError> {
    let mut converted = convert::<InboxItem>(&db.open_tree("inbox")?)?;
    converted += convert::<OutboxItem>(&db.open_tree(OUTBOX_TREE)?)?;
    converted += convert::<ChatMessage>(&db.open_tree("messages")?)?;
    for name in db.tree_names() {
        if parse_generation(&name).is_some() {
            converted += convert::<DedupeEntry>(&db.open_tree(&name)?)?;
        }
    }
    db.flush()?;
    Ok(converted)
}

/// Rewrites every JSON record of `tree` as a `T` record.
pub(super) fn convert<T: Record + DeserializeOwned>(
    tree: &sled::Tree,
) -> Result<usize, StoreError> {
    let mut converted = 0;
    let mut batch = sled::Batch::default();
    let mut in_batch = 0;
    for entry in tree.iter() {
        let (key, bytes) = entry?;
        if !records::is_json(&bytes) {
            continue;
        }
        let value: T = decode(T::WHAT, &bytes)?;
        batch.insert(key, value.to_record()?);
        in_batch += 1;
        if in_batch == CONVERT_BATCH {
            tree.apply_batch(std::mem::take(&mut batch))?;
            converted += in_batch;
            in_batch = 0;
        }
    }
    tree.apply_batch(batch)?;
    Ok(converted + in_batch)
}
