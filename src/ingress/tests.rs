//! The ingress, dispatcher and turn runner together, on an in-memory store that can be told
//! to fail, with a model that echoes and a channel that records what it was asked to send.

use crate::store::faulty::{Call, FaultyStore};
use crate::store::{InboxStatus, InboxStore, MemStore, OutboxStore, StoreError, ThreadStore};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use antler_channel::Channel;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::turn::TurnSettings;
use super::*;
use crate::agent::message::ChatMessage;
use crate::agent::middleware::MiddlewareChain;
use crate::agent::model::{ChatModel, DeltaSink, ModelError, ModelRequest, ModelResponse};
use crate::agent::runtime::{Runtime, RuntimeSettings};
use crate::agent::tools::ToolRegistry;
use crate::delivery::Delivery;
use crate::retry::RetryPolicy;
use crate::test_support::{RecordingChannel, event};
use access::{Access, AccessRules};

/// Echoes the last user message; `panic`, `hang` and `fail` do what they say.
#[derive(Debug, Default)]
struct EchoModel {
    requests: Mutex<Vec<ModelRequest>>,
}

#[async_trait::async_trait]
impl ChatModel for EchoModel {
    fn name(&self) -> &str {
        "echo"
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        _deltas: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError> {
        self.requests.lock().unwrap().push(request.clone());
        let last = request
            .messages
            .iter()
            .rev()
            .find_map(|m| match m {
                ChatMessage::User { content, .. } => Some(content.clone()),
                _ => None,
            })
            .unwrap_or_default();
        match last.as_str() {
            "panic" => panic!("the model exploded"),
            "hang" => std::future::pending().await,
            "fail" => Err(ModelError::Server {
                status: 500,
                attempts: 1,
            }),
            _ => crate::agent::model::scripted::ScriptedModel::text(&format!("echo: {last}")),
        }
    }
}

pub(crate) struct Harness {
    pub(crate) store: Arc<FaultyStore>,
    pub(crate) ingress: Ingress,
    model: Arc<EchoModel>,
    channel: Arc<RecordingChannel>,
    turns: TaskTracker,
    turn_cancel: CancellationToken,
    pub(crate) stop: CancellationToken,
}

pub(crate) fn harness(max_attempts: u32) -> Harness {
    harness_with(max_attempts, Access::default())
}

pub(crate) fn harness_with(max_attempts: u32, access: Access) -> Harness {
    let store = Arc::new(FaultyStore::new(Arc::new(MemStore::new())));
    let model = Arc::new(EchoModel::default());
    let channel = Arc::new(RecordingChannel::default());
    let hub = EventHub::default();
    let turns = TaskTracker::new();
    let turn_cancel = CancellationToken::new();
    let stop = CancellationToken::new();
    let delivery = Delivery::new(
        store.clone(),
        [("api".to_owned(), channel.clone() as Arc<dyn Channel>)].into(),
        RetryPolicy {
            max_attempts: 3,
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(5),
        },
        crate::delivery::ReplyFiles {
            data_root: std::path::PathBuf::from("/nonexistent"),
            max_bytes: 1024,
        },
        crate::health::ChannelHealth::default(),
        TaskTracker::new(),
        CancellationToken::new(),
    );
    let runtime = Runtime::new(
        model.clone(),
        ToolRegistry::builtin(),
        MiddlewareChain::default(),
        RuntimeSettings {
            system_prompt: crate::live::Live::text("test"),
            max_model_calls: 5,
            max_parallel_tools: 4,
            context_tokens: 0,
            data_root: std::env::temp_dir().join("antler-ingress-tests"),
            timezone: jiff::tz::TimeZone::UTC,
            token_budget: None,
        },
    );
    let runner = TurnRunner::new(
        store.clone(),
        runtime,
        hub.clone(),
        delivery,
        &TurnSettings {
            max_attempts,
            turn_timeout: Duration::from_secs(60),
            max_attachment_bytes: 1 << 20,
            todo: crate::agent::middleware::todo::TodoConfig::default(),
            trace_url: None,
            memory_identities: crate::agent::memory::identity::MemoryIdentities::default(),
            memory_groups: crate::agent::memory::sharing::GroupPolicy::default(),
            skills: std::sync::Arc::default(),
            pairing: None,
            commands: crate::opcommands::OperatorCommands::default(),
            schedules: std::sync::Arc::new(crate::schedule::Schedules::new(
                Vec::new(),
                store.clone(),
                std::sync::Arc::new(crate::schedule::SystemClock),
                "UTC".to_owned(),
            )),
            approvals: crate::ingress::approvals::Approvals::new(
                store.clone(),
                crate::agent::middleware::approval::ApprovalsConfig::default(),
            ),
        },
        turn_cancel.clone(),
    );
    let ingress = Ingress::new(
        store.clone(),
        runner,
        hub,
        &IngressSettings {
            backlog_limit: 100,
            dedupe_ttl: Duration::from_secs(60),
            max_concurrent_turns: 4,
            access: Arc::new(access),
            pairing: None,
            health: crate::health::ChannelHealth::default(),
        },
        turns.clone(),
        stop.clone(),
    );
    Harness {
        store,
        ingress,
        model,
        channel,
        turns,
        turn_cancel,
        stop,
    }
}

/// Waits (generously) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Harness {
    pub(crate) fn sent(&self) -> Vec<String> {
        self.channel.sent()
    }

