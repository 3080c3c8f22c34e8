use std::sync::Arc;

use antler_channel::{ConversationKey, OutboundMessage};

use super::*;
use crate::agent::message::ChatMessage;
use crate::store::conformance::{Backend, accept, accept_in, accept_new, conformance};
use crate::store::{Store, ThreadChoice, outbox_seq};

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
        message: OutboundMessage {
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
