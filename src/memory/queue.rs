//! The memory queue's worker: a background task that feeds due updates to the updater.
//!
//! The queue itself is in the store (`memory_queue`): the turn runner writes an update with
//! the turn's end, one per (user, thread), the newest replacing an older one, each due
//! `debounce_seconds` after its run. The worker polls for due items every [`POLL_EVERY`],
//! reads them [`BATCH`] at a time (so a long queue is never loaded whole), and processes them
//! one by one (so one user's document is never written by two updates at once). The answer
//! is applied by compare and swap (`Store::update_memory`), so an edit made meanwhile
//! (`/memory forget`, the API) is kept. A processed item is removed only in the version it
//! processed: a newer conversation queued meanwhile stays for the next poll. Items survive a
//! restart because they are in sled; the worker started by the next process runs them.
//!
//! Failures: a failed or timed-out model call is retried after 1 s, 2 s, 4 s (four attempts
//! in all), an answer that is not valid JSON is asked for once more (by the updater); after
//! that the item is dropped with a logged reason. On shutdown every queued item, due or not,
//! is processed within `shutdown_flush_secs`; what is left then runs after the next start.
//!
//! Where it differs from DeerFlow: DeerFlow's queue is in memory (lost on a crash) with a
//! timer per key; here it is durable and polled, and the 0.5 s pause between items is left
//! out (items are already sequential).

use crate::store::MemoryQueueStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::updater::{self, ApplyRules, UpdaterError};
use crate::agent::memory::{MemoryConfig, MemoryUpdate};
use crate::agent::model::ChatModel;
use crate::retry::RetryPolicy;

/// How often the worker looks for due items.
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(1);
/// Items read from the store at once.
pub(crate) const BATCH: usize = 16;
/// Model calls per item at most, and the waits between them (from 1 s, doubling).
const UPDATER_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 4,
    backoff_base: Duration::from_secs(1),
    backoff_max: Duration::from_secs(8),
};

/// The worker's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerSettings {
    pub(crate) rules: ApplyRules,
    pub(crate) flush: Duration,
    pub(crate) poll: Duration,
}

impl WorkerSettings {
    /// From `[memory]`.
    pub(crate) fn from_config(config: &MemoryConfig) -> Self {
        Self {
            rules: ApplyRules {
                max_facts: config.max_facts,
                fact_confidence_threshold: config.fact_confidence_threshold,
            },
            flush: Duration::from_secs(config.shutdown_flush_secs),
            poll: POLL_EVERY,
        }
    }
}

/// What became of one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Applied; the item left the queue in the same transaction.
    Processed,
    /// Not applied: a newer context replaced the item, or the user was forgotten meanwhile.
    Superseded,
    /// Given up on (the updater kept failing); the item is removed.
    Dropped,
    /// The store failed: the item stays queued for a later poll.
    Kept,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Superseded => "superseded",
            Self::Dropped => "dropped",
            Self::Kept => "failed",
        }
    }
}

/// The queue worker.
#[derive(Clone)]
pub(crate) struct MemoryWorker {
    store: Arc<dyn MemoryQueueStore>,
    model: Arc<dyn ChatModel>,
    settings: WorkerSettings,
}

impl MemoryWorker {
    pub(crate) fn new(
        store: Arc<dyn MemoryQueueStore>,
        model: Arc<dyn ChatModel>,
        settings: WorkerSettings,
    ) -> Self {
        Self {
            store,
            model,
            settings,
        }
    }