    /// Waits until `n` replies were sent.
    pub(crate) async fn until_sent(&self, n: usize) {
        until(&format!("{n} replies"), || self.sent().len() >= n).await;
    }

    async fn thread(&self, id: &str) -> crate::agent::thread::ThreadState {
        self.store.thread(id).await.unwrap().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failures_delay_a_turn_but_never_reorder_or_leak() {
    let h = harness(3);
    // The first message's turn cannot be started twice, then cannot be finished twice.
    h.store.unavailable_next(Call::StartTurn, 2);
    h.store.unavailable_next(Call::FinishTurns, 2);
    let mut thread_id = String::new();
    for n in 0..3 {
        let admission = h
            .ingress
            .accept(event("c", &format!("m{n}"), &format!("message {n}")), false)
            .await
            .unwrap();
        thread_id = admission.thread_id;
    }
    until("three replies", || h.sent().len() == 3).await;
    assert_eq!(
        h.sent(),
        ["echo: message 0", "echo: message 1", "echo: message 2"],
        "in order: the later messages waited for the failing one"
    );
    until("the backlog is empty", || h.ingress.backlog() == 0).await;
    assert!(h.store.inbox().await.unwrap().is_empty());
    let thread = h.thread(&thread_id).await;
    let users: Vec<&ChatMessage> = thread
        .messages
        .iter()
        .filter(|m| matches!(m, ChatMessage::User { .. }))
        .collect();
    assert_eq!(users.len(), 3, "each message once: {:?}", thread.messages);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_that_retrying_cannot_mend_ends_the_attempt_at_once() {
    let h = harness(3);
    // The first turn cannot start: its record is unreadable. Retried forever, it would hold
    // its conversation back; it stays in the inbox for the next start instead.
    let corrupt = StoreError::Codec {
        what: "inbox item",
        detail: "truncated".to_owned(),
    };
    h.store.fail_next(Call::StartTurn, 1, &corrupt);
    let first = h
        .ingress
        .accept(event("c", "m0", "message 0"), false)
        .await
        .unwrap();
    h.ingress
        .accept(event("c", "m1", "message 1"), false)
        .await
        .unwrap();
    h.until_sent(1).await;
    assert_eq!(
        h.sent(),
        ["echo: message 1"],
        "the next message was not held back"
    );
    let inbox = h.store.inbox().await.unwrap();
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    assert_eq!(Some(inbox[0].seq), first.seq);
    assert_eq!(inbox[0].status, InboxStatus::Pending, "it never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_failed_accept_kept_runs_and_its_redelivery_is_a_duplicate() {
    let h = harness(3);
    // The write happened, its sync failed: the sender is told to retry, but the store holds
    // the event, which must not wait for a restart.
    h.store.fail_after_next(
        Call::AcceptBatch,
        1,
        &StoreError::unavailable("sync failed"),
    );
    let failed = h.ingress.accept(event("c", "m0", "message 0"), false).await;
    assert!(matches!(failed, Err(IngressError::Store(_))), "{failed:?}");
    h.until_sent(1).await;
    assert_eq!(h.sent(), ["echo: message 0"]);
    let again = h
        .ingress
        .accept(event("c", "m0", "message 0"), false)
        .await
        .unwrap();
    assert!(!again.new, "the retry is a redelivery");
    until("the backlog is empty", || h.ingress.backlog() == 0).await;
    assert_eq!(h.sent().len(), 1, "answered once");
    // And the next message runs as usual.
    h.ingress
        .accept(event("c", "m1", "message 1"), false)
        .await
        .unwrap();
    h.until_sent(2).await;
    assert_eq!(h.sent()[1], "echo: message 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_thread_is_answered_and_never_written_over() {
    let h = harness(3);
    let first = h
        .ingress
        .accept(event("c", "m0", "remember this"), false)
        .await
        .unwrap();
    h.until_sent(1).await;
    let before = h.thread(&first.thread_id).await;
    h.store.fail_next(
        Call::Thread,
        1,
        &StoreError::Codec {
            what: "thread",
            detail: "bad bytes".to_owned(),
        },
    );
    h.ingress
        .accept(event("c", "m1", "and this"), false)
        .await
        .unwrap();
    h.until_sent(2).await;
    let sent = h.sent();
    assert!(
        sent[1].contains("cannot read this conversation's history"),
        "{sent:?}"
    );
    assert!(sent[1].contains("/new"), "{sent:?}");
    assert_eq!(
        h.thread(&first.thread_id).await,
        before,
        "the thread is as it was"
    );
    assert!(
        h.store.inbox().await.unwrap().is_empty(),
        "the message was answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_turn_is_answered_and_kept_out_of_the_context() {
    let h = harness(3);
    let first = h
        .ingress
        .accept(event("c", "m1", "panic"), false)
        .await
        .unwrap();
    h.ingress
        .accept(event("c", "m2", "hello"), false)
        .await
        .unwrap();
    until("two replies", || h.sent().len() == 2).await;
    let sent = h.sent();
    assert!(
        sent[0].contains("something went wrong inside antler"),
        "{sent:?}"
    );
    assert_eq!(sent[1], "echo: hello", "the conversation goes on");
    let thread = h.thread(&first.thread_id).await;
    assert_eq!(thread.messages.len(), 4);
    assert_eq!(
        thread.failed,
        [0..2],
        "the panicked exchange is marked failed"
    );
    let last = h.model.requests.lock().unwrap().last().cloned().unwrap();
    assert!(
        !last
            .messages
            .iter()
            .any(|m| *m == ChatMessage::user("panic")),
        "the failed exchange is not sent to the model again: {:?}",
        last.messages
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_stays_readable_and_a_resend_reads_naturally() {
    let h = harness(3);
    let first = h
        .ingress
        .accept(event("c", "m1", "fail"), false)
        .await
        .unwrap();
    until("the failure reply", || h.sent().len() == 1).await;
    let reply = h.sent()[0].clone();
    assert!(
        reply.contains("HTTP 500") && reply.contains("again"),
        "a 5xx says what happened and that a resend can help: {reply}"
    );
    h.ingress
        .accept(event("c", "m2", "hello"), false)
        .await
        .unwrap();
    until("the second reply", || h.sent().len() == 2).await;
    let thread = h.thread(&first.thread_id).await;
    assert_eq!(
        thread.messages,
        [
            ChatMessage::user("fail"),
            ChatMessage::assistant(h.sent()[0].clone()),
            ChatMessage::user("hello"),
            ChatMessage::assistant("echo: hello"),
        ]
    );
    assert_eq!(thread.failed, [0..2]);
    assert_eq!(thread.turns, 1, "only the answered turn counts");
    let requests = h.model.requests.lock().unwrap().clone();
    let seen: Vec<&ChatMessage> = requests[1]
        .messages
        .iter()
        .filter(|m| !m.text().starts_with("<context>"))
        .collect();
    assert_eq!(
        seen,
        [&ChatMessage::system("test"), &ChatMessage::user("hello")],
        "the model sees the resend alone (and the run's hidden context)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_interrupted_by_shutdown_gives_its_attempt_back() {
    let h = harness(1);
    h.ingress
        .accept(event("c", "m1", "hang"), false)
        .await
        .unwrap();
    until("the model is asked", || {
        !h.model.requests.lock().unwrap().is_empty()
    })
    .await;
    h.stop.cancel();
    h.turn_cancel.cancel();
    h.turns.close();
    tokio::time::timeout(Duration::from_secs(30), h.turns.wait())
        .await
        .unwrap();
    let inbox = h.store.inbox().await.unwrap();
    assert_eq!(inbox.len(), 1, "it stays in the inbox for the next start");
    assert_eq!(
        (inbox[0].status, inbox[0].attempts),
        (InboxStatus::Pending, 0)
    );
    assert!(h.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kept_crashing_is_given_up_and_kept_in_the_thread() {
    let h = harness(2);
    // Two earlier processes died while this message's turn ran.
    let stored = h
        .store
        .accept(crate::store::Accept {
            dedupe_ttl_ms: 60_000,
            trace: crate::telemetry::TraceContext::fresh(),
            event: event("c", "m1", "crash me"),
            thread: crate::store::ThreadChoice::Current,
            now_ms: 1,
        })
        .await
        .unwrap();
    let crate::store::Accepted::New(item) = stored else {
        panic!("new");
    };
    h.store.start_turn(item.seq).await.unwrap();
    h.store.start_turn(item.seq).await.unwrap();
    let items = h.store.inbox().await.unwrap();
    h.ingress.recover(items);
    until("the give-up reply", || h.sent().len() == 1).await;
    let reply = &h.sent()[0];
    assert!(
        reply.contains("gave up") && reply.contains("2 times"),
        "{reply}"
    );
    assert!(h.model.requests.lock().unwrap().is_empty(), "not run again");
    let thread = h.thread(&item.thread_id).await;
    assert_eq!(
        thread.messages,
        [
            ChatMessage::user("crash me"),
            ChatMessage::assistant(reply.clone())
        ]
    );
    assert_eq!(thread.failed, [0..2]);
    until("the backlog is empty", || h.ingress.backlog() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_waits_for_its_original_and_names_it() {
    let h = harness(3);
    let first = h
        .ingress
        .accept(event("c", "m1", "hello"), false)
        .await
        .unwrap();
    let again = h
        .ingress
        .accept(event("c", "m1", "hello"), true)
        .await
        .unwrap();
    assert!(first.new && !again.new);
    assert_eq!(
        again.seq, first.seq,
        "the redelivery names the original's item"
    );
    assert!(again.events.is_some());
    until("one reply", || h.sent().len() == 1).await;
    assert_eq!(h.store.replies(first.seq.unwrap()).await.unwrap().len(), 1);
}

fn from(user: &str, event: InboundEvent) -> InboundEvent {
    let mut event = event;
    event.user.id = user.to_owned();
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_is_not_allowed_is_refused_once_and_nothing_runs() {
    let rules = AccessRules::new(&["alice".to_owned()], &[], &["root".to_owned()]);
    let h = harness_with(3, Access::new([("api".to_owned(), rules)]));
    // Bob writes in the shared conversation first: `/new` must not start a fresh thread.
    let refused = h
        .ingress
        .accept(from("bob", event("c", "m1", "/new")), false)
        .await
        .unwrap();
    assert!(refused.new);
    let again = h
        .ingress
        .accept(from("bob", event("c", "m2", "hello")), false)
        .await;
    assert!(matches!(again, Err(IngressError::Dropped)), "{again:?}");
    let alice = h
        .ingress
        .accept(from("alice", event("c", "m3", "hello")), false)
        .await
        .unwrap();
    assert_eq!(
        alice.thread_id, refused.thread_id,
        "bob's /new was not obeyed"
    );
    h.ingress
        .accept(from("root", event("c", "m4", "/status")), false)
        .await
        .unwrap();
    until("three replies", || h.sent().len() == 3).await;
    let sent = h.sent();
    assert_eq!(
        sent[0],
        "Sorry, you are not allowed to use this bot. Your user id is bob; an operator can add \
         it to channels.api.allowed_users."
    );
    assert_eq!(sent[1], "echo: hello");
    assert_eq!(
        h.model.requests.lock().unwrap().len(),
        1,
        "only alice's message reached the model"
    );
    let thread = h.thread(&alice.thread_id).await;
    let users: Vec<&ChatMessage> = thread
        .messages
        .iter()
        .filter(|m| matches!(m, ChatMessage::User { .. }))
        .collect();
    assert_eq!(
        users.len(),
        1,
        "bob's words are not in the thread: {users:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_runs_only_where_the_bot_was_addressed_before() {
    let rules = AccessRules::new(&["alice".to_owned()], &[], &[]);
    let h = harness_with(3, Access::new([("api".to_owned(), rules)]));
    let follow_up = |user: &str, conversation: &str, id: &str| {
        let mut event = from(user, event(conversation, id, "and then?"));
        event.follow_up = true;
        event
    };
    // A thread the bot never took part in: nothing is stored.
    let stray = h
        .ingress
        .accept(follow_up("alice", "t1", "m1"), false)
        .await;
    assert!(matches!(stray, Err(IngressError::Dropped)), "{stray:?}");
    assert!(h.store.conversation("api:t1").await.unwrap().is_none());

    h.ingress
        .accept(from("alice", event("t1", "m2", "hello")), false)
        .await
        .unwrap();
    until("the answer", || h.sent().len() == 1).await;
    let known = h
        .ingress
        .accept(follow_up("alice", "t1", "m3"), false)
        .await
        .unwrap();
    assert!(known.new, "a follow-up in the bot's thread is a turn");
    until("the follow-up answered", || h.sent().len() == 2).await;
    // Someone who may not use the bot, talking in that thread to others: no refusal.
    let other = h.ingress.accept(follow_up("bob", "t1", "m4"), false).await;
    assert!(matches!(other, Err(IngressError::Dropped)), "{other:?}");
    until("the backlog is empty", || h.ingress.backlog() == 0).await;
    assert_eq!(h.sent(), ["echo: hello", "echo: and then?"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_antler_cannot_read_is_answered_with_a_notice_and_nothing_runs() {
    let h = harness(3);
    let mut sticker = event("c", "m1", "");
    sticker.unsupported = Some("sticker".to_owned());
    let admitted = h.ingress.accept(sticker, false).await.unwrap();
    until("the notice", || h.sent().len() == 1).await;
    assert_eq!(
        h.sent()[0],
        "Sorry, I can't read sticker messages yet. Send me text, or the content as a file or \
         an image."
    );
    assert!(h.model.requests.lock().unwrap().is_empty(), "no model call");
    let thread = h.store.thread(&admitted.thread_id).await.unwrap();
    assert!(
        thread.is_none_or(|t| t.messages.is_empty()),
        "nothing entered the thread"
    );
}

/// A group upgraded to a supergroup: the new chat is allowed where the old one was, its
/// anonymous admin (who writes as the chat) is the old chat's admin, and the memory kept under
/// the old chat's id moves to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_chat_takes_its_place_in_the_allowlists_and_its_memory_along() {
    use crate::store::MemoryStore;
    let rules = AccessRules::new(&["g1".to_owned()], &["g1".to_owned()], &[]);
    let h = harness_with(3, Access::new([("api".to_owned(), rules)]));
    let in_group = |chat: &str, author: &str, id: &str| {
        let mut event = from(author, event(chat, id, "hello"));
        event.group = true;
        event.chat = Some(chat.to_owned());
        event
    };
    let mut doc = crate::agent::memory::MemoryDocument::default();
    doc.user.work_context.summary = "the SRE group".to_owned();
    h.store.put_memory("api:g1", &doc).await.unwrap();
    let before = h
        .ingress
        .accept(in_group("g2", "bob", "m1"), false)
        .await
        .unwrap();
    assert!(before.new);
    until("the refusal", || h.sent().len() == 1).await;
    assert!(
        h.sent()[0].starts_with("Sorry, you are not allowed"),
        "{:?}",
        h.sent()
    );

    let chat_move = ChatMove {
        from: antler_channel::ConversationKey::new("api", ["g1"]),
        from_chat: "g1".to_owned(),
        to: antler_channel::ConversationKey::new("api", ["g2"]),
        to_chat: "g2".to_owned(),
        by: "bob".to_owned(),
    };
    h.ingress.move_chat(&chat_move).await.unwrap();
    h.ingress.move_chat(&chat_move).await.unwrap();
    assert_eq!(h.store.memory("api:g2").await.unwrap(), Some(doc));
    assert_eq!(h.store.memory("api:g1").await.unwrap(), None);

    h.ingress
        .accept(in_group("g2", "carol", "m2"), false)
        .await
        .unwrap();
    h.ingress
        .accept(in_group("g2", "g2", "m3"), false)
        .await
        .unwrap();
    until("both answers", || h.sent().len() == 3).await;
    assert_eq!(h.sent()[1..], ["echo: hello", "echo: hello"]);
    // Elsewhere nothing changed.
    let other = h
        .ingress
        .accept(in_group("g3", "dave", "m4"), false)
        .await
        .unwrap();
    assert!(other.new);
    until("the refusal", || h.sent().len() == 4).await;
    assert!(h.sent()[3].starts_with("Sorry, you are not allowed"));
}

#[tokio::test]
async fn every_line_of_a_turn_names_its_conversation_channel_and_trace() {
    // A current-thread runtime: the turn's task logs on this thread, to this subscriber.
    let logs = crate::test_support::capture_logs(tracing::Level::DEBUG);

    let h = harness(3);
    let accepted = h
        .ingress
        .accept(event("ops", "m1", "fail"), false)
        .await
        .unwrap();
    until("the failure reply", || h.sent().len() == 1).await;
    let logged = || logs.text();
    // Waited for, not assumed: the lines need not be written by the time the reply is.
    until("the turn's lines", || {
        let text = logged();
        text.contains("turn failed") && text.contains("turn finished")
    })
    .await;
    let text = logged();
    let failed = text
        .lines()
        .find(|line| line.contains("turn failed"))
        .unwrap_or_else(|| panic!("no `turn failed` line in:\n{text}"));
    for field in [
        "conversation=api:ops".to_owned(),
        "channel=api".to_owned(),
        format!("thread={}", accepted.thread_id),
        "trace=".to_owned(),
    ] {
        assert!(failed.contains(&field), "{field} missing: {failed}");
    }
    // The turn's other lines carry the same span.
    let finished = text
        .lines()
        .find(|line| line.contains("turn finished"))
        .unwrap_or_else(|| panic!("no `turn finished` line in:\n{text}"));
    assert!(finished.contains("conversation=api:ops"), "{finished}");
}
