use crate::store::{FinishTurn, InboxStore, MemStore, OutboxStatus, OutboxStore};
use std::time::Duration;

use antler_channel::{ConversationKey, OutboundMessage, Receipt};

use super::*;
use crate::test_support::RecordingChannel;

async fn outbox(store: &MemStore, texts: &[&str]) -> Vec<OutboxItem> {
    outbox_with_draft(store, 0, texts, None).await
}

/// The replies of inbox item `inbox_seq`, whose turn wrote the draft `draft`.
async fn outbox_with_draft(
    store: &MemStore,
    inbox_seq: u64,
    texts: &[&str],
    draft: Option<&str>,
) -> Vec<OutboxItem> {
    let replies = texts
        .iter()
        .map(|text| OutboundMessage {
            prompts: Vec::new(),
            idempotency_key: (*text).to_owned(),
            conversation: ConversationKey::new("api", ["c1"]),
            thread_id: "t1".to_owned(),
            text: (*text).to_owned(),
            reply_to: None,
            files: Vec::new(),
            reply_context: None,
        })
        .collect();
    store
        .finish_turn(FinishTurn {
            inbox_seq,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies,
            memory_update: None,
            draft: draft.map(|id| Receipt {
                platform_message_id: id.to_owned(),
            }),
            now_ms: 1,
            absorbed: Vec::new(),
        })
        .await
        .unwrap()
}

fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_secs(5),
    }
}

/// Reply files under `data_root` (thread `t1`'s outputs are `<data_root>/threads/t1/outputs`).
fn reply_files(data_root: &std::path::Path) -> ReplyFiles {
    ReplyFiles {
        data_root: data_root.to_path_buf(),
        max_bytes: 1024,
    }
}

async fn run(
    channel: Arc<RecordingChannel>,
    store: Arc<MemStore>,
    items: Vec<OutboxItem>,
    max: u32,
) {
    let no_files = tempfile::tempdir().unwrap();
    run_with_files(channel, store, items, max, &reply_files(no_files.path())).await;
}

