//! One conformance suite for every [`Store`] backend (tests): each case states a promise of
//! the store's traits (accept and dedupe, arrival order, redelivery, what survives a restart,
//! outbox receipts, memory compare-and-swap, subagent first-terminal-write-wins, the sweep) and
//! runs against a [`Backend`]. A backend's test module runs them all with
//! `conformance!(backend)`; what only one backend can check (its files, its layout, its
//! migrations) stays in that backend's own tests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use antler_channel::{ChatMove, ConversationKey, OutboundMessage, Receipt};

use super::{
    Accept, Accepted, Claimed, ClearedMemory, ConversationRecord, FinishTurn, InboxItem,
    InboxStatus, InboxStore, OutboxStatus, PairedUser, PairingRequest, Store, StoreError,
    ThreadChoice,
};
use super::{AddedSchedule, ScheduleRecord};
use crate::agent::memory::{MemoryDocument, MemoryUpdate};
use crate::agent::message::{ChatMessage, TokenUsage};
use crate::agent::subagents::{SubagentChange, SubagentRecord, SubagentStatus, Transition};
use crate::agent::thread::ThreadState;
use crate::test_support::event;

/// A backend under test: where its stores live.
pub(crate) trait Backend {
    /// Opens this backend's store. Opened again once every handle is dropped, it holds what
    /// was written before, as after a restart.
    fn open(&self) -> Arc<dyn Store>;
}

/// Runs every conformance case against the backend `$backend` makes (a fresh one per case),
/// each as its own test.
/// `conformance!(backend, skip_if cond)`: each case returns at once when `cond` is true (a
/// backend that needs a server the machine may not have says why it skips).
macro_rules! conformance {
    ($backend:expr) => {
        $crate::store::conformance::conformance!($backend, skip_if false);
    };
    ($backend:expr, skip_if $skip:expr) => {
        $crate::store::conformance::conformance!(@cases $backend; $skip; a_lease_is_held_renewed_released_and_taken_over,
            accept_stores_once_and_recognises_redelivery_until_expiry,
            fresh_thread_starts_the_next_generation,
            finish_turn_writes_thread_outbox_and_removes_the_inbox_item_together,
            delivery_records_receipts_and_failures,
            a_saved_draft_survives_a_reopen_and_goes_to_the_first_reply,
            state_survives_reopening,
            concurrent_accepts_all_land_in_arrival_order,
            subagent_first_terminal_write_wins_and_restart_fails_running_ones,
            concurrent_terminal_writes_leave_exactly_one_winner,
            subagents_are_found_by_their_turns_call_listed_per_thread_and_swept_when_old,
            memory_documents_and_queue_newest_wins,
            memory_queue_keeps_one_entry_per_user_and_thread,
            a_newer_update_takes_over_what_the_unread_one_held,
            an_update_applies_only_while_it_is_still_queued_as_read,
            update_memory_is_a_compare_and_swap,
            clear_memory_drops_the_document_and_that_users_queued_updates_only,
            memory_keys_page_in_key_order,
            conversations_page_in_key_order,
            a_failed_delivery_is_requeued_once_by_an_operator,
            dedupe_keys_of_different_conversations_never_collide,
            a_released_turn_gives_its_attempt_back,
            checkpoints_append_messages_and_keep_failed_spans,
            counts_follow_accepts_and_finished_turns,
            a_batch_is_accepted_in_order_and_sees_its_own_redeliveries,
            a_thread_read_while_turns_commit_is_consistent,
            skill_switches_are_kept_and_survive_reopening,
            schedules_are_added_once_within_the_limit_and_removed_with_their_marks,
            pairing_requests_and_approved_users_are_kept_and_settled_together,
            a_turn_that_absorbed_album_parts_finishes_them_with_it,
            a_moved_conversation_goes_on_with_its_thread_and_remembers_the_old_chat,
            approvals_open_once_decide_once_and_survive_reopening);
    };
    (@cases $backend:expr; $skip:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if $skip {
                    return;
                }
                $crate::store::conformance::$case(&$backend).await;
            }
        )*
    };
}
pub(crate) use conformance;

/// Accepts a message that must be new.
pub(crate) async fn accept_new<S: InboxStore + ?Sized>(store: &S, request: Accept) -> InboxItem {
    match store.accept(request).await.unwrap() {
        Accepted::New(item) => item,
        other => panic!("expected a new message, got {other:?}"),
    }
}

/// An event of conversation `c1` with a TTL of 1 s.
pub(crate) fn accept(event_id: &str, thread: ThreadChoice, now_ms: u64) -> Accept {
    Accept {
        dedupe_ttl_ms: 1_000,
        trace: crate::telemetry::TraceContext::fresh(),
        event: event("c1", event_id, "hi"),
        thread,
        now_ms,
    }
}

