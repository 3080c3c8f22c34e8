use std::sync::Arc;

use antler_channel::{ConversationKey, InboundEvent, OutboundMessage, Receipt, UserRef};

use super::*;
use crate::agent::message::ChatMessage;

fn event(conversation: &str, event_id: &str, text: &str) -> InboundEvent {
    InboundEvent {
        channel: "api".to_owned(),
        event_id: event_id.to_owned(),
        conversation: ConversationKey::new("api", [conversation]),
        user: UserRef {
            id: "u1".to_owned(),
            name: None,
        },
        text: text.to_owned(),
        reply_to: None,
        received_at_ms: 1,
    }
}

fn accept(event_id: &str, thread: ThreadChoice, now_ms: u64) -> Accept {
    Accept {
        dedupe_key: format!("api:{event_id}"),
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
    }
}

#[tokio::test]
async fn accept_stores_once_and_recognises_redelivery_until_expiry() {
    let store = SledStore::temporary().unwrap();
    let Accepted::New(InboxItem { seq, thread_id, .. }) = store
        .accept(accept("m1", ThreadChoice::Current, 10))
        .await
        .unwrap()
    else {
        panic!("first delivery must be new");
    };
    let again = store
        .accept(accept("m1", ThreadChoice::Current, 20))
        .await
        .unwrap();
    assert_eq!(
        again,
        Accepted::Duplicate {
            thread_id: thread_id.clone()
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
    let Accepted::New(InboxItem {
        thread_id: first, ..
    }) = store
        .accept(accept("m1", ThreadChoice::Current, 1))
        .await
        .unwrap()
    else {
        panic!()
    };
    let Accepted::New(InboxItem {
        thread_id: second, ..
    }) = store
        .accept(accept("m2", ThreadChoice::Fresh, 2))
        .await
        .unwrap()
    else {
        panic!()
    };
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
    let Accepted::New(InboxItem { seq, thread_id, .. }) = store
        .accept(accept("m1", ThreadChoice::Current, 1))
        .await
        .unwrap()
    else {
        panic!()
    };
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
            now_ms: 5,
        })
        .await
        .unwrap();
    assert_eq!(items.len(), 2);
    assert!(items[0].seq < items[1].seq);
    assert!(store.inbox().await.unwrap().is_empty());
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
    let Accepted::New(InboxItem { seq, thread_id, .. }) = store
        .accept(accept("m1", ThreadChoice::Current, 1))
        .await
        .unwrap()
    else {
        panic!()
    };
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            thread: None,
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: None,
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
        .delivered(items[0].seq, receipt.clone(), 3)
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
async fn state_survives_reopening_and_newer_schemas_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let thread_id = {
        let store = SledStore::open(dir.path()).unwrap();
        let Accepted::New(InboxItem { thread_id, .. }) = store
            .accept(accept("m1", ThreadChoice::Current, 1))
            .await
            .unwrap()
        else {
            panic!()
        };
        let Accepted::New(InboxItem { seq, .. }) = store
            .accept(accept("m2", ThreadChoice::Current, 1))
            .await
            .unwrap()
        else {
            panic!()
        };
        store
            .finish_turn(FinishTurn {
                inbox_seq: seq,
                thread: None,
                replies: vec![reply(&thread_id, "pending")],
                memory_update: None,
                now_ms: 1,
            })
            .await
            .unwrap();
        thread_id
    };
    {
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(store.inbox().await.unwrap()[0].thread_id, thread_id);
        // The count of replies still to deliver is rebuilt from the outbox.
        assert_eq!(store.stats().await.unwrap().outbox_pending, 1);
        store.write_schema_version(SCHEMA_VERSION + 1).unwrap();
    }
    let error = SledStore::open(dir.path()).unwrap_err();
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
        subagent_type: "general-purpose".to_owned(),
        description: "d".to_owned(),
        prompt: "p".to_owned(),
        status,
        result: None,
        error: None,
        trace_id: "trace".to_owned(),
        created_at_ms: 1,
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
        .transition_subagent("s1", SubagentStatus::Running, None, None, 2)
        .await
        .unwrap();
    assert!(matches!(running, Transition::Applied(ref r) if r.status == SubagentStatus::Running));
    let done = store
        .transition_subagent("s1", SubagentStatus::Completed, Some("42".into()), None, 3)
        .await
        .unwrap();
    assert!(matches!(done, Transition::Applied(ref r) if r.result.as_deref() == Some("42")));
    let late = store
        .transition_subagent("s1", SubagentStatus::TimedOut, None, Some("late".into()), 4)
        .await
        .unwrap();
    assert!(matches!(late, Transition::Refused(ref r) if r.status == SubagentStatus::Completed));

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
        .transition_subagent("nope", SubagentStatus::Failed, None, None, 6)
        .await;
    assert!(matches!(missing, Err(StoreError::Missing { .. })));
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
    assert!(!store.remove_memory_update("t1", 1).await.unwrap());
    assert!(store.remove_memory_update("t1", 2).await.unwrap());
    assert!(store.due_memory_updates(100, 10).await.unwrap().is_empty());
}
