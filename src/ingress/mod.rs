//! Ingress: dedupe → inbox → queue → durable → ack, then the dispatcher.
//!
//! [`Ingress::accept`] answers only after the event is durably in the inbox (or recognised as a
//! redelivery), so an acknowledged message is never lost. Accepting runs in its own task: once
//! it has started, the event is stored, queued and synced whether or not the client that sent
//! it waits for the answer (a handler future is dropped when its client hangs up).
//!
//! Per conversation, storing and queueing happen under one lock, so items are queued in the
//! order the inbox numbered them, and a redelivery is answered only after its original was
//! queued and synced. Accepted items go to the [`Dispatcher`]: one turn at a time per
//! conversation, in inbox order, under a global limit on running turns. The backlog (items
//! accepted and not yet finished) is bounded; when it is full, nothing is stored and the
//! caller is told to retry later.

pub(crate) mod commands;
mod dispatcher;
mod turn;

pub(crate) use dispatcher::{Dispatcher, RunTurn};
pub(crate) use turn::TurnRunner;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use antler_channel::InboundEvent;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::{EventHub, Subscription};
use crate::store::{Accept, Accepted, InboxItem, Store, StoreError, ThreadChoice};
use commands::Command;

/// How long a client is asked to wait when the backlog is full.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Locks that order accepts per conversation (a conversation always maps to the same one).
const ACCEPT_SHARDS: usize = 64;

/// Why an event was not accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IngressError {
    /// The backlog is full; nothing was stored.
    #[error("the backlog is full ({limit} messages waiting)")]
    Overloaded { limit: usize },
    /// The gateway is shutting down; nothing was stored.
    #[error("shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The accept task failed unexpectedly.
    #[error("accepting failed: {0}")]
    Internal(String),
}

/// The result of accepting an event.
#[derive(Debug)]
pub(crate) struct Admission {
    pub(crate) thread_id: String,
    /// False for a redelivery of something already accepted.
    pub(crate) new: bool,
    /// The inbox item the event became (for a redelivery: its original's, when known).
    pub(crate) seq: Option<u64>,
    /// Events of the thread, subscribed before the turn was queued (when asked for).
    pub(crate) events: Option<Subscription>,
}

/// The admission side of the gateway, shared by every channel.
#[derive(Debug, Clone)]
pub(crate) struct Ingress {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    hub: EventHub,
    backlog: Arc<AtomicUsize>,
    backlog_limit: usize,
    dedupe_ttl: Duration,
    stop: CancellationToken,
    shards: Vec<tokio::sync::Mutex<()>>,
}

/// A reserved place in the backlog, given back on drop unless kept.
struct Slot<'a> {
    backlog: &'a AtomicUsize,
    kept: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.backlog.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Settings of the ingress.
#[derive(Debug, Clone)]
pub(crate) struct IngressSettings {
    pub(crate) backlog_limit: usize,
    pub(crate) dedupe_ttl: Duration,
    pub(crate) max_concurrent_turns: usize,
}