pub(crate) fn reply(thread_id: &str, text: &str) -> OutboundMessage {
    OutboundMessage {
        prompts: Vec::new(),
        idempotency_key: format!("{thread_id}:{text}"),
        conversation: ConversationKey::new("api", ["c1"]),
        thread_id: thread_id.to_owned(),
        text: text.to_owned(),
        reply_to: None,
        files: Vec::new(),
        reply_context: None,
    }
}

pub(crate) async fn accept_stores_once_and_recognises_redelivery_until_expiry(
    backend: &dyn Backend,
) {
    let store = backend.open();
    let InboxItem { seq, thread_id, .. } =
        accept_new(&*store, accept("m1", ThreadChoice::Current, 10)).await;
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

    // A key is recognised for its whole TTL, whatever the clock's position.
    let m2 = |at| store.accept(accept("m2", ThreadChoice::Current, at));
    assert!(matches!(m2(2_900).await.unwrap(), Accepted::New(_)));
    assert!(matches!(
        m2(3_100).await.unwrap(),
        Accepted::Duplicate { .. }
    ));

    // A sweep forgets only what expired.
    store.sweep(2_500, 1_000).await.unwrap();
    let again = store
        .accept(accept("m1", ThreadChoice::Current, 2_600))
        .await
        .unwrap();
    assert!(matches!(again, Accepted::Duplicate { .. }), "{again:?}");
    assert!(matches!(
        m2(3_500).await.unwrap(),
        Accepted::Duplicate { .. }
    ));
    store.sweep(4_000, 1_000).await.unwrap();
    assert!(matches!(m2(4_001).await.unwrap(), Accepted::New(_)));
}

pub(crate) async fn fresh_thread_starts_the_next_generation(backend: &dyn Backend) {
    let store = backend.open();
    let InboxItem {
        thread_id: first, ..
    } = accept_new(&*store, accept("m1", ThreadChoice::Current, 1)).await;
    let InboxItem {
        thread_id: second, ..
    } = accept_new(&*store, accept("m2", ThreadChoice::Fresh, 2)).await;
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

pub(crate) async fn finish_turn_writes_thread_outbox_and_removes_the_inbox_item_together(
    backend: &dyn Backend,
) {
    let store = backend.open();
    let InboxItem { seq, thread_id, .. } =
        accept_new(&*store, accept("m1", ThreadChoice::Current, 1)).await;
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
        seen: 0,
        from: 0,
        enqueued_at_ms: 5,
        due_at_ms: 30_005,
    };
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: Some(thread.clone()),
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: Some(update.clone()),
            draft: None,
            now_ms: 5,
            absorbed: Vec::new(),
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

pub(crate) async fn delivery_records_receipts_and_failures(backend: &dyn Backend) {
    let store = backend.open();
    // Its dedupe key outlives the sweeps below, so they count the replies alone.
    let InboxItem { seq, thread_id, .. } =
        accept_new(&*store, accept_in("c1", "m1", 1, 10_000)).await;
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: None,
            draft: None,
            now_ms: 1,
            absorbed: Vec::new(),
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
    assert!(store.outbox_item(items[1].seq).await.unwrap().is_some());
    assert_eq!(store.sweep(1_500, 1_000).await.unwrap(), 2);
    for item in &items {
        assert!(store.outbox_item(item.seq).await.unwrap().is_none());
    }
}

pub(crate) async fn a_saved_draft_survives_a_reopen_and_goes_to_the_first_reply(
    backend: &dyn Backend,
) {
    let draft = Receipt {
        platform_message_id: "d-1".to_owned(),
    };
    let (seq, thread_id) = {
        let store = backend.open();
        let InboxItem { seq, thread_id, .. } =
            accept_new(&*store, accept("m1", ThreadChoice::Current, 1)).await;
        store.save_draft(seq, &draft).await.unwrap();
        (seq, thread_id)
    };
    let store = backend.open();
    let item = store.start_turn(seq).await.unwrap();
    assert_eq!(item.draft.as_ref(), Some(&draft), "a re-run finds it");
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: None,
            draft: item.draft,
            now_ms: 2,
            absorbed: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(items[0].draft.as_ref(), Some(&draft));
    assert_eq!(items[1].draft, None, "only the first reply replaces it");
    let stored = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!(stored.draft, Some(draft));
}

pub(crate) async fn skill_switches_are_kept_and_survive_reopening(backend: &dyn Backend) {
    {
        let store = backend.open();
        assert!(store.skill_switches().await.unwrap().is_empty());
        store.set_skill_switch("postmortem", false).await.unwrap();
        store
            .set_skill_switch("incident-summary", false)
            .await
            .unwrap();
        store
            .set_skill_switch("incident-summary", true)
            .await
            .unwrap();
    }
    let store = backend.open();
    let switches = store.skill_switches().await.unwrap();
    assert_eq!(
        switches.into_iter().collect::<Vec<_>>(),
        [
            ("incident-summary".to_owned(), true),
            ("postmortem".to_owned(), false)
        ]
    );
}

pub(crate) async fn schedules_are_added_once_within_the_limit_and_removed_with_their_marks(
    backend: &dyn Backend,
) {
    let schedule = |name: &str, prompt: &str| ScheduleRecord {
        name: name.to_owned(),
        when: "0 9 * * 1-5".to_owned(),
        timezone: "Europe/Berlin".to_owned(),
        conversation: "slack:T1:C2".to_owned(),
        prompt: prompt.to_owned(),
        created_by: "slack:U1".to_owned(),
        created_at_ms: 1_000,
    };
    {
        let store = backend.open();
        assert!(store.schedules().await.unwrap().is_empty());
        let morning = schedule("morning", "errors?");
        assert_eq!(
            store.add_schedule(&morning, 2).await.unwrap(),
            AddedSchedule::Added
        );
        // The name is taken: the first one stays as it was.
        assert_eq!(
            store
                .add_schedule(&schedule("morning", "other"), 2)
                .await
                .unwrap(),
            AddedSchedule::Exists
        );
        assert_eq!(
            store
                .add_schedule(&schedule("evening", "wrap up"), 2)
                .await
                .unwrap(),
            AddedSchedule::Added
        );
        assert_eq!(
            store
                .add_schedule(&schedule("night", "sleep"), 2)
                .await
                .unwrap(),
            AddedSchedule::Full
        );
        store.set_schedule_mark("morning", 5_000).await.unwrap();
        // A config schedule has a mark and no record.
        store.set_schedule_mark("from-config", 7_000).await.unwrap();
        store.set_schedule_mark("morning", 6_000).await.unwrap();
    }
    let store = backend.open();
    let names: Vec<(String, String)> = store
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.prompt))
        .collect();
    assert_eq!(
        names,
        [
            ("evening".to_owned(), "wrap up".to_owned()),
            ("morning".to_owned(), "errors?".to_owned())
        ]
    );
    let marks = store.schedule_marks().await.unwrap();
    assert_eq!(marks.get("morning"), Some(&6_000));
    assert_eq!(marks.get("from-config"), Some(&7_000));

    assert!(store.remove_schedule("morning").await.unwrap());
    assert!(!store.remove_schedule("morning").await.unwrap());
    assert!(!store.remove_schedule("from-config").await.unwrap());
    let marks = store.schedule_marks().await.unwrap();
    assert_eq!(marks.get("morning"), None, "removed with its schedule");
    assert_eq!(marks.get("from-config"), Some(&7_000));
    // Room again, and a new schedule of the old name starts without the old mark.
    assert_eq!(
        store
            .add_schedule(&schedule("morning", "again"), 2)
            .await
            .unwrap(),
        AddedSchedule::Added
    );
    assert_eq!(store.schedule_marks().await.unwrap().get("morning"), None);
}

