use std::sync::Arc;

use antler_channel::{ConversationKey, OutboundMessage, Receipt};

use super::*;
use crate::agent::message::{ChatMessage, TokenUsage};
use crate::store::outbox_seq;
use crate::test_support::event;

const CACHE: u64 = 8 * 1024 * 1024;

/// Accepts a message that must be new.
async fn accept_new(store: &SledStore, request: Accept) -> InboxItem {
    match store.accept(request).await.unwrap() {
        Accepted::New(item) => item,
        other => panic!("expected a new message, got {other:?}"),
    }
}

fn accept(event_id: &str, thread: ThreadChoice, now_ms: u64) -> Accept {
    Accept {
        dedupe_ttl_ms: 1_000,
        event: event("c1", event_id, "hi"),
        thread,
        now_ms,
    }
}

fn reply(thread_id: &str, text: &str) -> OutboundMessage {
    OutboundMessage {
        idempotency_key: format!("{thread_id}:{text}"),
        conversation: ConversationKey::new("api", ["c1"]),
        thread_id: thread_id.to_owned(),
        text: text.to_owned(),
        reply_to: None,
        files: Vec::new(),
        reply_context: None,
    }
}

#[tokio::test]
async fn accept_stores_once_and_recognises_redelivery_until_expiry() {
    let store = SledStore::temporary().unwrap();
    let InboxItem { seq, thread_id, .. } =
        accept_new(&store, accept("m1", ThreadChoice::Current, 10)).await;
    let again = store
        .accept(accept("m1", ThreadChoice::Current, 20))
        .await
        .unwrap();
    assert_eq!(
        again,
        Accepted::Duplicate {
            thread_id: thread_id.clone(),
            seq: Some(seq),
        }
    );
    let inbox = store.inbox().await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].seq, seq);
    assert_eq!(inbox[0].status, InboxStatus::Pending);

    // After the TTL the key is forgotten and the same id is a new message.
    let late = store
        .accept(accept("m1", ThreadChoice::Current, 2_000))
        .await
        .unwrap();
    assert!(matches!(late, Accepted::New(InboxItem { thread_id: t, .. }) if t == thread_id));
    assert_eq!(store.inbox().await.unwrap().len(), 2);

    // A key from the previous generation is still recognised until it expires.
    let m2 = |at| store.accept(accept("m2", ThreadChoice::Current, at));
    assert!(matches!(m2(2_900).await.unwrap(), Accepted::New(_)));
    assert!(matches!(
        m2(3_100).await.unwrap(),
        Accepted::Duplicate { .. }
    ));

    // The sweep drops the generation of t=10 (all expired by 2,000), keeps the others.
    assert_eq!(store.sweep(2_500, 1_000).await.unwrap(), 1);
    let again = store
        .accept(accept("m1", ThreadChoice::Current, 2_600))
        .await
        .unwrap();
    assert!(matches!(again, Accepted::Duplicate { .. }), "{again:?}");
    assert!(matches!(
        m2(3_500).await.unwrap(),
        Accepted::Duplicate { .. }
    ));
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
async fn fresh_thread_starts_the_next_generation() {
    let store = SledStore::temporary().unwrap();
    let InboxItem {
        thread_id: first, ..
    } = accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
    let InboxItem {
        thread_id: second, ..
    } = accept_new(&store, accept("m2", ThreadChoice::Fresh, 2)).await;
    assert_ne!(first, second);
    let record = store.conversation("api:c1").await.unwrap().unwrap();
    assert_eq!(record.generation, 1);
    assert_eq!(record.thread_id, second);
    assert_eq!(record.user_id, "api:u1");
    let fresh = store.thread(&second).await.unwrap().unwrap();
    assert_eq!((fresh.generation, fresh.messages.len()), (1, 0));
    assert!(
        store.thread(&first).await.unwrap().is_some(),
        "history is kept"
    );
    let items = store.inbox().await.unwrap();
    assert!(!items[0].fresh_thread && items[1].fresh_thread);
}

