//! Ingress: dedupe → inbox → ack, then the dispatcher.
//!
//! [`Ingress::accept`] answers only after the event is durably in the inbox (or recognised as a
//! redelivery), so an acknowledged message is never lost. Accepted items go to a lane per
//! conversation: one turn at a time, in arrival order, under a global limit on running turns.
//! The backlog (items accepted and not yet finished) is bounded; when it is full, nothing is
//! stored and the caller is told to retry later.

pub(crate) mod commands;
mod turn;

pub(crate) use turn::TurnRunner;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use antler_channel::InboundEvent;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::{EventHub, Subscription};
use crate::lanes::Lanes;
use crate::store::{Accept, Accepted, InboxItem, Store, StoreError, ThreadChoice};
use commands::Command;

/// How long a client is asked to wait when the backlog is full.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

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
}

/// The result of accepting an event.
#[derive(Debug)]
pub(crate) struct Admission {
    pub(crate) thread_id: String,
    /// False for a redelivery of something already accepted.
    pub(crate) new: bool,
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
    lanes: Lanes<InboxItem>,
    hub: EventHub,
    backlog: Arc<AtomicUsize>,
    backlog_limit: usize,
    dedupe_ttl: Duration,
    stop: CancellationToken,
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
    /// Builds the ingress and its dispatcher. Turns run on `tracker`; `stop` ends intake.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        runner: TurnRunner,
        hub: EventHub,
        settings: &IngressSettings,
        tracker: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        let backlog = Arc::new(AtomicUsize::new(0));
        let permits = Arc::new(tokio::sync::Semaphore::new(
            settings.max_concurrent_turns.max(1),
        ));
        let lanes = {
            let backlog = Arc::clone(&backlog);
            let runner = runner.clone();
            let lane_stop = stop.clone();
            Lanes::new(
                move |item: InboxItem| {
                    let runner = runner.clone();
                    let permits = Arc::clone(&permits);
                    let backlog = Arc::clone(&backlog);
                    let stop = lane_stop.clone();
                    async move {
                        // A turn still waiting for a permit at shutdown stays in the inbox
                        // for the next start instead of stretching the grace period.
                        let permit = tokio::select! {
                            permit = permits.acquire_owned() => permit,
                            () = stop.cancelled() => return,
                        };
                        // The semaphore is never closed, so acquiring cannot fail.
                        let Ok(_permit) = permit else {
                            return;
                        };
                        if runner.run(item).await {
                            backlog.fetch_sub(1, Ordering::SeqCst);
                            metrics::gauge!("antler_inbox_depth").decrement(1.0);
                        }
                    }
                },
                tracker,
                stop.clone(),
            )
        };
        runner.attach_lanes(lanes.clone());
        Self {
            inner: Arc::new(Inner {
                store,
                lanes,
                hub,
                backlog,
                backlog_limit: settings.backlog_limit,
                dedupe_ttl: settings.dedupe_ttl,
                stop,
            }),
        }
    }

    /// Items accepted and not yet finished.
    pub(crate) fn backlog(&self) -> usize {
        self.inner.backlog.load(Ordering::SeqCst)
    }

    /// Requeues what was accepted before a restart (pending or interrupted), in arrival order.
    pub(crate) fn recover(&self, items: Vec<InboxItem>) {
        self.inner.backlog.fetch_add(items.len(), Ordering::SeqCst);
        metrics::gauge!("antler_inbox_depth").increment(items.len() as f64);
        for item in items {
            let conversation = item.event.conversation.as_str().to_owned();
            self.inner.lanes.push(&conversation, item);
        }
    }

    /// Accepts one event: dedupe + inbox (durable), then queues its turn.
    pub(crate) async fn accept(
        &self,
        event: InboundEvent,
        subscribe: bool,
    ) -> Result<Admission, IngressError> {
        let inner = &self.inner;
        if inner.stop.is_cancelled() {
            return Err(IngressError::ShuttingDown);
        }
        let reserved = inner.backlog.fetch_add(1, Ordering::SeqCst);
        let mut slot = Slot {
            backlog: &inner.backlog,
            kept: false,
        };
        if reserved >= inner.backlog_limit {
            metrics::counter!("antler_ingress_overloaded_total").increment(1);
            return Err(IngressError::Overloaded {
                limit: inner.backlog_limit,
            });
        }
        let thread = match commands::parse(&event.text) {
            Some(Command::New) => ThreadChoice::Fresh,
            _ => ThreadChoice::Current,
        };
        let accept = Accept {
            dedupe_key: format!("{}:{}", event.conversation, event.event_id),
            dedupe_ttl_ms: u64::try_from(inner.dedupe_ttl.as_millis()).unwrap_or(u64::MAX),
            now_ms: crate::now_ms(),
            event,
            thread,
        };
        match inner.store.accept(accept).await? {
            Accepted::Duplicate { thread_id } => {
                metrics::counter!("antler_ingress_duplicates_total").increment(1);
                Ok(Admission {
                    thread_id,
                    new: false,
                    events: None,
                })
            }
            Accepted::New(item) => {
                slot.kept = true;
                metrics::gauge!("antler_inbox_depth").increment(1.0);
                let thread_id = item.thread_id.clone();
                // Subscribe before the turn is queued, so not even an instant answer is missed.
                let events = subscribe.then(|| inner.hub.subscribe(&thread_id));
                let conversation = item.event.conversation.as_str().to_owned();
                inner.lanes.push(&conversation, item);
                Ok(Admission {
                    thread_id,
                    new: true,
                    events,
                })
            }
        }
    }
}
