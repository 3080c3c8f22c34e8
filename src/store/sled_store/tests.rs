use std::sync::Arc;

use antler_channel::{ConversationKey, OutboundMessage};

use super::*;
use crate::agent::message::ChatMessage;
use crate::store::conformance::{Backend, accept, accept_in, accept_new, conformance};
use crate::store::{InboxStatus, Store, ThreadChoice, outbox_seq};

const CACHE: u64 = 8 * 1024 * 1024;

/// Sled stores in a temporary folder, reopened in place.
struct SledBackend(tempfile::TempDir);

impl SledBackend {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }
}

impl Backend for SledBackend {
    fn open(&self) -> Arc<dyn Store> {
        Arc::new(SledStore::open(self.0.path(), CACHE).unwrap())
    }
}

conformance!(SledBackend::new());

#[tokio::test]
async fn keys_stay_known_until_they_expire_when_the_ttl_changes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(dir.path(), CACHE).unwrap();
        let first = store
            .accept(accept_in("c", "m1", 9_500, 10_000))
            .await
            .unwrap();
        assert!(matches!(first, Accepted::New(_)));
    }
    // Restarted with a much shorter TTL: the key, accepted with 10 s, is still remembered
    // (it expires at 19,500), although 19,000 lies two short generations later.
    let store = SledStore::open(dir.path(), CACHE).unwrap();
    let again = store
        .accept(accept_in("c", "m1", 19_000, 1_000))
        .await
        .unwrap();
    assert!(matches!(again, Accepted::Duplicate { .. }), "{again:?}");
    let expired = store
        .accept(accept_in("c", "m1", 19_600, 1_000))
        .await
        .unwrap();
    assert!(matches!(expired, Accepted::New(_)), "{expired:?}");
    // The old generation (start 0, length 10 s) is kept until all of it has expired.
    let generations = |store: &SledStore| -> Vec<(u64, u64)> {
        store
            .db
            .tree_names()
            .iter()
            .filter_map(|n| parse_generation(n))
            .collect()
    };
    store.sweep(19_999, 1_000).await.unwrap();
    assert!(generations(&store).contains(&(0, 10_000)));
    store.sweep(20_000, 1_000).await.unwrap();
    assert!(!generations(&store).contains(&(0, 10_000)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_share_data_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SledStore::open(dir.path(), CACHE).unwrap());
    let before = store.syncs();
    let writers = 64;
    let barrier = Arc::new(tokio::sync::Barrier::new(writers));
    let mut tasks = Vec::new();
    for n in 0..writers {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut a = accept(&format!("m{n}"), ThreadChoice::Current, 1);
            a.event.conversation = ConversationKey::new("api", [format!("c{n}")]);
            let synced_before = store.syncs();
            store.accept(a).await.unwrap();
            // The sync that answered started after this writer asked: it is counted.
            assert!(store.syncs() > synced_before);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let syncs = store.syncs() - before;
    assert!(syncs >= 1);
    assert!(
        syncs < writers as u64,
        "{writers} concurrent writers needed {syncs} syncs: they should share them"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn the_store_is_private_and_a_second_process_is_told_who_holds_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = SledStore::open(&path, CACHE).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o700);
    assert_eq!(mode(&path.join("db")), 0o600);
    let error = SledStore::open(&path, CACHE).unwrap_err();
    assert!(matches!(error, StoreError::InUse { .. }), "{error:?}");
    assert!(
        error.to_string().contains("another antler is using"),
        "{error}"
    );
    drop(store);

    // An existing directory that others could read is made private.
    let lax = dir.path().join("lax");
    std::fs::create_dir(&lax).unwrap();
    std::fs::set_permissions(&lax, std::fs::Permissions::from_mode(0o755)).unwrap();
    drop(SledStore::open(&lax, CACHE).unwrap());
    assert_eq!(mode(&lax), 0o700);
}

/// Writes a store as schema 1 did: whole threads, `<conversation>:<event>` dedupe keys in
/// `dedupe.<start>`, outbox items under a counter.
fn write_v1_store(path: &std::path::Path) -> String {
    let db = sled::Config::new().path(path).open().unwrap();
    db.open_tree("meta")
        .unwrap()
        .insert(SCHEMA_KEY, &1u32.to_be_bytes())
        .unwrap();
    let thread_id = "0192thread".to_owned();
    let legacy_thread = serde_json::json!({
        "id": thread_id,
        "conversation": "api:ops:eu",
        "generation": 0,
        "title": "Deploy",
        "messages": [
            {"role": "user", "content": "deploy?"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "status?"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        "turns": 1,
        "checkpoint_of": 7,
        "created_at_ms": 1,
        "updated_at_ms": 2
    });
    db.open_tree("threads")
        .unwrap()
        .insert(
            thread_id.as_bytes(),
            serde_json::to_vec(&legacy_thread).unwrap(),
        )
        .unwrap();
    let entry = serde_json::json!({"expires_at_ms": 50_000, "thread_id": thread_id});
    db.open_tree("dedupe.0")
        .unwrap()
        .insert(b"api:ops:eu:m:1", serde_json::to_vec(&entry).unwrap())
        .unwrap();
    let item = OutboxItem {
        seq: 3,
        trace: crate::telemetry::TraceContext::fresh(),
        message: OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: format!("{thread_id}:7:0"),
            conversation: ConversationKey::new("api", ["ops:eu"]),
            thread_id: thread_id.clone(),
            text: "pending reply".to_owned(),
            reply_to: None,
            files: Vec::new(),
            reply_context: None,
        },
        status: OutboxStatus::Pending,
        attempts: 0,
        last_error: None,
        receipt: None,
        parts: Vec::new(),
        draft: None,
        created_at_ms: 2,
        finished_at_ms: None,
    };
    db.open_tree("outbox")
        .unwrap()
        .insert(3u64.to_be_bytes(), serde_json::to_vec(&item).unwrap())
        .unwrap();
    db.flush().unwrap();
    thread_id
}

#[tokio::test]
async fn a_schema_1_store_is_migrated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let thread_id = write_v1_store(dir.path());
    let store = SledStore::open(dir.path(), CACHE).unwrap();

    let thread = store.thread(&thread_id).await.unwrap().unwrap();
    assert_eq!(thread.messages.len(), 3);
    assert_eq!(thread.messages[2], ChatMessage::user("status?"));
    assert_eq!(thread.title.as_deref(), Some("Deploy"));
    assert_eq!(
        thread.running,
        Some(crate::agent::thread::RunningTurn {
            inbox_seq: 7,
            start: 2
        }),
        "the checkpoint's turn starts at its user message"
    );
    assert_eq!(store.messages.len(), 3, "one record per message");

    // The dedupe key was split exactly, with the thread's conversation.
    let mut redelivery = accept_in("ops:eu", "m:1", 1_000, 86_400_000);
    redelivery.event.conversation = ConversationKey::new("api", ["ops:eu"]);
    let again = store.accept(redelivery).await.unwrap();
    assert!(
        matches!(&again, Accepted::Duplicate { thread_id: t, seq: None } if *t == thread_id),
        "{again:?}"
    );

    // The pending reply is keyed by the inbox item it answers and still pending.
    let pending = store.outbox_pending().await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].seq, outbox_seq(7, 0).unwrap());
    assert_eq!(
        store.replies(7).await.unwrap()[0].message.text,
        "pending reply"
    );
    assert_eq!(store.stats().await.unwrap().outbox_pending, 1);
    drop(store);

    // Opening again finds schema 2 and changes nothing.
    let store = SledStore::open(dir.path(), CACHE).unwrap();
    assert_eq!(
        store
            .thread(&thread_id)
            .await
            .unwrap()
            .unwrap()
            .messages
            .len(),
        3
    );
    assert_eq!(store.messages.len(), 3);
}