async fn run_with_files(
    channel: Arc<RecordingChannel>,
    store: Arc<MemStore>,
    items: Vec<OutboxItem>,
    max: u32,
    files: &ReplyFiles,
) {
    let tracker = TaskTracker::new();
    let channels = HashMap::from([("api".to_owned(), channel as Arc<dyn Channel>)]);
    let delivery = Delivery::new(
        store,
        channels,
        policy(max),
        files.clone(),
        crate::health::ChannelHealth::default(),
        tracker.clone(),
        CancellationToken::new(),
    );
    delivery.enqueue(items);
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(start_paused = true)]
async fn transient_failures_and_rate_limits_are_retried_in_order_with_receipts() {
    let store = Arc::new(MemStore::new());
    let items = outbox(&store, &["one", "two"]).await;
    let channel = Arc::new(RecordingChannel::default());
    *channel.failures.lock().unwrap() = vec![
        ChannelError::Transient("502".into()),
        ChannelError::RateLimited {
            retry_after: Duration::from_secs(3),
        },
    ];
    let before = tokio::time::Instant::now();
    run(Arc::clone(&channel), Arc::clone(&store), items.clone(), 5).await;
    assert!(
        before.elapsed() >= Duration::from_secs(3),
        "retry_after honoured"
    );
    assert_eq!(*channel.sent.lock().unwrap(), ["one", "two"]);
    let first = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!((first.status, first.attempts), (OutboxStatus::Sent, 3));
    assert_eq!(first.receipt.unwrap().platform_message_id, "pm-one");
    assert!(store.outbox_pending().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn permanent_failures_and_exhausted_retries_give_up_without_blocking_the_lane() {
    let store = Arc::new(MemStore::new());
    let items = outbox(&store, &["bad", "flaky", "fine"]).await;
    let channel = Arc::new(RecordingChannel::default());
    *channel.failures.lock().unwrap() = vec![
        ChannelError::Permanent("chat not found".into()),
        ChannelError::Transient("503".into()),
        ChannelError::Transient("503".into()),
    ];
    run(Arc::clone(&channel), Arc::clone(&store), items.clone(), 2).await;
    let bad = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!((bad.status, bad.attempts), (OutboxStatus::Failed, 1));
    assert_eq!(
        bad.last_error.as_deref(),
        Some("permanent failure: chat not found")
    );
    let flaky = store.outbox_item(items[1].seq).await.unwrap().unwrap();
    assert_eq!((flaky.status, flaky.attempts), (OutboxStatus::Failed, 2));
    assert_eq!(*channel.sent.lock().unwrap(), ["fine"]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_goes_on_from_the_first_part_not_sent() {
    let store = Arc::new(MemStore::new());
    let items = outbox(&store, &["one|two|three"]).await;
    let channel = Arc::new(RecordingChannel {
        separator: Some("|"),
        ..RecordingChannel::default()
    });
    // "one" went (and was recorded) before "two" failed, as in a failed attempt or a crash.
    let seq = items[0].seq;
    let first = channel
        .send(
            &items[0].message,
            Part {
                buttons: &[],
                index: 0,
                body: "one",
            },
        )
        .await
        .unwrap();
    store.part_delivered(seq, first, false, 2).await.unwrap();
    *channel.failures.lock().unwrap() = vec![
        ChannelError::Transient("502".into()),
        ChannelError::RateLimited {
            retry_after: Duration::from_secs(1),
        },
    ];
    let resumed = store.outbox_item(seq).await.unwrap().unwrap();
    run(Arc::clone(&channel), Arc::clone(&store), vec![resumed], 5).await;
    assert_eq!(channel.sent(), ["one", "two", "three"], "each part once");
    let done = store.outbox_item(seq).await.unwrap().unwrap();
    assert_eq!(done.status, OutboxStatus::Sent);
    let ids: Vec<&str> = done
        .parts
        .iter()
        .map(|r| r.platform_message_id.as_str())
        .collect();
    assert_eq!(ids, ["pm-one", "pm-two", "pm-three"]);
    assert_eq!(done.receipt.unwrap().platform_message_id, "pm-one");
}

#[tokio::test(start_paused = true)]
async fn prompts_follow_the_reply_each_its_own_message_with_buttons_where_they_show() {
    let prompt = |id: &str| antler_channel::Prompt {
        text: format!("approve {id}?|really?"),
        buttons: vec![antler_channel::Button {
            label: "Approve".into(),
            action: format!("approve:{id}"),
            style: antler_channel::ButtonStyle::Primary,
        }],
    };
    for shows_buttons in [true, false] {
        let store = Arc::new(MemStore::new());
        let mut items = outbox(&store, &["one|two"]).await;
        items[0].message.prompts = vec![prompt("a"), prompt("b")];
        let channel = Arc::new(RecordingChannel {
            separator: Some("|"),
            shows_buttons,
            ..RecordingChannel::default()
        });
        run(Arc::clone(&channel), Arc::clone(&store), items.clone(), 5).await;
        let expected: &[&str] = if shows_buttons {
            &[
                "one",
                "two",
                "approve a?",
                "really? [approve:a]",
                "approve b?",
                "really? [approve:b]",
            ]
        } else {
            &[
                "one",
                "two",
                "approve a?",
                "really?",
                "approve b?",
                "really?",
            ]
        };
        assert_eq!(channel.sent(), expected);
        let done = store.outbox_item(items[0].seq).await.unwrap().unwrap();
        assert_eq!(done.status, OutboxStatus::Sent);
        assert_eq!(done.parts.len(), 6);
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_part_replaces_the_draft_and_the_rest_are_new_messages() {
    let store = Arc::new(MemStore::new());
    let items = outbox_with_draft(&store, 1, &["one|two"], Some("draft-1")).await;
    assert_eq!(
        items[0].draft.as_ref().unwrap().platform_message_id,
        "draft-1"
    );
    let channel = Arc::new(RecordingChannel {
        separator: Some("|"),
        ..RecordingChannel::default()
    });
    run(Arc::clone(&channel), Arc::clone(&store), items.clone(), 5).await;
    assert_eq!(channel.edits(), [("draft-1".to_owned(), "one".to_owned())]);
    assert_eq!(channel.sent(), ["two"]);
    let done = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!(done.receipt.unwrap().platform_message_id, "draft-1");

    // A draft that cannot be edited any more (deleted) gives way to a new message.
    let items = outbox_with_draft(&store, 2, &["three"], Some("draft-2")).await;
    let gone = Arc::new(RecordingChannel::default());
    *gone.failures.lock().unwrap() =
        vec![ChannelError::Permanent("message to edit not found".into())];
    run(Arc::clone(&gone), Arc::clone(&store), items.clone(), 5).await;
    assert_eq!(gone.sent(), ["three"]);
    assert!(gone.edits().is_empty());
    let done = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!(done.status, OutboxStatus::Sent);
}

fn file(name: &str, size: u64) -> antler_channel::OutboundFile {
    antler_channel::OutboundFile {
        name: name.to_owned(),
        media_type: "text/plain".to_owned(),
        size,
    }
}

/// A store folder whose thread `t1` has `files` (name, bytes) in its outputs.
fn outputs_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let outputs = dir.path().join("threads/t1/outputs");
    std::fs::create_dir_all(&outputs).unwrap();
    for (name, bytes) in files {
        std::fs::write(outputs.join(name), bytes).unwrap();
    }
    dir
}

/// One reply with `files`, finished as inbox item `inbox_seq`.
async fn outbox_with_files(
    store: &MemStore,
    inbox_seq: u64,
    text: &str,
    files: Vec<antler_channel::OutboundFile>,
) -> Vec<OutboxItem> {
    store
        .finish_turn(FinishTurn {
            inbox_seq,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: vec![OutboundMessage {
                prompts: Vec::new(),
                idempotency_key: format!("k{inbox_seq}"),
                conversation: ConversationKey::new("api", ["c1"]),
                thread_id: "t1".to_owned(),
                text: text.to_owned(),
                reply_to: None,
                files,
                reply_context: None,
            }],
            memory_update: None,
            draft: None,
            now_ms: 1,
            absorbed: Vec::new(),
        })
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_channel_that_cannot_send_files_gets_their_names_in_the_text() {
    let store = Arc::new(MemStore::new());
    let items = outbox_with_files(
        &store,
        1,
        "Here is the report.\n",
        vec![file("report.csv", 12 * 1024), file("charts/cpu.png", 1)],
    )
    .await;
    let channel = Arc::new(RecordingChannel::default());
    run(Arc::clone(&channel), Arc::clone(&store), items.clone(), 5).await;
    assert_eq!(
        channel.sent(),
        ["Here is the report.\n\n📎 report.csv (12 KB)\n📎 cpu.png (1 byte)"]
    );
    let done = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!(done.status, OutboxStatus::Sent);
}

#[tokio::test(start_paused = true)]
async fn files_follow_the_text_each_once_and_a_lost_file_is_skipped() {
    let store = Arc::new(MemStore::new());
    let items = outbox_with_files(
        &store,
        1,
        "one|two",
        vec![file("a.txt", 1), file("gone.txt", 1), file("c.txt", 1)],
    )
    .await;
    let data = outputs_with(&[("a.txt", "a"), ("gone.txt", "g"), ("c.txt", "c")]);
    let channel = Arc::new(RecordingChannel {
        separator: Some("|"),
        sends_files: true,
        ..RecordingChannel::default()
    });
    // "one", "two" and a.txt go; a 502 on gone.txt is retried and then the file is
    // found gone for good: skipped, and c.txt still goes.
    let seq = items[0].seq;
    for (index, body) in ["one", "two"].into_iter().enumerate() {
        let receipt = channel
            .send(
                &items[0].message,
                Part {
                    index,
                    body,
                    buttons: &[],
                },
            )
            .await
            .unwrap();
        store.part_delivered(seq, receipt, false, 2).await.unwrap();
    }
    let content = reply_files(data.path())
        .open("t1", &items[0].message.files[0])
        .await
        .unwrap();
    let receipt = channel
        .send_file(&items[0].message, &items[0].message.files[0], content)
        .await
        .unwrap();
    store.part_delivered(seq, receipt, false, 2).await.unwrap();
    *channel.failures.lock().unwrap() = vec![
        ChannelError::Transient("502".into()),
        ChannelError::Permanent("no such file".into()),
    ];
    let resumed = store.outbox_item(seq).await.unwrap().unwrap();
    run_with_files(
        Arc::clone(&channel),
        Arc::clone(&store),
        vec![resumed],
        5,
        &reply_files(data.path()),
    )
    .await;
    assert_eq!(
        channel.sent(),
        ["one", "two", "file:a.txt=a", "file:c.txt=c"]
    );
    let done = store.outbox_item(seq).await.unwrap().unwrap();
    assert_eq!(done.status, OutboxStatus::Sent);
    let ids: Vec<&str> = done
        .parts
        .iter()
        .map(|r| r.platform_message_id.as_str())
        .collect();
    assert_eq!(
        ids,
        ["pm-one", "pm-two", "pm-file-a.txt", "", "pm-file-c.txt"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_file_swapped_for_a_link_or_a_hard_link_is_not_sent_and_a_note_says_so() {
    let store = Arc::new(MemStore::new());
    let items = outbox_with_files(
        &store,
        1,
        "Here.",
        vec![
            file("report.txt", 2),
            file("hard.txt", 2),
            file("big.txt", 2),
            file("ok.txt", 2),
        ],
    )
    .await;
    let data = outputs_with(&[("ok.txt", "ok"), ("big.txt", &"x".repeat(2000))]);
    let secret = data.path().join("antler.toml");
    std::fs::write(&secret, "token = \"SECRET\"").unwrap();
    let outputs = data.path().join("threads/t1/outputs");
    // Presented as regular files, then swapped by the sandbox before delivery.
    std::os::unix::fs::symlink(&secret, outputs.join("report.txt")).unwrap();
    std::fs::hard_link(&secret, outputs.join("hard.txt")).unwrap();
    let channel = Arc::new(RecordingChannel {
        sends_files: true,
        ..RecordingChannel::default()
    });
    run_with_files(
        Arc::clone(&channel),
        Arc::clone(&store),
        items.clone(),
        5,
        &reply_files(data.path()),
    )
    .await;
    let sent = channel.sent();
    assert_eq!(sent.len(), 5, "{sent:?}");
    assert_eq!(sent[0], "Here.");
    assert!(
        sent[1].contains("report.txt was not sent") && sent[1].contains("symbolic link"),
        "{sent:?}"
    );
    assert!(
        sent[2].contains("hard.txt was not sent") && sent[2].contains("hard link"),
        "{sent:?}"
    );
    assert!(
        sent[3].contains("big.txt was not sent") && sent[3].contains("more than the 1024"),
        "{sent:?}"
    );
    assert_eq!(sent[4], "file:ok.txt=ok");
    assert!(!sent.iter().any(|s| s.contains("SECRET")), "{sent:?}");
    let done = store.outbox_item(items[0].seq).await.unwrap().unwrap();
    assert_eq!(done.status, OutboxStatus::Sent);
}

#[test]
fn backoff_grows_exponentially_within_the_cap() {
    let policy = policy(10);
    for attempt in 1..10 {
        let wait = policy.backoff(attempt);
        let ceiling = Duration::from_millis(100 * (1 << (attempt - 1))).min(Duration::from_secs(5));
        assert!(
            wait >= ceiling / 2 && wait <= ceiling,
            "attempt {attempt}: {wait:?}"
        );
    }
}

#[tokio::test]
async fn channels_are_found_by_name() {
    let store = Arc::new(MemStore::new());
    let channel: Arc<dyn Channel> = Arc::new(RecordingChannel::default());
    let delivery = Delivery::new(
        store,
        HashMap::from([("api".to_owned(), channel)]),
        policy(1),
        reply_files(std::path::Path::new("/nonexistent")),
        crate::health::ChannelHealth::default(),
        TaskTracker::new(),
        CancellationToken::new(),
    );
    assert_eq!(delivery.channel("api").map(|c| c.name()), Some("api"));
    assert!(delivery.channel("telegram").is_none());
}
