//! The dispatcher: one turn at a time per conversation, in inbox order, under a global limit.
//!
//! It holds only what is needed to decide what runs next: per conversation, the inbox
//! sequence numbers waiting, and a round-robin queue of conversations that have work and no
//! running turn. A turn is built (its inbox item read, its future created, its task spawned)
//! only when a slot is free, so a long backlog costs a few dozen bytes per waiting message, not
//! a task each.
//!
//! A turn runs in its own task. Whatever happens to it (it finishes, fails, panics or is
//! cancelled), a guard hands its slot and its conversation back, so one bad turn never
//! wedges a conversation.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the dispatcher runs for one inbox item: `(conversation, seq)` to a future.
pub(crate) type RunTurn =
    Arc<dyn Fn(Arc<str>, u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Per-conversation FIFO execution with a global limit. Cloning shares it.
#[derive(Clone)]
pub(crate) struct Dispatcher {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("max_running", &self.inner.max_running)
            .finish_non_exhaustive()
    }
}

struct Inner {
    state: Mutex<State>,
    max_running: usize,
    run: RunTurn,
    tracker: TaskTracker,
    /// Once cancelled, no more turns start; waiting ones stay in the inbox.
    stop: CancellationToken,
}

#[derive(Default)]
struct State {
    lanes: HashMap<Arc<str>, Lane>,
    /// Conversations with waiting items and no running turn, in the order they became ready.
    ready: VecDeque<Arc<str>>,
    running: usize,
}

impl State {
    /// Gives memory back once a burst has drained: the tables keep the size of their largest
    /// backlog otherwise (tens of bytes per conversation that ever waited at once).
    fn shrink_after_a_burst(&mut self) {
        const SMALL: usize = 1024;
        if self.lanes.capacity() > SMALL && self.lanes.len() < self.lanes.capacity() / 4 {
            self.lanes.shrink_to(self.lanes.len() * 2);
        }
        if self.ready.capacity() > SMALL && self.ready.len() < self.ready.capacity() / 4 {
            self.ready.shrink_to(self.ready.len() * 2);
        }
    }
}

#[derive(Default)]
struct Lane {
    waiting: VecDeque<u64>,
    running: bool,
}

/// Gives a finished (or panicked, or cancelled) turn's slot and conversation back.
struct TurnGuard {
    inner: Arc<Inner>,
    conversation: Arc<str>,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        self.inner.finished(&self.conversation);
    }
}

impl Dispatcher {
    /// A dispatcher running at most `max_running` turns at once, each through `run`, on
    /// `tracker`.
    pub(crate) fn new(
        max_running: usize,
        run: RunTurn,
        tracker: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                max_running: max_running.max(1),
                run,
                tracker,
                stop,
            }),
        }
    }

    /// Queues inbox item `seq` of `conversation`. Callers push a conversation's items in
    /// inbox order.
    pub(crate) fn push(&self, conversation: &str, seq: u64) {
        {
            let Ok(mut state) = self.inner.state.lock() else {
                return;
            };
            let state = &mut *state;
            let key: Arc<str> = match state.lanes.get_key_value(conversation) {
                Some((key, _)) => Arc::clone(key),
                None => Arc::from(conversation),
            };
            let lane = state.lanes.entry(Arc::clone(&key)).or_default();
            lane.waiting.push_back(seq);
            if !lane.running && lane.waiting.len() == 1 {
                state.ready.push_back(key);
            }
        }
        self.inner.start_ready();
    }

    /// Items waiting (not running) in a conversation.
    pub(crate) fn waiting(&self, conversation: &str) -> usize {
        self.inner
            .state
            .lock()
            .map(|s| s.lanes.get(conversation).map_or(0, |l| l.waiting.len()))
            .unwrap_or(0)
    }

    /// Turns running now.
    pub(crate) fn running(&self) -> usize {
        self.inner.state.lock().map(|s| s.running).unwrap_or(0)
    }

    /// Whether `conversation` has a turn running or waiting.
    pub(crate) fn is_busy(&self, conversation: &str) -> bool {
        self.inner
            .state
            .lock()
            .map(|s| s.lanes.contains_key(conversation))
            .unwrap_or(true)
    }
}