#[tokio::test]
async fn dedupe_generations_go_whole_once_every_key_expired() {
    let store = SledStore::temporary().unwrap();
    accept_new(&store, accept("m1", ThreadChoice::Current, 10)).await;
    accept_new(&store, accept("m1", ThreadChoice::Current, 2_000)).await;
    accept_new(&store, accept("m2", ThreadChoice::Current, 2_900)).await;
    // A redelivery at 3,100 opens the generation of 3,000.
    let again = store
        .accept(accept("m2", ThreadChoice::Current, 3_100))
        .await
        .unwrap();
    assert!(matches!(again, Accepted::Duplicate { .. }), "{again:?}");
    // The generation of t=10 (all expired by 2,000) goes, the others stay.
    assert_eq!(store.sweep(2_500, 1_000).await.unwrap(), 1);
    assert_eq!(
        store.sweep(4_000, 1_000).await.unwrap(),
        2,
        "generations 1,000 (opened empty as a previous one) and 2,000"
    );
    assert_eq!(
        store.sweep(5_000, 1_000).await.unwrap(),
        1,
        "generation 3,000"
    );
}

#[tokio::test]
async fn newer_schemas_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(dir.path(), CACHE).unwrap();
        accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
        store.write_schema_version(SCHEMA_VERSION + 1).unwrap();
    }
    let error = SledStore::open(dir.path(), CACHE).unwrap_err();
    assert!(matches!(error, StoreError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1));
    assert!(error.to_string().contains("newer antler"), "{error}");
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn update_memory_reruns_the_change_on_a_newer_document() {
    let store = SledStore::temporary().unwrap();
    let first = MemoryDocument::default();
    store.put_memory("api:u1", &first).await.unwrap();
    // A writer that lands between this change's read and its write: the change runs again
    // on the newer document, and the newer writer's summary survives.
    let racing = store.clone();
    let mut calls = 0;
    let stored = store
        .update_memory("api:u1", &mut |doc| {
            calls += 1;
            let mut doc = doc.unwrap_or_default();
            if calls == 1 {
                let mut other = doc.clone();
                other.history.recent_months.summary = "from the updater".to_owned();
                racing
                    .memory
                    .insert("api:u1", serde_json::to_vec(&other).unwrap())
                    .unwrap();
            }
            doc.user.top_of_mind.summary = "second".to_owned();
            Some(doc)
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(calls, 2);
    assert_eq!(stored.history.recent_months.summary, "from the updater");
    assert_eq!(stored.user.top_of_mind.summary, "second");
    assert_eq!(store.memory("api:u1").await.unwrap(), Some(stored));
}

#[tokio::test]
async fn a_turn_writes_only_the_messages_it_added() {
    let store = SledStore::temporary().unwrap();
    let InboxItem { thread_id, .. } =
        accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
    let mut thread = store.thread(&thread_id).await.unwrap().unwrap();
    let mut written = Vec::new();
    for turn in 0..20 {
        thread
            .messages
            .push(ChatMessage::user(format!("question {turn}")));
        thread
            .messages
            .push(ChatMessage::assistant(format!("answer {turn}")));
        let before = store.messages.len();
        store.checkpoint_thread(&mut thread).await.unwrap();
        written.push(store.messages.len() - before);
    }
    assert!(written.iter().all(|&n| n == 2), "{written:?}");
    // A failed span is metadata: marking one rewrites no message.
    let before = store.messages.len();
    thread.fail_from(38);
    store.checkpoint_thread(&mut thread).await.unwrap();
    assert_eq!(store.messages.len(), before);
}

/// Issue 27: what a save of a thread writes (its metadata, whole, and its new messages) does
/// not grow with the thread; the user's marks travel with their messages.
#[tokio::test]
async fn what_a_save_writes_does_not_grow_with_the_thread() {
    use crate::agent::message::Authored;
    let store = SledStore::temporary().unwrap();
    let InboxItem { thread_id, .. } =
        accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
    let mut thread = store.thread(&thread_id).await.unwrap().unwrap();
    let mut written = Vec::new();
    for turn in 10..40 {
        thread.messages.push(ChatMessage::User {
            content: format!("question {turn}"),
            parts: Vec::new(),
            authored: Some(Authored { trusted_tail: 0 }),
        });
        thread
            .messages
            .push(ChatMessage::assistant(format!("answer {turn}")));
        let write = ThreadWrite::of(&thread).unwrap();
        written.push(
            write.meta.len()
                + write
                    .messages
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>(),
        );
        store.checkpoint_thread(&mut thread).await.unwrap();
    }
    assert!(written.iter().all(|&n| n == written[0]), "{written:?}");
    let stored = store.thread(&thread_id).await.unwrap().unwrap();
    assert_eq!(stored.messages, thread.messages, "the marks come back");
}

#[test]
fn io_errors_are_worth_retrying_and_corruption_is_not() {
    let io = StoreError::from(sled::Error::Io(std::io::Error::other("disk gone")));
    assert!(io.is_retryable(), "{io}");
    let corrupt = StoreError::from(sled::Error::Corruption { at: None, bt: () });
    assert!(!corrupt.is_retryable(), "{corrupt}");
    assert!(
        std::error::Error::source(&corrupt).is_some(),
        "the cause is kept"
    );
    assert!(corrupt.to_string().contains("corrupt"), "{corrupt}");
}

/// Where the schema-2 store antler wrote is kept (`schema2` says what it holds).
fn schema_2_fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-schema2")
}

/// A copy of the schema-2 store, to open (opening migrates it in place).
fn copy_of_schema_2_store() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut folders = vec![(schema_2_fixture(), path.clone())];
    while let Some((from, to)) = folders.pop() {
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(&from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                folders.push((entry.path(), target));
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    (dir, path)
}

/// Every record of the trees the migration converts, as stored.
fn hot_records(store: &SledStore) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
    use crate::agent::message::ChatMessage;
    use crate::store::records::Record;
    use crate::store::rules::DedupeEntry;
    let mut trees = vec![
        (store.inbox.clone(), InboxItem::FORMAT),
        (store.outbox.clone(), OutboxItem::FORMAT),
        (store.messages.clone(), ChatMessage::FORMAT),
    ];
    for name in store.db.tree_names() {
        if parse_generation(&name).is_some() {
            trees.push((store.db.open_tree(name).unwrap(), DedupeEntry::FORMAT));
        }
    }
    let mut all = Vec::new();
    for (tree, format) in trees {
        for entry in tree.iter() {
            let (key, value) = entry.unwrap();
            let current = value.first() == Some(&format);
            all.push((key.to_vec(), value.to_vec(), current));
        }
    }
    all
}

/// Reads everything `schema2` put into the store, as it was written.
async fn assert_holds_the_schema_2_contents(store: &SledStore) {
    use super::schema2;
    let [finished, running, waiting] = schema2::events();
    let inbox = store.inbox().await.unwrap();
    assert_eq!(inbox.len(), 2, "{inbox:?}");
    assert_eq!(inbox[0].event, running);
    assert_eq!(
        (inbox[0].status, inbox[0].attempts, inbox[0].draft.clone()),
        (InboxStatus::Running, 1, Some(schema2::draft()))
    );
    assert_eq!(inbox[1].event, waiting);
    assert_eq!(
        (inbox[1].status, inbox[1].attempts, inbox[1].draft.clone()),
        (InboxStatus::Pending, 0, None)
    );
    assert_eq!(inbox[1].accepted_at_ms, schema2::NOW_MS);

    // The finished message is still recognised, and names its inbox item.
    let mut redelivery = schema2::accept_of(finished);
    redelivery.now_ms += 1;
    let Accepted::Duplicate {
        thread_id,
        seq: Some(seq),
    } = store.accept(redelivery).await.unwrap()
    else {
        panic!("the finished message's dedupe key was lost");
    };
    assert_eq!(thread_id, inbox[0].thread_id);

    let thread = store.thread(&thread_id).await.unwrap().unwrap();
    assert_eq!(thread.messages, schema2::turn_messages());
    assert_eq!(thread.title.as_deref(), Some("Deploy eu"));

    let replies = store.replies(seq).await.unwrap();
    let written = schema2::replies(&thread_id, seq);
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0].message, written[0]);
    assert_eq!(replies[0].status, OutboxStatus::Sent);
    assert_eq!(replies[0].parts, schema2::receipts());
    assert_eq!(replies[0].receipt.as_ref(), Some(&schema2::receipts()[0]));
    assert_eq!(replies[1].message, written[1]);
    assert_eq!(
        (replies[1].status, replies[1].attempts),
        (OutboxStatus::Pending, 1)
    );
    assert_eq!(
        replies[1].last_error.as_deref(),
        Some(schema2::DELIVERY_ERROR)
    );
    assert_eq!(store.outbox_pending().await.unwrap(), [replies[1].clone()]);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.inbox, stats.outbox_pending), (2, 1));
}

