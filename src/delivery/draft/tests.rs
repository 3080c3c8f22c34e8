use crate::store::{Accept, Accepted, InboxStore, MemStore, ThreadChoice};
use antler_channel::EditRate;

use super::*;
use crate::test_support::{RecordingChannel, event};

const RATE: EditRate = EditRate {
    private: Duration::from_secs(1),
    group: Duration::from_secs(3),
};

fn live_channel() -> Arc<RecordingChannel> {
    Arc::new(RecordingChannel {
        edit_rate: Some(RATE),
        ..RecordingChannel::default()
    })
}

async fn accepted(store: &MemStore, group: bool) -> InboxItem {
    let mut event = event("c1", "m1", "hi");
    event.group = group;
    let accepted = store
        .accept(Accept {
            dedupe_ttl_ms: 60_000,
            trace: crate::telemetry::TraceContext::fresh(),
            event,
            thread: ThreadChoice::Current,
            now_ms: 1,
        })
        .await
        .unwrap();
    match accepted {
        Accepted::New(item) => item,
        other => panic!("not new: {other:?}"),
    }
}

/// Lets the writer task run until it waits again (time is paused: nothing else moves it).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Waits, without letting paused time move, until the draft's id is in the store. Saving
/// happens on another task: a test sleeping meanwhile would let tokio jump its paused clock
/// ahead.
async fn saved(store: &MemStore) -> Receipt {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(draft) = store.inbox().await.unwrap().remove(0).draft {
            settle().await;
            return draft;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the draft was never saved"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_quick_answer_gets_no_draft() {
    let store = Arc::new(MemStore::new());
    let item = accepted(&store, false).await;
    let channel = live_channel();
    let draft = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    draft.delta("the whole answer");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(draft.finish().await, None);
    assert!(channel.sent().is_empty() && channel.edits().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_slow_answer_is_drafted_saved_at_once_and_edited_at_the_channels_pace() {
    let store = Arc::new(MemStore::new());
    let item = accepted(&store, false).await;
    let channel = live_channel();
    let draft = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    draft.delta("one");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert_eq!(
        channel.sent(),
        ["one"],
        "the draft appears after one interval"
    );
    assert_eq!(
        saved(&store).await.platform_message_id,
        "pm-one",
        "its id is stored as soon as it exists"
    );
    // Three deltas within the next second make one edit, with all of them.
    draft.delta(" two");
    settle().await;
    draft.delta(" three");
    draft.delta(" four");
    tokio::time::sleep(Duration::from_millis(500)).await;
    settle().await;
    assert!(channel.edits().is_empty(), "not before the interval");
    tokio::time::sleep(Duration::from_millis(501)).await;
    settle().await;
    assert_eq!(
        channel.edits(),
        [("pm-one".to_owned(), "one two three four".to_owned())]
    );
    draft.delta(" five");
    let receipt = draft.finish().await;
    assert_eq!(receipt.unwrap().platform_message_id, "pm-one");
    assert_eq!(channel.edits().len(), 1, "nothing is written after the end");
    assert_eq!(channel.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn groups_are_edited_less_often() {
    let store = Arc::new(MemStore::new());
    let item = accepted(&store, true).await;
    let channel = live_channel();
    let draft = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    draft.delta("one");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    settle().await;
    assert!(channel.sent().is_empty());
    tokio::time::sleep(Duration::from_millis(501)).await;
    settle().await;
    assert_eq!(channel.sent(), ["one"]);
    saved(&store).await;
    draft.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_rerun_writes_into_the_draft_its_crashed_run_left() {
    let store = Arc::new(MemStore::new());
    let mut item = accepted(&store, false).await;
    item.draft = Some(Receipt {
        platform_message_id: "old".to_owned(),
    });
    let channel = live_channel();
    let draft = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    draft.delta("again");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert!(channel.sent().is_empty(), "no second draft");
    assert_eq!(channel.edits(), [("old".to_owned(), "again".to_owned())]);
    // Even without a single edit, the old draft is handed on for the answer to replace.
    let quiet = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    assert_eq!(quiet.finish().await.unwrap().platform_message_id, "old");
    draft.finish().await;
}

#[tokio::test(start_paused = true)]
async fn rate_limits_are_waited_out_and_permanent_failures_end_the_preview() {
    let store = Arc::new(MemStore::new());
    let item = accepted(&store, false).await;
    let channel = live_channel();
    *channel.failures.lock().unwrap() = vec![ChannelError::RateLimited {
        retry_after: Duration::from_secs(5),
    }];
    let draft = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    draft.delta("one");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert!(channel.sent().is_empty(), "rate limited");
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    settle().await;
    assert!(channel.sent().is_empty(), "still waiting out retry_after");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert_eq!(channel.sent(), ["one"], "sent once the wait is over");
    saved(&store).await;

    *channel.failures.lock().unwrap() = vec![ChannelError::Permanent("gone".into())];
    draft.delta(" two");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    draft.delta(" three");
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    settle().await;
    assert!(
        channel.edits().is_empty(),
        "no more edits after a permanent failure"
    );
    assert!(draft.task.is_finished(), "the writer stopped");
    assert_eq!(draft.finish().await.unwrap().platform_message_id, "pm-one");
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_shows_what_runs_and_the_next_text_starts_afresh() {
    let store = Arc::new(MemStore::new());
    let item = accepted(&store, false).await;
    let channel = live_channel();
    let draft = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    draft.delta("Let me look.");
    draft.tool_started("web_search");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert_eq!(channel.sent(), ["⏳ _web_search_ …"]);
    saved(&store).await;
    draft.delta("Found it.");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert_eq!(channel.edits()[0].1, "Found it.");
    draft.finish().await;
}

#[tokio::test(start_paused = true)]
async fn progress_lines_are_edited_in_place_one_per_call() {
    let store = Arc::new(MemStore::new());
    let item = accepted(&store, false).await;
    let channel = live_channel();
    let draft = Draft::start(store.clone(), channel.clone(), &item).unwrap();
    draft.tool_started("task");
    draft.note("c1", "⏳ read the logs");
    draft.note("c2", "⏳ run the tests\nsecond line dropped");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert_eq!(channel.sent(), ["⏳ read the logs\n⏳ run the tests"]);
    saved(&store).await;
    draft.note("c1", "✅ read the logs · 3 s");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    settle().await;
    assert_eq!(
        channel.edits()[0].1,
        "✅ read the logs · 3 s\n⏳ run the tests"
    );
    for call in 0..20 {
        draft.note(&format!("n{call}"), &"x".repeat(500));
    }
    let preview = draft.shared.preview.lock().unwrap().markdown().unwrap();
    assert_eq!(preview.lines().count(), MAX_NOTE_LINES);
    assert!(
        preview
            .lines()
            .all(|line| line.chars().count() == MAX_NOTE_CHARS)
    );
    draft.finish().await;
}

#[tokio::test]
async fn the_kept_text_is_capped_on_a_character_boundary() {
    let shared = Arc::new(Shared::default());
    let draft = Draft {
        shared: Arc::clone(&shared),
        stop: CancellationToken::new(),
        task: tokio::spawn(async { None }),
    };
    let big = "é".repeat(KEPT_BYTES);
    draft.delta(&big);
    draft.delta("more");
    let kept = shared.preview.lock().unwrap().text.len();
    assert!(kept <= KEPT_BYTES && kept > KEPT_BYTES - 2, "{kept}");
}