#[tokio::test]
async fn finish_turn_writes_thread_outbox_and_removes_the_inbox_item_together() {
    let store = SledStore::temporary().unwrap();
    let InboxItem { seq, thread_id, .. } =
        accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
    let started = store.start_turn(seq).await.unwrap();
    assert_eq!(
        (started.status, started.attempts),
        (InboxStatus::Running, 1)
    );

    let mut thread = ThreadState::new(thread_id.clone(), "api:c1".to_owned(), 0, 1);
    thread.messages.push(ChatMessage::user("hi"));
    thread.messages.push(ChatMessage::assistant("hello"));
    let update = MemoryUpdate {
        user_id: "api:u1".to_owned(),
        thread_id: thread_id.clone(),
        messages: thread.messages.clone(),
        enqueued_at_ms: 5,
        due_at_ms: 30_005,
    };
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            thread: Some(thread.clone()),
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: Some(update.clone()),
            draft: None,
            now_ms: 5,
        })
        .await
        .unwrap();
    assert_eq!(items.len(), 2);
    assert!(items[0].seq < items[1].seq);
    assert_eq!(
        store.replies(seq).await.unwrap(),
        items,
        "the replies to an inbox item are found by its seq"
    );
    assert!(store.replies(seq + 1).await.unwrap().is_empty());
    assert!(store.inbox().await.unwrap().is_empty());
    thread.saved_messages = 2;
    assert_eq!(store.thread(&thread_id).await.unwrap(), Some(thread));
    let pending = store.outbox_pending().await.unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|i| i.message.text.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(
        store
            .due_memory_updates(30_004, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.due_memory_updates(30_005, 10).await.unwrap(),
        vec![update]
    );
}

#[tokio::test]
async fn delivery_records_receipts_and_failures() {
    let store = SledStore::temporary().unwrap();
    let InboxItem { seq, thread_id, .. } =
        accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            thread: None,
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: None,
            draft: None,
            now_ms: 1,
        })
        .await
        .unwrap();
    assert_eq!(store.stats().await.unwrap().outbox_pending, 2);
    let failed = store
        .delivery_failed(items[0].seq, "503", false, 2)
        .await
        .unwrap();
    assert_eq!((failed.attempts, failed.status), (1, OutboxStatus::Pending));
    let receipt = Receipt {
        platform_message_id: "pm-1".to_owned(),
    };
    let sent = store
        .part_delivered(items[0].seq, receipt.clone(), true, 3)
        .await
        .unwrap();
    assert_eq!((sent.attempts, sent.status), (2, OutboxStatus::Sent));
    assert_eq!(sent.receipt, Some(receipt));
    let gave_up = store
        .delivery_failed(items[1].seq, "gone", true, 4)
        .await
        .unwrap();
    assert_eq!(gave_up.status, OutboxStatus::Failed);
    assert!(store.outbox_pending().await.unwrap().is_empty());
    assert_eq!(store.stats().await.unwrap().outbox_pending, 0);

    // The sweep keeps finished items for the retention period, then drops them.
    assert_eq!(store.sweep(10, 1_000).await.unwrap(), 0);
    assert_eq!(store.sweep(1_500, 1_000).await.unwrap(), 2);
    // The dedupe generation of t=1 (TTL 1,000 ms) goes once all its keys have expired.
    assert_eq!(store.sweep(2_000, 1_000).await.unwrap(), 1);
    assert!(store.outbox_item(items[0].seq).await.unwrap().is_none());
}

#[tokio::test]
async fn a_saved_draft_survives_a_reopen_and_goes_to_the_first_reply() {
    let dir = tempfile::tempdir().unwrap();
    let draft = Receipt {
        platform_message_id: "d-1".to_owned(),
    };
    let (seq, thread_id) = {
        let store = SledStore::open(dir.path(), CACHE).unwrap();
        let InboxItem { seq, thread_id, .. } =
            accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
        store.save_draft(seq, &draft).await.unwrap();
        (seq, thread_id)
    };
    let store = SledStore::open(dir.path(), CACHE).unwrap();
    let item = store.start_turn(seq).await.unwrap();
    assert_eq!(item.draft.as_ref(), Some(&draft), "a re-run finds it");
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            thread: None,
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: None,
            draft: item.draft,
            now_ms: 2,
        })
        .await
        .unwrap();
    assert_eq!(items[0].draft.as_ref(), Some(&draft));
    assert_eq!(items[1].draft, None, "only the first reply replaces it");
    let stored = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!(stored.draft, Some(draft));
}

