//! Lanes: per-key FIFO execution. Items with the same key run one at a time in push order;
//! different keys run concurrently. Delivery uses a lane per conversation, so replies arrive
//! in order while one slow chat does not hold up the others. (Turns have their own dispatcher,
//! which also bounds how many run at once.) A panic while handling one item is contained: the
//! lane goes on with the next.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

type Handler<T> = Arc<dyn Fn(T) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Per-key serial executor. Cloning shares the lanes.
pub(crate) struct Lanes<T> {
    queues: Arc<Mutex<HashMap<String, VecDeque<T>>>>,
    handler: Handler<T>,
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl<T> Clone for Lanes<T> {
    fn clone(&self) -> Self {
        Self {
            queues: Arc::clone(&self.queues),
            handler: Arc::clone(&self.handler),
            tracker: self.tracker.clone(),
            stop: self.stop.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Lanes<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").finish_non_exhaustive()
    }
}

impl<T> Lanes<T>
where
    T: Send + 'static,
{
    /// Lanes that run `handler` for each item. Lane tasks are spawned on `tracker`; after
    /// `stop` is cancelled, lanes finish the item in hand and take no more.
    pub(crate) fn new<F, Fut>(handler: F, tracker: TaskTracker, stop: CancellationToken) -> Self
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self {
            queues: Arc::default(),
            handler: Arc::new(move |item| Box::pin(handler(item))),
            tracker,
            stop,
        }
    }

    /// Queues an item on its key's lane, starting the lane if it is idle.
    pub(crate) fn push(&self, key: &str, item: T) {
        let Ok(mut queues) = self.queues.lock() else {
            return;
        };
        if let Some(queue) = queues.get_mut(key) {
            queue.push_back(item);
            return;
        }
        // An entry (even empty) marks the lane as running.
        queues.insert(key.to_owned(), VecDeque::new());
        drop(queues);
        let lanes = self.clone();
        let key = key.to_owned();
        self.tracker
            .spawn(async move { lanes.drain(key, item).await });
    }

    async fn drain(&self, key: String, first: T) {
        let mut next = Some(first);
        while let Some(item) = next {
            if self.stop.is_cancelled() {
                break;
            }
            let handled = std::panic::AssertUnwindSafe((self.handler)(item))
                .catch_unwind()
                .await;
            if handled.is_err() {
                tracing::error!(lane = %key, "handling an item panicked; the lane goes on");
                metrics::counter!("antler_lane_panics_total").increment(1);
            }
            next = match self.queues.lock() {
                Ok(mut queues) => {
                    let item = queues.get_mut(&key).and_then(VecDeque::pop_front);
                    if item.is_none() {
                        queues.remove(&key);
                    }
                    item
                }
                Err(_) => None,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn same_key_runs_in_order_one_at_a_time_and_keys_run_concurrently() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let max_same_key = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tracker = TaskTracker::new();
        let lanes = {
            let log = Arc::clone(&log);
            let max_same_key = Arc::clone(&max_same_key);
            Lanes::new(
                move |(key, n): (&'static str, u32)| {
                    let log = Arc::clone(&log);
                    let running = Arc::clone(&running);
                    let max_same_key = Arc::clone(&max_same_key);
                    async move {
                        if key == "a" {
                            let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                            max_same_key.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        log.lock().unwrap().push((key, n));
                        assert!(!(key == "b" && n == 2), "one item panics");
                        if key == "a" {
                            running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                },
                tracker.clone(),
                CancellationToken::new(),
            )
        };
        for n in 0..5 {
            lanes.push("a", ("a", n));
            lanes.push("b", ("b", n));
        }
        tracker.close();
        tracker.wait().await;
        let log = log.lock().unwrap();
        let a: Vec<u32> = log
            .iter()
            .filter(|(k, _)| *k == "a")
            .map(|(_, n)| *n)
            .collect();
        let b: Vec<u32> = log
            .iter()
            .filter(|(k, _)| *k == "b")
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(a, [0, 1, 2, 3, 4]);
        assert_eq!(b, [0, 1, 2, 3, 4], "the lane went on after the panic");
        assert_eq!(
            max_same_key.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "two items of one key never ran at once"
        );
        assert!(
            lanes.queues.lock().unwrap().is_empty(),
            "idle lanes are forgotten"
        );
    }

    #[tokio::test]
    async fn a_stopped_lane_takes_no_more_items() {
        let done = Arc::new(Mutex::new(Vec::new()));
        let tracker = TaskTracker::new();
        let stop = CancellationToken::new();
        let lanes = {
            let done = Arc::clone(&done);
            let inner_stop = stop.clone();
            Lanes::new(
                move |n: u32| {
                    let stop = inner_stop.clone();
                    let done = Arc::clone(&done);
                    async move {
                        done.lock().unwrap().push(n);
                        stop.cancel();
                    }
                },
                tracker.clone(),
                stop.clone(),
            )
        };
        lanes.push("k", 1);
        lanes.push("k", 2);
        tracker.close();
        tracker.wait().await;
        assert_eq!(*done.lock().unwrap(), [1]);
    }
}
