use antler_channel::{ConversationKey, OutboundMessage};

use super::*;
use crate::store::{FinishTurn, OutboxStatus, SledStore};
use crate::test_support::RecordingChannel;

async fn outbox(store: &SledStore, texts: &[&str]) -> Vec<OutboxItem> {
    let replies = texts
        .iter()
        .map(|text| OutboundMessage {
            idempotency_key: (*text).to_owned(),
            conversation: ConversationKey::new("api", ["c1"]),
            thread_id: "t1".to_owned(),
            text: (*text).to_owned(),
            reply_to: None,
        })
        .collect();
    store
        .finish_turn(FinishTurn {
            inbox_seq: 0,
            thread: None,
            replies,
            memory_update: None,
            now_ms: 1,
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

async fn run(
    channel: Arc<RecordingChannel>,
    store: Arc<SledStore>,
    items: Vec<OutboxItem>,
    max: u32,
) {
    let tracker = TaskTracker::new();
    let channels = HashMap::from([("api".to_owned(), channel as Arc<dyn Channel>)]);
    let delivery = Delivery::new(
        store,
        channels,
        policy(max),
        tracker.clone(),
        CancellationToken::new(),
    );
    delivery.enqueue(items);
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(start_paused = true)]
async fn transient_failures_and_rate_limits_are_retried_in_order_with_receipts() {
    let store = Arc::new(SledStore::temporary().unwrap());
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
    let store = Arc::new(SledStore::temporary().unwrap());
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
    let store = Arc::new(SledStore::temporary().unwrap());
    let channel: Arc<dyn Channel> = Arc::new(RecordingChannel::default());
    let delivery = Delivery::new(
        store,
        HashMap::from([("api".to_owned(), channel)]),
        policy(1),
        TaskTracker::new(),
        CancellationToken::new(),
    );
    assert_eq!(delivery.channel("api").map(|c| c.name()), Some("api"));
    assert!(delivery.channel("telegram").is_none());
}