#[tokio::test]
async fn state_survives_reopening_and_newer_schemas_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let thread_id = {
        let store = SledStore::open(dir.path(), CACHE).unwrap();
        let InboxItem { thread_id, .. } =
            accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
        let InboxItem { seq, .. } =
            accept_new(&store, accept("m2", ThreadChoice::Current, 1)).await;
        store
            .finish_turn(FinishTurn {
                inbox_seq: seq,
                thread: None,
                replies: vec![reply(&thread_id, "pending")],
                memory_update: None,
                draft: None,
                now_ms: 1,
            })
            .await
            .unwrap();
        thread_id
    };
    {
        let store = SledStore::open(dir.path(), CACHE).unwrap();
        assert_eq!(store.inbox().await.unwrap()[0].thread_id, thread_id);
        // The count of replies still to deliver is rebuilt from the outbox.
        assert_eq!(store.stats().await.unwrap().outbox_pending, 1);
        store.write_schema_version(SCHEMA_VERSION + 1).unwrap();
    }
    let error = SledStore::open(dir.path(), CACHE).unwrap_err();
    assert!(matches!(error, StoreError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1));
    assert!(error.to_string().contains("newer antler"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_accepts_all_land_and_share_flushes() {
    let store = Arc::new(SledStore::temporary().unwrap());
    let mut tasks = Vec::new();
    for n in 0..200 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut a = accept(&format!("m{n}"), ThreadChoice::Current, 1);
            a.event.conversation = ConversationKey::new("api", [format!("c{}", n % 7)]);
            store.accept(a).await
        }));
    }
    for task in tasks {
        assert!(matches!(task.await.unwrap().unwrap(), Accepted::New(_)));
    }
    let inbox = store.inbox().await.unwrap();
    assert_eq!(inbox.len(), 200);
    assert!(inbox.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(store.stats().await.unwrap().inbox, 200);
}

fn subagent(id: &str, status: SubagentStatus) -> SubagentRecord {
    SubagentRecord {
        id: id.to_owned(),
        parent_thread_id: "t1".to_owned(),
        parent_turn: 4,
        parent_call_id: format!("call_{id}"),
        subagent_type: "general-purpose".to_owned(),
        description: "d".to_owned(),
        prompt: "p".to_owned(),
        status,
        stop_reason: None,
        result: None,
        error: None,
        usage: TokenUsage::default(),
        trace_id: "trace".to_owned(),
        created_at_ms: 1,
        started_at_ms: None,
        finished_at_ms: None,
    }
}

#[tokio::test]
async fn subagent_first_terminal_write_wins_and_restart_fails_running_ones() {
    let store = SledStore::temporary().unwrap();
    store
        .create_subagent(&subagent("s1", SubagentStatus::Pending))
        .await
        .unwrap();
    store
        .create_subagent(&subagent("s2", SubagentStatus::Running))
        .await
        .unwrap();
    store
        .create_subagent(&subagent("s3", SubagentStatus::Completed))
        .await
        .unwrap();

    let running = store
        .transition_subagent("s1", &SubagentChange::to(SubagentStatus::Running, 2))
        .await
        .unwrap();
    assert!(matches!(running, Transition::Applied(ref r) if r.status == SubagentStatus::Running));
    let done = SubagentChange {
        result: Some("42".into()),
        ..SubagentChange::to(SubagentStatus::Completed, 3)
    };
    let done = store.transition_subagent("s1", &done).await.unwrap();
    assert!(matches!(done, Transition::Applied(ref r) if r.result.as_deref() == Some("42")));
    let late = SubagentChange::failed(SubagentStatus::TimedOut, "late", 4);
    let late = store.transition_subagent("s1", &late).await.unwrap();
    assert!(matches!(late, Transition::Refused(ref r) if r.status == SubagentStatus::Completed));
    let stored = store.subagent("s1").await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.started_at_ms, stored.finished_at_ms),
        (SubagentStatus::Completed, Some(2), Some(3))
    );

    assert_eq!(
        store
            .fail_unfinished_subagents("restarted", 5)
            .await
            .unwrap(),
        1
    );
    let s2 = store.subagent("s2").await.unwrap().unwrap();
    assert_eq!(
        (s2.status, s2.error.as_deref()),
        (SubagentStatus::Failed, Some("restarted"))
    );
    let s3 = store.subagent("s3").await.unwrap().unwrap();
    assert_eq!(s3.status, SubagentStatus::Completed);
    let missing = store
        .transition_subagent("nope", &SubagentChange::to(SubagentStatus::Failed, 6))
        .await;
    assert!(matches!(missing, Err(StoreError::Missing { .. })));
}