impl Inner {
    /// Starts turns while slots are free and conversations are ready.
    fn start_ready(self: &Arc<Self>) {
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            let (conversation, seq) = {
                let Ok(mut state) = self.state.lock() else {
                    return;
                };
                if state.running >= self.max_running {
                    return;
                }
                let Some(conversation) = state.ready.pop_front() else {
                    return;
                };
                let Some(lane) = state.lanes.get_mut(&conversation) else {
                    continue;
                };
                let Some(seq) = lane.waiting.pop_front() else {
                    continue;
                };
                lane.running = true;
                state.running += 1;
                (conversation, seq)
            };
            let guard = TurnGuard {
                inner: Arc::clone(self),
                conversation: Arc::clone(&conversation),
            };
            let turn = (self.run)(conversation, seq);
            self.tracker.spawn(async move {
                // A panic is contained here; the guard hands the slot back either way.
                if std::panic::AssertUnwindSafe(turn)
                    .catch_unwind()
                    .await
                    .is_err()
                {
                    tracing::error!(seq, "a turn panicked; its conversation goes on");
                    metrics::counter!("antler_turn_panics_total").increment(1);
                }
                drop(guard);
            });
        }
    }

    fn finished(self: &Arc<Self>, conversation: &Arc<str>) {
        if let Ok(mut state) = self.state.lock() {
            let state = &mut *state;
            state.running = state.running.saturating_sub(1);
            if let Some(lane) = state.lanes.get_mut(conversation) {
                lane.running = false;
                if lane.waiting.is_empty() {
                    state.lanes.remove(conversation);
                    state.shrink_after_a_burst();
                } else {
                    state.ready.push_back(Arc::clone(conversation));
                }
            }
        }
        self.start_ready();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;

    type Log = Arc<Mutex<Vec<(String, u64)>>>;

    struct Probe {
        log: Log,
        running: Arc<Mutex<HashMap<String, usize>>>,
        max_same_conversation: Arc<AtomicUsize>,
        total: Arc<AtomicUsize>,
        max_total: Arc<AtomicUsize>,
    }

    fn probe_dispatcher(
        max: usize,
        tracker: &TaskTracker,
        panic_on: Option<u64>,
    ) -> (Dispatcher, Probe) {
        let probe = Probe {
            log: Log::default(),
            running: Arc::default(),
            max_same_conversation: Arc::default(),
            total: Arc::default(),
            max_total: Arc::default(),
        };
        let (log, running, max_same, total, max_total) = (
            Arc::clone(&probe.log),
            Arc::clone(&probe.running),
            Arc::clone(&probe.max_same_conversation),
            Arc::clone(&probe.total),
            Arc::clone(&probe.max_total),
        );
        let run: RunTurn = Arc::new(move |conversation: Arc<str>, seq: u64| {
            let (log, running, max_same, total, max_total) = (
                Arc::clone(&log),
                Arc::clone(&running),
                Arc::clone(&max_same),
                Arc::clone(&total),
                Arc::clone(&max_total),
            );
            Box::pin(async move {
                let key = conversation.to_string();
                let now = {
                    let mut map = running.lock().unwrap();
                    let n = map.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                max_same.fetch_max(now, Ordering::SeqCst);
                let all = total.fetch_add(1, Ordering::SeqCst) + 1;
                max_total.fetch_max(all, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                log.lock().unwrap().push((key.clone(), seq));
                total.fetch_sub(1, Ordering::SeqCst);
                *running.lock().unwrap().get_mut(&key).unwrap() -= 1;
                assert_ne!(Some(seq), panic_on, "this turn panics");
            })
        });
        (
            Dispatcher::new(max, run, tracker.clone(), CancellationToken::new()),
            probe,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn one_turn_per_conversation_in_push_order_under_the_global_limit() {
        let tracker = TaskTracker::new();
        let (dispatcher, probe) = probe_dispatcher(2, &tracker, None);
        for seq in 0..30 {
            let conversation = ["a", "b", "c"][seq as usize % 3];
            dispatcher.push(conversation, seq);
        }
        assert!(dispatcher.waiting("a") >= 8, "most of a's items wait");
        tracker.close();
        tracker.wait().await;
        let log = probe.log.lock().unwrap();
        assert_eq!(log.len(), 30);
        for conversation in ["a", "b", "c"] {
            let seqs: Vec<u64> = log
                .iter()
                .filter(|(c, _)| c == conversation)
                .map(|(_, s)| *s)
                .collect();
            let mut sorted = seqs.clone();
            sorted.sort_unstable();
            assert_eq!(seqs, sorted, "{conversation} runs in push order");
        }
        assert_eq!(
            probe.max_same_conversation.load(Ordering::SeqCst),
            1,
            "never two turns of one conversation at once"
        );
        assert_eq!(
            probe.max_total.load(Ordering::SeqCst),
            2,
            "the global limit is reached and never exceeded"
        );
        assert_eq!(dispatcher.running(), 0);
        assert_eq!(dispatcher.waiting("a"), 0);
        assert!(dispatcher.inner.state.lock().unwrap().lanes.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_tables_give_their_memory_back_after_a_burst() {
        let tracker = TaskTracker::new();
        let (dispatcher, _probe) = probe_dispatcher(4, &tracker, None);
        for seq in 0..20_000 {
            dispatcher.push(&format!("c{seq}"), seq);
        }
        let grown = dispatcher.inner.state.lock().unwrap().lanes.capacity();
        assert!(grown >= 20_000);
        tracker.close();
        tracker.wait().await;
        let state = dispatcher.inner.state.lock().unwrap();
        assert!(state.lanes.is_empty());
        assert!(
            state.lanes.capacity() <= 1024 * 2 && state.ready.capacity() <= 1024 * 2,
            "{} / {}",
            state.lanes.capacity(),
            state.ready.capacity()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_turn_fails_alone_and_its_conversation_goes_on() {
        let tracker = TaskTracker::new();
        let (dispatcher, probe) = probe_dispatcher(1, &tracker, Some(1));
        for seq in 0..4 {
            dispatcher.push("a", seq);
        }
        tracker.close();
        tracker.wait().await;
        let seqs: Vec<u64> = probe.log.lock().unwrap().iter().map(|(_, s)| *s).collect();
        assert_eq!(seqs, [0, 1, 2, 3], "the turns after the panic still ran");
        assert_eq!(dispatcher.running(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_starts_after_stop() {
        let tracker = TaskTracker::new();
        let stop = CancellationToken::new();
        let started = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Notify::new());
        let run: RunTurn = {
            let started = Arc::clone(&started);
            let gate = Arc::clone(&gate);
            Arc::new(move |_, _| {
                let started = Arc::clone(&started);
                let gate = Arc::clone(&gate);
                Box::pin(async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    gate.notified().await;
                })
            })
        };
        let dispatcher = Dispatcher::new(1, run, tracker.clone(), stop.clone());
        dispatcher.push("a", 1);
        dispatcher.push("b", 2);
        tokio::task::yield_now().await;
        stop.cancel();
        gate.notify_one();
        tracker.close();
        tracker.wait().await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(
            dispatcher.waiting("b"),
            1,
            "it stays queued (and in the inbox)"
        );
    }
}