    /// Runs until `stop`, then flushes the queue within the flush time.
    pub(crate) async fn run(self, stop: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = tokio::time::sleep(self.settings.poll) => {}
            }
            self.drain(crate::now_ms(), Some(&stop)).await;
        }
        let flush = self.settings.flush;
        if tokio::time::timeout(flush, self.drain(u64::MAX, None))
            .await
            .is_err()
        {
            tracing::warn!(
                flush_secs = flush.as_secs(),
                "memory updates still queued at shutdown; they run after the next start"
            );
        }
    }

    /// Processes items due at `now_ms` until none is left (or `stop`, between items).
    async fn drain(&self, now_ms: u64, stop: Option<&CancellationToken>) {
        loop {
            let due = match self.store.due_memory_updates(now_ms, BATCH).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the memory queue");
                    return;
                }
            };
            if due.is_empty() {
                return;
            }
            let mut progressed = false;
            for item in due {
                if stop.is_some_and(CancellationToken::is_cancelled) {
                    return;
                }
                progressed |= self.process(&item).await != Outcome::Kept;
            }
            if !progressed {
                // The store keeps failing: leave the rest to the next poll.
                return;
            }
        }
    }

    /// Runs the updater for `item`, stores the new document and removes the item.
    async fn process(&self, item: &MemoryUpdate) -> Outcome {
        let outcome = self.update(item).await;
        let outcome = match outcome {
            done @ (Outcome::Kept | Outcome::Processed | Outcome::Superseded) => done,
            Outcome::Dropped => match self.store.remove_memory_update(item).await {
                Ok(_) => Outcome::Dropped,
                Err(e) => {
                    tracing::warn!(thread = %item.thread_id, error = %e, "cannot remove a dropped memory update");
                    Outcome::Kept
                }
            },
        };
        metrics::counter!("antler_memory_updates_total", "outcome" => outcome.as_str())
            .increment(1);
        outcome
    }

    async fn update(&self, item: &MemoryUpdate) -> Outcome {
        let memory = match self.store.memory(&item.user_id).await {
            Ok(doc) => doc.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a memory document");
                return Outcome::Kept;
            }
        };
        for attempt in 1..=UPDATER_RETRY.max_attempts {
            let started = Instant::now();
            let result = updater::run(self.model.as_ref(), &memory, item).await;
            metrics::histogram!("antler_memory_updater_seconds")
                .record(started.elapsed().as_secs_f64());
            match result {
                Ok((answer, usage)) => {
                    metrics::histogram!("antler_memory_updater_tokens")
                        .record(usage.total_tokens as f64);
                    // Applied to the document as it is now, in one transaction with the
                    // item's removal: a fact forgotten (`/memory forget`, the API) while the
                    // model was answering stays forgotten, and a user forgotten meanwhile
                    // (`/memory clear`, whose transaction dropped this item) gets nothing back.
                    let rules = self.settings.rules;
                    let now = OffsetDateTime::now_utc();
                    // The change may run again on a newer document; the gate's verdict is
                    // the same each time, so the last one is the one to count.
                    let mut dropped = Vec::new();
                    let stored = self
                        .store
                        .apply_memory_update(item, &mut |doc| {
                            let mut doc = doc.unwrap_or_default();
                            dropped = updater::apply(
                                &mut doc,
                                answer.clone(),
                                &item.thread_id,
                                rules,
                                now,
                            );
                            doc
                        })
                        .await;
                    return match stored {
                        Ok(Some(doc)) => {
                            for reason in &dropped {
                                metrics::counter!(
                                    "antler_memory_facts_dropped_total",
                                    "reason" => reason.as_str()
                                )
                                .increment(1);
                                tracing::debug!(thread = %item.thread_id, reason = reason.as_str(), "memory fact dropped by the write gate");
                            }
                            let facts = doc.facts.len();
                            tracing::debug!(thread = %item.thread_id, facts, tokens = usage.total_tokens, "memory updated");
                            Outcome::Processed
                        }
                        Ok(None) => {
                            tracing::debug!(thread = %item.thread_id, "memory update superseded or cleared meanwhile; not applied");
                            Outcome::Superseded
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot store a memory document");
                            Outcome::Kept
                        }
                    };
                }
                Err(e @ UpdaterError::InvalidJson(_)) => {
                    tracing::warn!(thread = %item.thread_id, error = %e, "memory update dropped: the updater answered no valid JSON twice");
                    return Outcome::Dropped;
                }
                Err(e) if attempt == UPDATER_RETRY.max_attempts => {
                    tracing::warn!(thread = %item.thread_id, error = %e, attempts = attempt, "memory update dropped: the updater kept failing");
                    return Outcome::Dropped;
                }
                Err(e) => {
                    tracing::debug!(thread = %item.thread_id, error = %e, attempt, "memory updater failed; retrying");
                    tokio::time::sleep(UPDATER_RETRY.backoff(attempt)).await;
                }
            }
        }
        Outcome::Dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::message::ChatMessage;
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::model::{ModelError, ModelResponse};
    use crate::store::{MemStore, Store};

    const FACT: &str = r#"{"newFacts":[{"content":"likes tea","category":"preference","confidence":0.9,
        "scope":"user","durability":"durable","authority":"descriptive"}]}"#;

    fn settings() -> WorkerSettings {
        WorkerSettings::from_config(&MemoryConfig::default())
    }

    fn update(user: &str, thread: &str, text: &str, at: u64, due: u64) -> MemoryUpdate {
        MemoryUpdate {
            user_id: user.to_owned(),
            thread_id: thread.to_owned(),
            messages: vec![ChatMessage::user(text), ChatMessage::assistant("Noted.")],
            seen: 0,
            from: 0,
            enqueued_at_ms: at,
            due_at_ms: due,
        }
    }

    fn worker_for(
        store: &Arc<dyn Store>,
        script: Vec<Result<ModelResponse, ModelError>>,
    ) -> (MemoryWorker, Arc<ScriptedModel>) {
        let model = Arc::new(ScriptedModel::new(script));
        let as_model: Arc<dyn ChatModel> = model.clone();
        (
            MemoryWorker::new(store.clone(), as_model, settings()),
            model,
        )
    }

    fn failure() -> Result<ModelResponse, ModelError> {
        Err(ModelError::InvalidResponse("boom".to_owned()))
    }

    #[tokio::test]
    async fn two_runs_within_the_window_make_one_call_with_the_newest_context() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        store
            .queue_memory_update(update("api:ada", "t1", "I like coffee", 1_000, 31_000))
            .await
            .unwrap();
        store
            .queue_memory_update(update(
                "api:ada",
                "t1",
                "Actually I like tea",
                2_000,
                32_000,
            ))
            .await
            .unwrap();
        let (worker, model) = worker_for(&store, vec![ScriptedModel::text(FACT)]);
        worker.drain(31_500, None).await;
        assert!(model.requests().is_empty(), "the window has not ended");
        worker.drain(32_000, None).await;
        let requests = model.requests();
        assert_eq!(requests.len(), 1);
        let prompt = requests[0].messages[1].text();
        assert!(prompt.contains("Actually I like tea") && !prompt.contains("coffee"));
        let doc = store.memory("api:ada").await.unwrap().unwrap();
        assert_eq!(doc.facts[0].content, "likes tea");
        assert_eq!(doc.facts[0].source.thread_id, "t1");
        assert!(
            store
                .due_memory_updates(u64::MAX, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_pending_update_survives_a_restart_and_runs_after_it() {
        let before = MemStore::new();
        before
            .queue_memory_update(update("api:ada", "t1", "I like tea", 1, 1))
            .await
            .unwrap();
        let store: Arc<dyn Store> = Arc::new(before.reopen());
        let (worker, model) = worker_for(&store, vec![ScriptedModel::text(FACT)]);
        let stop = CancellationToken::new();
        let task = tokio::spawn(worker.run(stop.clone()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.memory("api:ada").await.unwrap().is_none() {
            assert!(Instant::now() < deadline, "the pending update never ran");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        task.await.unwrap();
        assert_eq!(model.requests().len(), 1);
        assert!(
            store
                .due_memory_updates(u64::MAX, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_updater_is_retried_then_the_item_is_dropped() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        store
            .queue_memory_update(update("api:ada", "t1", "hi", 1, 1))
            .await
            .unwrap();
        let (worker, model) = worker_for(&store, vec![failure(), failure(), failure(), failure()]);
        worker.drain(10, None).await;
        assert_eq!(model.requests().len(), UPDATER_RETRY.max_attempts as usize);
        assert!(
            store
                .due_memory_updates(u64::MAX, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(store.memory("api:ada").await.unwrap().is_none());

        // A call that fails once and then answers is learned.
        store
            .queue_memory_update(update("api:ada", "t2", "hi", 2, 2))
            .await
            .unwrap();
        let (worker, model) = worker_for(&store, vec![failure(), ScriptedModel::text(FACT)]);
        worker.drain(10, None).await;
        assert_eq!(model.requests().len(), 2);
        assert!(store.memory("api:ada").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn invalid_json_is_asked_for_once_more_then_dropped() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        store
            .queue_memory_update(update("api:ada", "t1", "hi", 1, 1))
            .await
            .unwrap();
        let (worker, model) = worker_for(
            &store,
            vec![
                ScriptedModel::text("sure!"),
                ScriptedModel::text("not json either"),
                ScriptedModel::text(FACT),
            ],
        );
        worker.drain(10, None).await;
        assert_eq!(model.requests().len(), 2);
        assert!(
            store
                .due_memory_updates(u64::MAX, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(store.memory("api:ada").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn shutdown_flushes_items_that_are_not_due_yet() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let far = crate::now_ms() + 3_600_000;
        store
            .queue_memory_update(update("api:ada", "t1", "I like tea", 1, far))
            .await
            .unwrap();
        store
            .queue_memory_update(update("api:bob", "t1", "I like maps", 2, far))
            .await
            .unwrap();
        let (worker, model) = worker_for(
            &store,
            vec![ScriptedModel::text(FACT), ScriptedModel::text(FACT)],
        );
        let stop = CancellationToken::new();
        stop.cancel();
        worker.run(stop).await;
        assert_eq!(model.requests().len(), 2);
        assert!(
            store
                .due_memory_updates(u64::MAX, 10)
                .await
                .unwrap()
                .is_empty()
        );
        // Each user's update went to their own document only.
        let ada = model.requests()[0].messages[1].text().to_owned();
        assert!(ada.contains("I like tea") && !ada.contains("maps"));
        assert!(store.memory("api:bob").await.unwrap().is_some());
    }
}