#[tokio::test]
async fn a_schema_2_store_written_by_antler_is_migrated_on_open() {
    let (_dir, path) = copy_of_schema_2_store();
    let store = SledStore::open(&path, CACHE).unwrap();
    assert_holds_the_schema_2_contents(&store).await;
    let migrated = hot_records(&store);
    assert!(
        migrated.len() >= 2 + 2 + 5 + 3,
        "inbox, outbox, messages and dedupe keys: {}",
        migrated.len()
    );
    assert!(
        migrated.iter().all(|(_, _, current)| *current),
        "every record is in the store's own format"
    );
    drop(store);

    // Opening again finds schema 3 and changes nothing.
    let store = SledStore::open(&path, CACHE).unwrap();
    assert_eq!(hot_records(&store), migrated);
    assert_holds_the_schema_2_contents(&store).await;
}

#[tokio::test]
async fn a_migration_cut_short_finishes_on_the_next_open() {
    let (_dir, path) = copy_of_schema_2_store();
    {
        // The crash: the inbox was converted, nothing else, the schema version still 2.
        let db = sled::Config::new().path(&path).open().unwrap();
        let converted = migrate::convert::<InboxItem>(&db.open_tree("inbox").unwrap()).unwrap();
        assert_eq!(converted, 2);
        db.flush().unwrap();
    }
    let store = SledStore::open(&path, CACHE).unwrap();
    assert_holds_the_schema_2_contents(&store).await;
    assert!(hot_records(&store).iter().all(|(_, _, current)| *current));
}