pub(crate) async fn pairing_requests_and_approved_users_are_kept_and_settled_together(
    backend: &dyn Backend,
) {
    let request = |channel: &str, user: &str, code: &str, at: u64| PairingRequest {
        channel: channel.to_owned(),
        user_id: user.to_owned(),
        name: Some(format!("{user} the user")),
        code: code.to_owned(),
        created_at_ms: at,
    };
    let pair = |(channel, user): (&str, &str)| (channel.to_owned(), user.to_owned());
    {
        let store = backend.open();
        assert!(store.pairing_requests().await.unwrap().is_empty());
        assert!(store.paired_users().await.unwrap().is_empty());
        store
            .put_pairing_request(&request("telegram", "42", "AAAA2222", 1), &[])
            .await
            .unwrap();
        store
            .put_pairing_request(&request("slack", "U1", "BBBB3333", 2), &[])
            .await
            .unwrap();
        // The same user again replaces their request; a dropped one goes in the same write.
        store
            .put_pairing_request(
                &request("telegram", "42", "CCCC4444", 3),
                &[pair(("slack", "U1"))],
            )
            .await
            .unwrap();
        store
            .put_pairing_request(&request("discord", "7", "DDDD5555", 4), &[])
            .await
            .unwrap();
    }
    let store = backend.open();
    assert_eq!(
        store.pairing_requests().await.unwrap(),
        [
            request("discord", "7", "DDDD5555", 4),
            request("telegram", "42", "CCCC4444", 3)
        ],
        "kept over a reopen, in (channel, user) order"
    );
    let ada = PairedUser {
        channel: "telegram".to_owned(),
        user_id: "42".to_owned(),
        admin: true,
        approved_at_ms: 5,
    };
    assert!(
        store
            .settle_pairing("telegram", "42", Some(&ada))
            .await
            .unwrap()
    );
    assert!(
        !store
            .settle_pairing("telegram", "42", Some(&ada))
            .await
            .unwrap(),
        "its request is gone"
    );
    // A denial removes the request and approves nobody.
    assert!(store.settle_pairing("discord", "7", None).await.unwrap());
    // Approving without a request (an operator's first user) records the user all the same.
    let bob = PairedUser {
        channel: "feishu".to_owned(),
        user_id: "ou_bob".to_owned(),
        admin: false,
        approved_at_ms: 6,
    };
    assert!(
        !store
            .settle_pairing("feishu", "ou_bob", Some(&bob))
            .await
            .unwrap()
    );
    drop(store);
    let store = backend.open();
    assert!(store.pairing_requests().await.unwrap().is_empty());
    assert_eq!(store.paired_users().await.unwrap(), [bob, ada]);
}

