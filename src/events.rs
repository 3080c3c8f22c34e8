//! Live thread events for subscribers (the API channel's SSE streams): streamed text and tool
//! progress while a turn runs, and the final answer when it is delivered. Events are not stored; a subscriber
//! that connects late reads the thread instead.
//!
//! A thread's channel (and its buffer of `BUFFER` slots, allocated up front) lives only while
//! someone subscribes: dropping the last [`Subscription`] forgets it, so memory does not grow
//! with the number of threads ever watched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;

/// Buffer per thread; a subscriber that falls further behind skips ahead.
const BUFFER: usize = 256;

/// One event on a thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ThreadEvent {
    /// A fragment of the answer being written.
    Delta { in_reply_to: String, text: String },
    /// A reply was delivered, with the files it carries.
    Final {
        in_reply_to: String,
        text: String,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<FileLink>,
    },
    /// A tool call of the turn started, reported progress or ended.
    Tool {
        in_reply_to: String,
        call_id: String,
        name: String,
        state: ToolState,
        #[serde(skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
}

/// A file delivered with a reply, as an API client fetches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FileLink {
    /// Its path under the thread's outputs folder.
    pub(crate) name: String,
    pub(crate) media_type: String,
    /// In bytes.
    pub(crate) size: u64,
    /// Where to download it (`GET`, with the same token).
    pub(crate) url: String,
}

/// Where a tool call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToolState {
    Started,
    Running,
    Finished,
    Failed,
}

impl ThreadEvent {
    /// The message this event answers.
    pub(crate) fn in_reply_to(&self) -> &str {
        match self {
            Self::Delta { in_reply_to, .. }
            | Self::Final { in_reply_to, .. }
            | Self::Tool { in_reply_to, .. } => in_reply_to,
        }
    }

    /// The SSE event name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Delta { .. } => "delta",
            Self::Final { .. } => "final",
            Self::Tool { .. } => "tool",
        }
    }
}

/// Broadcast channels by thread id, created on first subscription.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventHub {
    threads: Arc<Mutex<HashMap<String, broadcast::Sender<ThreadEvent>>>>,
}

/// One subscriber's view of a thread's events.
#[derive(Debug)]
pub(crate) struct Subscription {
    /// Taken (dropped) in `drop`, under the hub's lock.
    receiver: Option<broadcast::Receiver<ThreadEvent>>,
    hub: EventHub,
    thread_id: String,
}

impl Subscription {
    /// The next event, as [`broadcast::Receiver::recv`].
    pub(crate) async fn recv(&mut self) -> Result<ThreadEvent, broadcast::error::RecvError> {
        match &mut self.receiver {
            Some(receiver) => receiver.recv().await,
            None => Err(broadcast::error::RecvError::Closed),
        }
    }
}

impl Drop for Subscription {
    /// Forgets the thread's channel when this was its last subscriber. The receiver is dropped
    /// under the same lock `subscribe` takes, so a concurrent subscriber is never cut off.
    fn drop(&mut self) {
        let Ok(mut threads) = self.hub.threads.lock() else {
            return;
        };
        drop(self.receiver.take());
        if threads
            .get(&self.thread_id)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            threads.remove(&self.thread_id);
        }
    }
}

impl EventHub {
    pub(crate) fn subscribe(&self, thread_id: &str) -> Subscription {
        let receiver = match self.threads.lock() {
            Ok(mut threads) => threads
                .entry(thread_id.to_owned())
                .or_insert_with(|| broadcast::channel(BUFFER).0)
                .subscribe(),
            Err(_) => broadcast::channel(1).1,
        };
        Subscription {
            receiver: Some(receiver),
            hub: self.clone(),
            thread_id: thread_id.to_owned(),
        }
    }

    /// Sends to current subscribers; forgets the thread when nobody listens any more.
    pub(crate) fn publish(&self, thread_id: &str, event: ThreadEvent) {
        let Ok(mut threads) = self.threads.lock() else {
            return;
        };
        if let Some(sender) = threads.get(thread_id) {
            if sender.send(event).is_err() {
                threads.remove(thread_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_get_events_and_idle_threads_are_forgotten() {
        let hub = EventHub::default();
        hub.publish(
            "t",
            ThreadEvent::Delta {
                in_reply_to: "m".into(),
                text: "lost".into(),
            },
        );
        let mut rx = hub.subscribe("t");
        let event = ThreadEvent::Final {
            in_reply_to: "m".into(),
            text: "hi".into(),
            attachments: Vec::new(),
        };
        hub.publish("t", event.clone());
        assert_eq!(rx.recv().await.unwrap(), event);
        drop(rx);
        hub.publish("t", event);
        assert!(hub.threads.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_last_subscription_dropped_forgets_the_thread() {
        let hub = EventHub::default();
        let first = hub.subscribe("t");
        let mut second = hub.subscribe("t");
        drop(first);
        assert_eq!(
            hub.threads.lock().unwrap().len(),
            1,
            "one subscriber is left"
        );
        let event = ThreadEvent::Final {
            in_reply_to: "m".into(),
            text: "hi".into(),
            attachments: Vec::new(),
        };
        hub.publish("t", event.clone());
        assert_eq!(second.recv().await.unwrap(), event);
        drop(second);
        assert!(hub.threads.lock().unwrap().is_empty());
    }
}