impl Ingress {
    /// Builds the ingress and its dispatcher. Turns run on `tracker`; `stop` ends intake and
    /// the starting of turns.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        runner: TurnRunner,
        hub: EventHub,
        settings: &IngressSettings,
        tracker: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        let backlog = Arc::new(AtomicUsize::new(0));
        let run: RunTurn = {
            let backlog = Arc::clone(&backlog);
            let runner = runner.clone();
            Arc::new(move |_conversation, seq| {
                let runner = runner.clone();
                let backlog = Arc::clone(&backlog);
                Box::pin(async move {
                    if runner.run(seq).await {
                        backlog.fetch_sub(1, Ordering::SeqCst);
                        metrics::gauge!("antler_inbox_depth").decrement(1.0);
                    }
                })
            })
        };
        let dispatcher = Dispatcher::new(settings.max_concurrent_turns, run, tracker, stop.clone());
        let queue: Arc<dyn turn::QueueView> = Arc::new(dispatcher.clone());
        runner.attach_queue(Arc::downgrade(&queue));
        Self {
            inner: Arc::new(Inner {
                store,
                dispatcher,
                hub,
                backlog,
                backlog_limit: settings.backlog_limit,
                dedupe_ttl: settings.dedupe_ttl,
                stop,
                shards: (0..ACCEPT_SHARDS)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
            }),
        }
    }

    /// Items accepted and not yet finished.
    pub(crate) fn backlog(&self) -> usize {
        self.inner.backlog.load(Ordering::SeqCst)
    }

    /// Turns running now.
    pub(crate) fn running(&self) -> usize {
        self.inner.dispatcher.running()
    }

    /// Requeues what was accepted before a restart (pending or interrupted), in arrival order.
    pub(crate) fn recover(&self, items: Vec<InboxItem>) {
        self.inner.backlog.fetch_add(items.len(), Ordering::SeqCst);
        metrics::gauge!("antler_inbox_depth").increment(items.len() as f64);
        for item in items {
            self.inner
                .dispatcher
                .push(item.event.conversation.as_str(), item.seq);
        }
    }

    /// Accepts one event: dedupe + inbox, queue its turn, sync; then answers. Runs to the end
    /// in its own task even if the caller stops waiting.
    pub(crate) async fn accept(
        &self,
        event: InboundEvent,
        subscribe: bool,
    ) -> Result<Admission, IngressError> {
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move { inner.accept(event, subscribe).await })
            .await
            .map_err(|e| IngressError::Internal(e.to_string()))?
    }
}

impl Inner {
    fn shard(&self, conversation: &str) -> &tokio::sync::Mutex<()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        conversation.hash(&mut hasher);
        let index = usize::try_from(hasher.finish() % ACCEPT_SHARDS as u64).unwrap_or(0);
        &self.shards[index % self.shards.len()]
    }

    async fn accept(
        &self,
        event: InboundEvent,
        subscribe: bool,
    ) -> Result<Admission, IngressError> {
        if self.stop.is_cancelled() {
            return Err(IngressError::ShuttingDown);
        }
        let reserved = self.backlog.fetch_add(1, Ordering::SeqCst);
        let mut slot = Slot {
            backlog: &self.backlog,
            kept: false,
        };
        if reserved >= self.backlog_limit {
            metrics::counter!("antler_ingress_overloaded_total").increment(1);
            return Err(IngressError::Overloaded {
                limit: self.backlog_limit,
            });
        }
        let thread = match commands::parse(&event.text) {
            Some(Command::New) => ThreadChoice::Fresh,
            _ => ThreadChoice::Current,
        };
        let conversation = event.conversation.as_str().to_owned();
        let accept = Accept {
            dedupe_ttl_ms: u64::try_from(self.dedupe_ttl.as_millis()).unwrap_or(u64::MAX),
            now_ms: crate::now_ms(),
            event,
            thread,
        };
        let ordered = self.shard(&conversation).lock().await;
        let admission = match self.store.accept(accept).await? {
            Accepted::Duplicate { thread_id, seq } => {
                metrics::counter!("antler_ingress_duplicates_total").increment(1);
                let events = subscribe.then(|| self.hub.subscribe(&thread_id));
                Admission {
                    thread_id,
                    new: false,
                    seq,
                    events,
                }
            }
            Accepted::New(item) => {
                slot.kept = true;
                metrics::gauge!("antler_inbox_depth").increment(1.0);
                // Subscribe before the turn is queued, so not even an instant answer is missed.
                let events = subscribe.then(|| self.hub.subscribe(&item.thread_id));
                self.dispatcher.push(&conversation, item.seq);
                Admission {
                    thread_id: item.thread_id,
                    new: true,
                    seq: Some(item.seq),
                    events,
                }
            }
        };
        drop(ordered);
        // Durable before the answer, for a redelivery too: its original may still be waiting
        // for its own sync, and the answer must not get ahead of the data it stands for.
        self.store.flush().await?;
        Ok(admission)
    }
}

#[cfg(test)]
mod tests;