#[tokio::test]
async fn concurrent_terminal_writes_leave_exactly_one_winner() {
    let store = Arc::new(SledStore::temporary().unwrap());
    store
        .create_subagent(&subagent("s1", SubagentStatus::Running))
        .await
        .unwrap();
    let statuses = [
        SubagentStatus::Completed,
        SubagentStatus::Failed,
        SubagentStatus::Cancelled,
        SubagentStatus::TimedOut,
    ];
    let writers: Vec<_> = statuses
        .into_iter()
        .map(|status| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let change = SubagentChange::failed(status, status.as_str(), 9);
                store.transition_subagent("s1", &change).await.unwrap()
            })
        })
        .collect();
    let mut applied = Vec::new();
    for writer in writers {
        if let Transition::Applied(record) = writer.await.unwrap() {
            applied.push(record.status);
        }
    }
    assert_eq!(applied.len(), 1, "{applied:?}");
    let stored = store.subagent("s1").await.unwrap().unwrap();
    assert_eq!(stored.status, applied[0]);
    assert_eq!(stored.error.as_deref(), Some(applied[0].as_str()));
}

#[tokio::test]
async fn subagents_are_found_by_their_turns_call_listed_per_thread_and_swept_when_old() {
    let store = SledStore::temporary().unwrap();
    let record = |id: &str, thread: &str, turn: u64, created: u64| SubagentRecord {
        parent_thread_id: thread.to_owned(),
        parent_turn: turn,
        parent_call_id: "call_0".to_owned(),
        created_at_ms: created,
        ..subagent(id, SubagentStatus::Pending)
    };
    // The same call id in two turns (providers that count from zero each response).
    store
        .create_subagent(&record("task_a", "t1", 1, 10))
        .await
        .unwrap();
    store
        .create_subagent(&record("task_b", "t1", 2, 20))
        .await
        .unwrap();
    store
        .create_subagent(&record("task_c", "t1:x", 2, 30))
        .await
        .unwrap();
    let found = |thread: &'static str, turn: u64| {
        let store = &store;
        async move {
            store
                .subagent_for_call(thread, turn, "call_0")
                .await
                .unwrap()
                .map(|r| r.id)
        }
    };
    assert_eq!(found("t1", 1).await.as_deref(), Some("task_a"));
    assert_eq!(found("t1", 2).await.as_deref(), Some("task_b"));
    assert_eq!(found("t1", 3).await, None);
    assert_eq!(found("t1:x", 2).await.as_deref(), Some("task_c"));

    let listed: Vec<String> = store
        .thread_subagents("t1", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        listed,
        ["task_b", "task_a"],
        "newest first, only this thread"
    );
    assert_eq!(store.thread_subagents("t1", 1).await.unwrap().len(), 1);

    // Finished long ago: swept with its index entry; still running: kept.
    let old = SubagentChange::to(SubagentStatus::Cancelled, 11);
    store.transition_subagent("task_a", &old).await.unwrap();
    let week = 7 * 24 * 3600 * 1000;
    store.sweep(week + 12, 1).await.unwrap();
    assert!(store.subagent("task_a").await.unwrap().is_none());
    assert_eq!(found("t1", 1).await, None);
    assert!(store.subagent("task_b").await.unwrap().is_some());
}