pub(crate) async fn state_survives_reopening(backend: &dyn Backend) {
    let thread_id = {
        let store = backend.open();
        let InboxItem { thread_id, .. } =
            accept_new(&*store, accept("m1", ThreadChoice::Current, 1)).await;
        let InboxItem { seq, .. } =
            accept_new(&*store, accept("m2", ThreadChoice::Current, 1)).await;
        store
            .finish_turn(FinishTurn {
                inbox_seq: seq,
                trace: crate::telemetry::TraceContext::fresh(),
                thread: None,
                replies: vec![reply(&thread_id, "pending")],
                memory_update: None,
                draft: None,
                now_ms: 1,
                absorbed: Vec::new(),
            })
            .await
            .unwrap();
        thread_id
    };
    let store = backend.open();
    let inbox = store.inbox().await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].thread_id, thread_id);
    let pending = store.outbox_pending().await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].message.text, "pending");
    // The counts come back with the records.
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.inbox, stats.outbox_pending), (1, 1));
    // A new event in the same conversation joins its thread.
    let next = accept_new(&*store, accept("m3", ThreadChoice::Current, 2)).await;
    assert_eq!(next.thread_id, thread_id);
}

pub(crate) async fn concurrent_accepts_all_land_in_arrival_order(backend: &dyn Backend) {
    let store = backend.open();
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

pub(crate) fn subagent(id: &str, status: SubagentStatus) -> SubagentRecord {
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

pub(crate) async fn subagent_first_terminal_write_wins_and_restart_fails_running_ones(
    backend: &dyn Backend,
) {
    let store = backend.open();
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

pub(crate) async fn concurrent_terminal_writes_leave_exactly_one_winner(backend: &dyn Backend) {
    let store = backend.open();
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

pub(crate) async fn subagents_are_found_by_their_turns_call_listed_per_thread_and_swept_when_old(
    backend: &dyn Backend,
) {
    let store = backend.open();
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

pub(crate) async fn memory_documents_and_queue_newest_wins(backend: &dyn Backend) {
    let store = backend.open();
    assert!(store.memory("api:u1").await.unwrap().is_none());
    let mut doc = MemoryDocument::default();
    doc.user.top_of_mind.summary = "shipping antler".to_owned();
    store.put_memory("api:u1", &doc).await.unwrap();
    assert_eq!(store.memory("api:u1").await.unwrap(), Some(doc));

    let update = |at: u64| MemoryUpdate {
        user_id: "api:u1".to_owned(),
        thread_id: "t1".to_owned(),
        messages: vec![ChatMessage::user(format!("at {at}"))],
        seen: 0,
        from: 0,
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

pub(crate) async fn memory_queue_keeps_one_entry_per_user_and_thread(backend: &dyn Backend) {
    let store = backend.open();
    let update = |user: &str, thread: &str, at: u64| MemoryUpdate {
        user_id: user.to_owned(),
        thread_id: thread.to_owned(),
        messages: vec![ChatMessage::user(format!("{user} in {thread}"))],
        seen: 0,
        from: 0,
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

pub(crate) async fn a_newer_update_takes_over_what_the_unread_one_held(backend: &dyn Backend) {
    let store = backend.open();
    let update = |from: usize, seen: usize, texts: &[&str], at: u64| MemoryUpdate {
        user_id: "api:u1".to_owned(),
        thread_id: "t1".to_owned(),
        messages: texts.iter().map(|t| ChatMessage::user(*t)).collect(),
        seen,
        from,
        enqueued_at_ms: at,
        due_at_ms: at,
    };
    store
        .queue_memory_update(update(2, 1, &["seen", "first"], 1))
        .await
        .unwrap();
    // The newer one comes with a turn's end, as in production; the older was never read.
    store
        .finish_turn(FinishTurn {
            inbox_seq: 999,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: Vec::new(),
            memory_update: Some(update(4, 1, &["first", "second"], 2)),
            draft: None,
            now_ms: 2,
            absorbed: Vec::new(),
        })
        .await
        .unwrap();
    let due = store.due_memory_updates(100, 10).await.unwrap();
    assert_eq!(due, vec![update(2, 1, &["seen", "first", "second"], 2)]);
    // Once read and applied, a later one carries only its own messages.
    store
        .apply_memory_update(&due[0], &mut |doc| doc.unwrap_or_default())
        .await
        .unwrap();
    store
        .queue_memory_update(update(6, 1, &["second", "third"], 3))
        .await
        .unwrap();
    assert_eq!(
        store.due_memory_updates(100, 10).await.unwrap(),
        vec![update(6, 1, &["second", "third"], 3)]
    );
}

pub(crate) fn memory_update(user: &str, thread: &str, at: u64) -> MemoryUpdate {
    MemoryUpdate {
        user_id: user.to_owned(),
        thread_id: thread.to_owned(),
        messages: vec![ChatMessage::user(format!("at {at}"))],
        seen: 0,
        from: 0,
        enqueued_at_ms: at,
        due_at_ms: at + 30,
    }
}

pub(crate) async fn an_update_applies_only_while_it_is_still_queued_as_read(backend: &dyn Backend) {
    let store = backend.open();
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

pub(crate) async fn update_memory_is_a_compare_and_swap(backend: &dyn Backend) {
    let store = backend.open();
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

    // Concurrent changes each see the one before: none is lost.
    let writers: Vec<_> = (0..16)
        .map(|n| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                store
                    .update_memory("api:u1", &mut |doc| {
                        let mut doc = doc.unwrap_or_default();
                        doc.user.top_of_mind.summary.push_str(&format!("[{n}]"));
                        Some(doc)
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let summary = store
        .memory("api:u1")
        .await
        .unwrap()
        .unwrap()
        .user
        .top_of_mind
        .summary;
    for n in 0..16 {
        assert!(summary.contains(&format!("[{n}]")), "{summary}");
    }

    // None deletes.
    assert_eq!(
        store.update_memory("api:u1", &mut |_| None).await.unwrap(),
        None
    );
    assert!(store.memory("api:u1").await.unwrap().is_none());
}

pub(crate) async fn clear_memory_drops_the_document_and_that_users_queued_updates_only(
    backend: &dyn Backend,
) {
    let store = backend.open();
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

pub(crate) async fn memory_keys_page_in_key_order(backend: &dyn Backend) {
    let store = backend.open();
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

pub(crate) async fn conversations_page_in_key_order(backend: &dyn Backend) {
    let store = backend.open();
    for conversation in ["c", "a", "z", "b"] {
        accept_new(&*store, accept_in(conversation, "m1", 1, 10_000)).await;
    }
    let keys = |records: Vec<ConversationRecord>| -> Vec<String> {
        records.into_iter().map(|r| r.key).collect()
    };
    assert_eq!(
        keys(store.conversations(None, 2).await.unwrap()),
        ["api:a", "api:b"]
    );
    assert_eq!(
        keys(store.conversations(Some("api:b"), 5).await.unwrap()),
        ["api:c", "api:z"]
    );
    assert!(
        store
            .conversations(Some("api:z"), 2)
            .await
            .unwrap()
            .is_empty()
    );
}

pub(crate) async fn a_failed_delivery_is_requeued_once_by_an_operator(backend: &dyn Backend) {
    let store = backend.open();
    let InboxItem { seq, thread_id, .. } =
        accept_new(&*store, accept_in("c1", "m1", 1, 10_000)).await;
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seq,
            thread: None,
            replies: vec![reply(&thread_id, "a"), reply(&thread_id, "b")],
            memory_update: None,
            draft: None,
            now_ms: 1,
            absorbed: Vec::new(),
            trace: crate::telemetry::TraceContext::fresh(),
        })
        .await
        .unwrap();
    let recent = store.outbox_recent(5).await.unwrap();
    assert_eq!(
        recent.iter().map(|i| i.seq).collect::<Vec<_>>(),
        [items[1].seq, items[0].seq],
        "newest first"
    );
    assert_eq!(store.outbox_recent(1).await.unwrap().len(), 1);
    store
        .delivery_failed(items[0].seq, "403 forbidden", true, 2)
        .await
        .unwrap();
    assert_eq!(store.stats().await.unwrap().outbox_pending, 1);

    let again = store.requeue_delivery(items[0].seq).await.unwrap();
    assert_eq!(
        (again.status, again.attempts, again.finished_at_ms),
        (OutboxStatus::Pending, 0, None)
    );
    assert_eq!(again.last_error.as_deref(), Some("403 forbidden"));
    assert_eq!(store.stats().await.unwrap().outbox_pending, 2);
    assert_eq!(store.outbox_pending().await.unwrap().len(), 2);
    // A pending (or sent) item is left as it is, and counted once.
    let unchanged = store.requeue_delivery(items[0].seq).await.unwrap();
    assert_eq!(unchanged, again);
    assert_eq!(store.stats().await.unwrap().outbox_pending, 2);
    assert!(matches!(
        store.requeue_delivery(items[1].seq + 7).await,
        Err(StoreError::Missing { .. })
    ));
}

/// An event of `conversation` with a TTL of `ttl_ms`.
pub(crate) fn accept_in(conversation: &str, event_id: &str, now_ms: u64, ttl_ms: u64) -> Accept {
    Accept {
        dedupe_ttl_ms: ttl_ms,
        trace: crate::telemetry::TraceContext::fresh(),
        event: event(conversation, event_id, "hi"),
        thread: ThreadChoice::Current,
        now_ms,
    }
}

pub(crate) async fn dedupe_keys_of_different_conversations_never_collide(backend: &dyn Backend) {
    let store = backend.open();
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

pub(crate) async fn a_released_turn_gives_its_attempt_back(backend: &dyn Backend) {
    let store = backend.open();
    let InboxItem { seq, .. } = accept_new(&*store, accept("m1", ThreadChoice::Current, 1)).await;
    assert_eq!(store.start_turn(seq).await.unwrap().attempts, 1);
    store.release_turn(seq).await.unwrap();
    let item = &store.inbox().await.unwrap()[0];
    assert_eq!((item.status, item.attempts), (InboxStatus::Pending, 0));
    assert_eq!(store.start_turn(seq).await.unwrap().attempts, 1);
}

pub(crate) async fn checkpoints_append_messages_and_keep_failed_spans(backend: &dyn Backend) {
    let store = backend.open();
    let InboxItem { thread_id, .. } =
        accept_new(&*store, accept("m1", ThreadChoice::Current, 1)).await;
    let mut thread = store.thread(&thread_id).await.unwrap().unwrap();
    for turn in 0..20 {
        thread
            .messages
            .push(ChatMessage::user(format!("question {turn}")));
        thread
            .messages
            .push(ChatMessage::assistant(format!("answer {turn}")));
        store.checkpoint_thread(&mut thread).await.unwrap();
        assert_eq!(thread.saved_messages, thread.messages.len());
    }
    // A failed span is metadata.
    thread.fail_from(38);
    store.checkpoint_thread(&mut thread).await.unwrap();
    let loaded = store.thread(&thread_id).await.unwrap().unwrap();
    assert_eq!(loaded.messages, thread.messages);
    assert_eq!(loaded.failed, [38..40]);
    assert_eq!(loaded.saved_messages, 40);
}

/// The counts and the oldest item's acceptance time follow accepts and finished turns.
pub(crate) async fn counts_follow_accepts_and_finished_turns(backend: &dyn Backend) {
    let store = backend.open();
    assert_eq!(store.stats().await.unwrap().oldest_inbox_at_ms, None);
    let mut seqs = Vec::new();
    for n in 0..3 {
        let item = accept_new(
            &*store,
            accept(&format!("m{n}"), ThreadChoice::Current, 10 + n),
        )
        .await;
        seqs.push(item.seq);
    }
    // A redelivery adds nothing.
    store
        .accept(accept("m0", ThreadChoice::Current, 20))
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.inbox, stats.oldest_inbox_at_ms), (3, Some(10)));
    store
        .finish_turn(FinishTurn {
            inbox_seq: seqs[0],
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: vec![reply("t", "done")],
            memory_update: None,
            draft: None,
            now_ms: 3,
            absorbed: Vec::new(),
        })
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.inbox, stats.outbox_pending, stats.oldest_inbox_at_ms),
        (2, 1, Some(11)),
        "the oldest item left is the next one accepted"
    );
}

/// An album's turn finishes the parts it took in, in its own transaction: they leave the
/// inbox with it (and are counted), get no reply, and a redelivery of one is a duplicate.
pub(crate) async fn a_turn_that_absorbed_album_parts_finishes_them_with_it(backend: &dyn Backend) {
    let store = backend.open();
    let mut seqs = Vec::new();
    for n in 0..4 {
        let item = accept_new(&*store, accept(&format!("m{n}"), ThreadChoice::Current, 1)).await;
        seqs.push(item.seq);
    }
    let mut started = store.start_turn(seqs[0]).await.unwrap();
    started.event.media_group = Some("g".to_owned());
    let items = store
        .finish_turn(FinishTurn {
            inbox_seq: seqs[0],
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: vec![reply("t", "both photos")],
            memory_update: None,
            draft: None,
            absorbed: vec![seqs[1], seqs[2]],
            now_ms: 2,
        })
        .await
        .unwrap();
    assert_eq!(items.len(), 1);
    let left: Vec<u64> = store.inbox().await.unwrap().iter().map(|i| i.seq).collect();
    assert_eq!(left, [seqs[3]], "the other message stays");
    assert_eq!(store.stats().await.unwrap().inbox, 1);
    assert!(store.replies(seqs[1]).await.unwrap().is_empty());
    assert!(matches!(
        store.start_turn(seqs[1]).await,
        Err(StoreError::Missing { .. })
    ));
    assert!(matches!(
        store
            .accept(accept("m1", ThreadChoice::Current, 3))
            .await
            .unwrap(),
        Accepted::Duplicate { .. }
    ));
}

/// A chat that moved (a group upgraded to a supergroup): the new conversation goes on with the
/// old one's thread, remembers the old chat, and keeps its own thread if it had one; moving
/// again changes nothing, and the move survives a reopen.
pub(crate) async fn a_moved_conversation_goes_on_with_its_thread_and_remembers_the_old_chat(
    backend: &dyn Backend,
) {
    let chat_move = |from: &str, to: &str| ChatMove {
        from: ConversationKey::new("api", [from]),
        from_chat: from.to_owned(),
        to: ConversationKey::new("api", [to]),
        to_chat: to.to_owned(),
        by: "u9".to_owned(),
    };
    {
        let store = backend.open();
        let InboxItem { thread_id, .. } =
            accept_new(&*store, accept("m1", ThreadChoice::Current, 1)).await;
        store
            .move_conversation(&chat_move("c1", "c2"))
            .await
            .unwrap();
        store
            .move_conversation(&chat_move("c1", "c2"))
            .await
            .unwrap();
        let moved = store.conversation("api:c2").await.unwrap().unwrap();
        assert_eq!(moved.key, "api:c2");
        assert_eq!(moved.thread_id, thread_id, "the history goes on");
        assert_eq!(moved.user_id, "api:u1");
        assert_eq!(moved.moved_from_chat.as_deref(), Some("c1"));
        let old = store.conversation("api:c1").await.unwrap().unwrap();
        assert_eq!((old.thread_id, old.moved_from_chat), (thread_id, None));

        // A chat nobody talked in yet is remembered all the same, owned by who moved it.
        store
            .move_conversation(&chat_move("c3", "c4"))
            .await
            .unwrap();
        let fresh = store.conversation("api:c4").await.unwrap().unwrap();
        assert_eq!(
            (fresh.user_id.as_str(), fresh.moved_from_chat.as_deref()),
            ("api:u9", Some("c3"))
        );
        // A message into the new chat goes to the thread it took over.
        let mut next = accept("m2", ThreadChoice::Current, 2);
        next.event.conversation = ConversationKey::new("api", ["c2"]);
        let item = accept_new(&*store, next).await;
        assert_eq!(item.thread_id, moved.thread_id);
    }
    let store = backend.open();
    let moved = store.conversation("api:c2").await.unwrap().unwrap();
    assert_eq!(moved.moved_from_chat.as_deref(), Some("c1"));
}

pub(crate) async fn a_batch_is_accepted_in_order_and_sees_its_own_redeliveries(
    backend: &dyn Backend,
) {
    let store = backend.open();
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

pub(crate) async fn a_thread_read_while_turns_commit_is_consistent(backend: &dyn Backend) {
    let store = backend.open();
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

pub(crate) async fn a_lease_is_held_renewed_released_and_taken_over(backend: &dyn Backend) {
    let store = backend.open();
    assert_eq!(store.claim("a", 0, 100).await.unwrap(), Claimed::First);
    assert_eq!(store.claim("a", 10, 110).await.unwrap(), Claimed::Held);
    store.renew("a", 150).await.unwrap();
    // Nobody else can renew it.
    let lost = store.renew("b", 150).await.unwrap_err();
    assert!(
        matches!(&lost, StoreError::LeaseLost { holder } if holder == "a"),
        "{lost:?}"
    );
    assert!(!lost.is_retryable());
    // A clean stop gives it up: the next owner takes it at once, told so.
    store.release("b").await.unwrap();
    store.release("a").await.unwrap();
    assert!(store.renew("a", 200).await.is_err(), "released means gone");
    assert_eq!(
        store.claim("b", 20, 120).await.unwrap(),
        Claimed::Released {
            owner: "a".to_owned()
        }
    );
    drop(store);
    // A restart after the lease ran out: the last owner did not stop cleanly.
    let store = backend.open();
    assert_eq!(
        store.claim("c", 500, 600).await.unwrap(),
        Claimed::Expired {
            owner: "b".to_owned()
        }
    );
    store.renew("c", 700).await.unwrap();
}

pub(crate) async fn approvals_open_once_decide_once_and_survive_reopening(backend: &dyn Backend) {
    use super::{ApprovalDecision, Decided};
    use crate::agent::approvals::{ApprovalRecord, ApprovalState, Opened, Requester};
    let record = |id: &str, conversation: &str, message: usize, at: u64| ApprovalRecord {
        id: id.to_owned(),
        conversation: conversation.to_owned(),
        channel: "api".to_owned(),
        thread_id: format!("t-{conversation}"),
        message,
        call_id: "call_1".to_owned(),
        tool: "bash".to_owned(),
        arguments: "{}".to_owned(),
        requester: Requester {
            user_id: "ada".to_owned(),
            name: None,
            admin: false,
            group: false,
        },
        created_at_ms: at,
        expires_at_ms: at + 1000,
        state: ApprovalState::Pending,
        decided_by: None,
        reason: None,
        decided_at_ms: None,
        queued: false,
    };
    let decision = |state, by: &str| ApprovalDecision {
        state,
        by: by.to_owned(),
        reason: Some("why".to_owned()),
        at_ms: 5,
    };
    {
        let store = backend.open();
        let first = record("aaaa2222", "api:a", 1, 1);
        assert_eq!(
            store.open_approval(&first, 2).await.unwrap(),
            Opened::New(first.clone())
        );
        // The same call again (a re-run): the stored one, whatever the new id.
        assert_eq!(
            store
                .open_approval(&record("bbbb3333", "api:a", 1, 2), 2)
                .await
                .unwrap(),
            Opened::Existing(first.clone())
        );
        // The same call id in a later message is another call.
        let later = record("cccc4444", "api:a", 3, 3);
        assert_eq!(
            store.open_approval(&later, 2).await.unwrap(),
            Opened::New(later.clone())
        );
        // The conversation's cap: two pending already.
        assert_eq!(
            store
                .open_approval(&record("dddd5555", "api:a", 5, 4), 2)
                .await
                .unwrap(),
            Opened::Full
        );
        // Another conversation has its own.
        let other = record("eeee6666", "api:b", 1, 5);
        assert!(matches!(
            store.open_approval(&other, 2).await.unwrap(),
            Opened::New(_)
        ));
        assert_eq!(
            store
                .approval_for_call("t-api:a", &later.call_key())
                .await
                .unwrap(),
            Some(later.clone())
        );
        assert_eq!(
            store
                .approval_for_call("t-api:a", "9:call_1")
                .await
                .unwrap(),
            None
        );
        // Decided once: the first decision stands.
        let Decided::Now(approved) = store
            .decide_approval("aaaa2222", &decision(ApprovalState::Approved, "bob"))
            .await
            .unwrap()
        else {
            panic!("the first decision must be stored");
        };
        assert_eq!(approved.state, ApprovalState::Approved);
        assert_eq!(approved.decided_by.as_deref(), Some("bob"));
        assert_eq!(
            store
                .decide_approval("aaaa2222", &decision(ApprovalState::Denied, "eve"))
                .await
                .unwrap(),
            Decided::Before(approved.clone())
        );
        assert!(matches!(
            store
                .decide_approval("zzzz9999", &decision(ApprovalState::Denied, "eve"))
                .await,
            Err(StoreError::Missing { .. })
        ));
    }
    // Two deciders at once: exactly one wins.
    let store = backend.open();
    let (approve, deny) = (
        decision(ApprovalState::Approved, "bob"),
        decision(ApprovalState::Denied, "eve"),
    );
    let (a, b) = tokio::join!(
        store.decide_approval("cccc4444", &approve),
        store.decide_approval("cccc4444", &deny),
    );
    let wins = [a.unwrap(), b.unwrap()]
        .iter()
        .filter(|d| matches!(d, Decided::Now(_)))
        .count();
    assert_eq!(wins, 1);
    // Open: pending ones and decided ones not queued yet, oldest first.
    let open: Vec<String> = store
        .open_approvals()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(open, ["aaaa2222", "cccc4444", "eeee6666"]);
    store.approval_queued("aaaa2222").await.unwrap();
    drop(store);
    let store = backend.open();
    let open: Vec<String> = store
        .open_approvals()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(open, ["cccc4444", "eeee6666"]);
    let kept = store.approval("aaaa2222").await.unwrap().unwrap();
    assert!(kept.queued);
    assert_eq!(kept.state, ApprovalState::Approved);

    // The sweep forgets what is decided, queued and past the retention (decided at 5, the
    // cutoff 100): with its call's entry. What is still open stays, decided or not.
    assert!(store.sweep(1_000, 900).await.unwrap() >= 1);
    assert_eq!(store.approval("aaaa2222").await.unwrap(), None);
    assert_eq!(
        store
            .approval_for_call("t-api:a", &kept.call_key())
            .await
            .unwrap(),
        None
    );
    for open in ["cccc4444", "eeee6666"] {
        assert!(store.approval(open).await.unwrap().is_some(), "{open}");
    }
}