#[tokio::test]
async fn memory_documents_and_queue_newest_wins() {
    let store = SledStore::temporary().unwrap();
    assert!(store.memory("api:u1").await.unwrap().is_none());
    let mut doc = MemoryDocument::default();
    doc.user.top_of_mind.summary = "shipping antler".to_owned();
    store.put_memory("api:u1", &doc).await.unwrap();
    assert_eq!(store.memory("api:u1").await.unwrap(), Some(doc));

    let update = |at: u64| MemoryUpdate {
        user_id: "api:u1".to_owned(),
        thread_id: "t1".to_owned(),
        messages: vec![ChatMessage::user(format!("at {at}"))],
        enqueued_at_ms: at,
        due_at_ms: at + 30,
    };
    store.queue_memory_update(update(1)).await.unwrap();
    store.queue_memory_update(update(2)).await.unwrap();
    let due = store.due_memory_updates(100, 10).await.unwrap();
    assert_eq!(due, vec![update(2)]);
    // A processed update is removed only if nothing newer replaced it.
    assert!(!store.remove_memory_update(&update(1)).await.unwrap());
    assert!(store.remove_memory_update(&update(2)).await.unwrap());
    assert!(store.due_memory_updates(100, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn memory_queue_keeps_one_entry_per_user_and_thread() {
    let store = SledStore::temporary().unwrap();
    let update = |user: &str, thread: &str, at: u64| MemoryUpdate {
        user_id: user.to_owned(),
        thread_id: thread.to_owned(),
        messages: vec![ChatMessage::user(format!("{user} in {thread}"))],
        enqueued_at_ms: at,
        due_at_ms: at,
    };
    // Two members of one group thread keep their own entries; pairs that would join into the
    // same separator-joined key (`a:b` + `c` vs `a` + `b:c`) stay apart too.
    for queued in [
        update("api:a", "t1", 1),
        update("api:b", "t1", 2),
        update("api:a:b", "c", 3),
        update("api:a", "b:c", 4),
    ] {
        store.queue_memory_update(queued).await.unwrap();
    }
    assert_eq!(store.due_memory_updates(100, 10).await.unwrap().len(), 4);
    store
        .queue_memory_update(update("api:a", "t1", 5))
        .await
        .unwrap();
    let due = store.due_memory_updates(100, 10).await.unwrap();
    assert_eq!(due.len(), 4);
    assert_eq!(due.last(), Some(&update("api:a", "t1", 5)));
    assert!(
        store
            .remove_memory_update(&update("api:b", "t1", 2))
            .await
            .unwrap()
    );
    assert_eq!(store.due_memory_updates(100, 10).await.unwrap().len(), 3);
}

fn memory_update(user: &str, thread: &str, at: u64) -> MemoryUpdate {
    MemoryUpdate {
        user_id: user.to_owned(),
        thread_id: thread.to_owned(),
        messages: vec![ChatMessage::user(format!("at {at}"))],
        enqueued_at_ms: at,
        due_at_ms: at + 30,
    }
}

#[tokio::test]
async fn an_update_applies_only_while_it_is_still_queued_as_read() {
    let store = SledStore::temporary().unwrap();
    let mark = |doc: Option<MemoryDocument>| {
        let mut doc = doc.unwrap_or_default();
        doc.user.top_of_mind.summary.push_str("learned;");
        doc
    };

    // Still queued: applied, and the entry goes with the same write.
    let first = memory_update("api:u1", "t1", 1);
    store.queue_memory_update(first.clone()).await.unwrap();
    let applied = store
        .apply_memory_update(&first, &mut |d| mark(d))
        .await
        .unwrap();
    assert_eq!(applied.unwrap().user.top_of_mind.summary, "learned;");
    assert!(
        store
            .due_memory_updates(u64::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Replaced by a newer context of the same thread: the older answer is not applied.
    let older = memory_update("api:u1", "t1", 2);
    store.queue_memory_update(older.clone()).await.unwrap();
    store
        .queue_memory_update(memory_update("api:u1", "t1", 3))
        .await
        .unwrap();
    assert_eq!(
        store
            .apply_memory_update(&older, &mut |d| mark(d))
            .await
            .unwrap(),
        None
    );
    let doc = store.memory("api:u1").await.unwrap().unwrap();
    assert_eq!(doc.user.top_of_mind.summary, "learned;");
    assert_eq!(
        store.due_memory_updates(u64::MAX, 10).await.unwrap().len(),
        1
    );

    // Forgotten while the model was answering: nothing comes back.
    let taken = store
        .due_memory_updates(u64::MAX, 10)
        .await
        .unwrap()
        .remove(0);
    let cleared = store
        .clear_memory("api:u1", &["api:u1".to_owned()])
        .await
        .unwrap();
    assert_eq!(
        cleared,
        ClearedMemory {
            document: true,
            updates: 1
        }
    );
    assert_eq!(
        store
            .apply_memory_update(&taken, &mut |d| mark(d))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.memory("api:u1").await.unwrap(), None);
}

#[tokio::test]
async fn update_memory_reruns_the_change_on_a_newer_document() {
    let store = SledStore::temporary().unwrap();
    let mut calls = 0;
    let stored = store
        .update_memory("api:u1", &mut |doc| {
            calls += 1;
            assert!(doc.is_none());
            let mut doc = MemoryDocument::default();
            doc.user.top_of_mind.summary = "first".to_owned();
            Some(doc)
        })
        .await
        .unwrap();
    assert_eq!(calls, 1);
    assert_eq!(store.memory("api:u1").await.unwrap(), stored);

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

    // None deletes.
    assert_eq!(
        store.update_memory("api:u1", &mut |_| None).await.unwrap(),
        None
    );
    assert!(store.memory("api:u1").await.unwrap().is_none());
}

#[tokio::test]
async fn clear_memory_drops_the_document_and_that_users_queued_updates_only() {
    let store = SledStore::temporary().unwrap();
    store
        .put_memory("person:ada", &MemoryDocument::default())
        .await
        .unwrap();
    store
        .put_memory("api:bob", &MemoryDocument::default())
        .await
        .unwrap();
    store
        .queue_memory_update(memory_update("person:ada", "t1", 1))
        .await
        .unwrap();
    store
        .queue_memory_update(memory_update("telegram:42", "t2", 2))
        .await
        .unwrap();
    store
        .queue_memory_update(memory_update("api:bob", "t3", 3))
        .await
        .unwrap();
    let cleared = store
        .clear_memory(
            "person:ada",
            &["person:ada".to_owned(), "telegram:42".to_owned()],
        )
        .await
        .unwrap();
    assert_eq!(
        cleared,
        ClearedMemory {
            document: true,
            updates: 2
        }
    );
    assert!(store.memory("person:ada").await.unwrap().is_none());
    let left = store.due_memory_updates(1_000, 10).await.unwrap();
    assert_eq!(left, vec![memory_update("api:bob", "t3", 3)]);
    assert!(store.memory("api:bob").await.unwrap().is_some());
    let again = store
        .clear_memory("person:ada", &["person:ada".to_owned()])
        .await
        .unwrap();
    assert_eq!(again, ClearedMemory::default());
}

#[tokio::test]
async fn memory_keys_page_in_key_order() {
    let store = SledStore::temporary().unwrap();
    for key in ["api:c", "api:a", "telegram:1", "api:b"] {
        store
            .put_memory(key, &MemoryDocument::default())
            .await
            .unwrap();
    }
    assert_eq!(
        store.memory_keys(None, 2).await.unwrap(),
        ["api:a", "api:b"]
    );
    assert_eq!(
        store.memory_keys(Some("api:b"), 2).await.unwrap(),
        ["api:c", "telegram:1"]
    );
    assert!(
        store
            .memory_keys(Some("telegram:1"), 2)
            .await
            .unwrap()
            .is_empty()
    );
}

fn accept_in(conversation: &str, event_id: &str, now_ms: u64, ttl_ms: u64) -> Accept {
    Accept {
        dedupe_ttl_ms: ttl_ms,
        event: event(conversation, event_id, "hi"),
        thread: ThreadChoice::Current,
        now_ms,
    }
}

#[tokio::test]
async fn dedupe_keys_of_different_conversations_never_collide() {
    let store = SledStore::temporary().unwrap();
    // Joined with ':' both would be "api:victim:b:c".
    let victim = store
        .accept(accept_in("victim", "b:c", 1, 1_000))
        .await
        .unwrap();
    let other = store
        .accept(accept_in("victim:b", "c", 1, 1_000))
        .await
        .unwrap();
    let (Accepted::New(victim), Accepted::New(other)) = (victim, other) else {
        panic!("both are new messages");
    };
    assert_ne!(victim.thread_id, other.thread_id);
    assert_eq!(store.inbox().await.unwrap().len(), 2);
}

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
        store.flush().await.unwrap();
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

#[tokio::test]
async fn a_released_turn_gives_its_attempt_back() {
    let store = SledStore::temporary().unwrap();
    let InboxItem { seq, .. } = accept_new(&store, accept("m1", ThreadChoice::Current, 1)).await;
    assert_eq!(store.start_turn(seq).await.unwrap().attempts, 1);
    store.release_turn(seq).await.unwrap();
    let item = &store.inbox().await.unwrap()[0];
    assert_eq!((item.status, item.attempts), (InboxStatus::Pending, 0));
    assert_eq!(store.start_turn(seq).await.unwrap().attempts, 1);
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
        assert_eq!(thread.saved_messages, thread.messages.len());
    }
    assert!(written.iter().all(|&n| n == 2), "{written:?}");
    // A failed span is metadata: marking one rewrites no message.
    thread.fail_from(38);
    store.checkpoint_thread(&mut thread).await.unwrap();
    let loaded = store.thread(&thread_id).await.unwrap().unwrap();
    assert_eq!(loaded.messages, thread.messages);
    assert_eq!(loaded.failed, [38..40]);
    assert_eq!(loaded.saved_messages, 40);
}

#[tokio::test]
async fn counts_follow_accepts_and_finished_turns() {
    let store = SledStore::temporary().unwrap();
    let mut seqs = Vec::new();
    for n in 0..3 {
        let item = accept_new(&store, accept(&format!("m{n}"), ThreadChoice::Current, 1)).await;
        seqs.push(item.seq);
    }
    // A redelivery adds nothing.
    store
        .accept(accept("m0", ThreadChoice::Current, 2))
        .await
        .unwrap();
    assert_eq!(store.stats().await.unwrap().inbox, 3);
    store
        .finish_turn(FinishTurn {
            inbox_seq: seqs[0],
            thread: None,
            replies: vec![reply("t", "done")],
            memory_update: None,
            draft: None,
            now_ms: 3,
        })
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.inbox, stats.outbox_pending), (2, 1));
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
            store.accept(a).await.unwrap();
            let synced_before = store.syncs();
            store.flush().await.unwrap();
            // The flush that answered started after this writer asked: it is counted.
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
async fn a_batch_is_accepted_in_order_and_sees_its_own_redeliveries() {
    let store = SledStore::temporary().unwrap();
    let outcomes = store
        .accept_batch(vec![
            accept_in("a", "m1", 5, 1_000),
            accept_in("b", "m1", 5, 1_000),
            accept_in("a", "m1", 6, 1_000),
            accept_in("a", "m2", 6, 1_000),
        ])
        .await
        .unwrap();
    let [
        Accepted::New(first),
        Accepted::New(other),
        Accepted::Duplicate { thread_id, seq },
        Accepted::New(second),
    ] = outcomes.as_slice()
    else {
        panic!("{outcomes:?}");
    };
    assert_eq!((thread_id, *seq), (&first.thread_id, Some(first.seq)));
    assert_eq!(
        second.thread_id, first.thread_id,
        "one conversation, one thread"
    );
    assert_ne!(other.thread_id, first.thread_id);
    assert!(
        first.seq < other.seq && other.seq < second.seq,
        "inbox order is batch order"
    );
    assert_eq!(store.stats().await.unwrap().inbox, 3);
    assert!(store.accept_batch(Vec::new()).await.unwrap().is_empty());
}

/// Readers never pair messages with metadata from another commit: each commit here adds a
/// message and marks every message failed, so a reader that saw new messages with old
/// metadata would find an unmarked one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_read_while_turns_commit_is_consistent() {
    let store = Arc::new(SledStore::temporary().unwrap());
    let mut thread = ThreadState::new("t-race".into(), "api:race".into(), 0, 1);
    store.checkpoint_thread(&mut thread).await.unwrap();
    let writer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            for i in 0..300u64 {
                thread.messages.push(ChatMessage::user(format!("m{i}")));
                thread.fail_from(0);
                thread.updated_at_ms = i + 2;
                store.checkpoint_thread(&mut thread).await.unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() {
        let read = store.thread("t-race").await.unwrap().unwrap();
        for index in 0..read.messages.len() {
            assert!(
                read.is_failed(index),
                "message {index} of {} read with older metadata ({:?})",
                read.messages.len(),
                read.failed
            );
        }
        reads += 1;
        tokio::task::yield_now().await;
    }
    writer.await.unwrap();
    assert!(reads > 0);
}
