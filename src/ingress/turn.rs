//! One turn: an inbox item becomes a command reply or an agent run, and its replies go to the
//! outbox in the same transaction that removes the item from the inbox.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use antler_channel::OutboundMessage;
use tokio::time::Instant;

use super::commands::{self, Command};
use crate::agent::runtime::{RunObserver, Runtime};
use crate::agent::thread::ThreadState;
use crate::delivery::Delivery;
use crate::events::{EventHub, ThreadEvent};
use crate::lanes::{Lanes, Waiting};
use crate::store::{FinishTurn, InboxItem, Store};

/// Runs inbox items. Cloning shares it.
#[derive(Debug, Clone)]
pub(crate) struct TurnRunner {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    runtime: Runtime,
    hub: EventHub,
    delivery: Delivery,
    max_attempts: u32,
    turn_timeout: Duration,
    /// Only the counts: the lanes' handler owns this runner, so owning the lanes would be a
    /// cycle that keeps the store open after shutdown.
    lanes: OnceLock<Waiting<InboxItem>>,
}

/// Streams deltas to subscribers and checkpoints the thread after tool results.
struct TurnObserver<'a> {
    store: &'a dyn Store,
    hub: &'a EventHub,
    thread_id: &'a str,
    in_reply_to: &'a str,
}

#[async_trait::async_trait]
impl RunObserver for TurnObserver<'_> {
    fn delta(&self, text: &str) {
        self.hub.publish(
            self.thread_id,
            ThreadEvent::Delta {
                in_reply_to: self.in_reply_to.to_owned(),
                text: text.to_owned(),
            },
        );
    }

    async fn checkpoint(&self, thread: &ThreadState) {
        if let Err(e) = self.store.checkpoint_thread(thread).await {
            tracing::warn!(thread = %thread.id, error = %e, "checkpoint failed");
        }
    }
}

impl TurnRunner {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        runtime: Runtime,
        hub: EventHub,
        delivery: Delivery,
        max_attempts: u32,
        turn_timeout: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                runtime,
                hub,
                delivery,
                max_attempts: max_attempts.max(1),
                turn_timeout,
                lanes: OnceLock::new(),
            }),
        }
    }

    /// Lets `/status` see the queue (the lanes are built after the runner).
    pub(crate) fn attach_lanes(&self, lanes: Lanes<InboxItem>) {
        let _ = self.inner.lanes.set(lanes.waiting_view());
    }

    /// Runs one item to completion. Returns whether it finished (left the inbox); `false`
    /// means it stays in the inbox and runs again after a restart.
    pub(crate) async fn run(&self, item: InboxItem) -> bool {
        let inner = &self.inner;
        let started = Instant::now();
        let item = match inner.store.start_turn(item.seq).await {
            Ok(item) => item,
            Err(e) => {
                tracing::error!(seq = item.seq, error = %e, "cannot start turn; it stays in the inbox");
                return false;
            }
        };
        let (thread, text, outcome) = if item.attempts > inner.max_attempts {
            tracing::error!(
                seq = item.seq,
                attempts = item.attempts,
                "giving up on a message that keeps failing"
            );
            let text = format!(
                "⚠️ Sorry, I could not process this message after {} attempts, so I gave up on it.",
                inner.max_attempts
            );
            (None, text, "abandoned")
        } else {
            match commands::parse(&item.event.text) {
                Some(command) => (None, self.command(&item, command).await, "command"),
                None => {
                    let (thread, text, outcome) = self.agent_turn(&item).await;
                    (Some(thread), text, outcome)
                }
            }
        };
        let reply = OutboundMessage {
            idempotency_key: format!("{}:{}:0", item.thread_id, item.seq),
            conversation: item.event.conversation.clone(),
            thread_id: item.thread_id.clone(),
            text,
            reply_to: item.event.reply_to.clone(),
        };
        let finish = FinishTurn {
            inbox_seq: item.seq,
            thread,
            replies: vec![reply],
            memory_update: None,
            now_ms: crate::now_ms(),
        };
        match inner.store.finish_turn(finish).await {
            Ok(items) => {
                inner.delivery.enqueue(items);
                metrics::counter!("antler_turns_total", "outcome" => outcome).increment(1);
                metrics::histogram!("antler_turn_duration_seconds")
                    .record(started.elapsed().as_secs_f64());
                true
            }
            Err(e) => {
                tracing::error!(seq = item.seq, error = %e, "cannot finish turn; it stays in the inbox");
                false
            }
        }
    }

    async fn agent_turn(&self, item: &InboxItem) -> (ThreadState, String, &'static str) {
        let inner = &self.inner;
        let now = crate::now_ms();
        let mut thread = match inner.store.thread(&item.thread_id).await {
            Ok(Some(thread)) => thread,
            Ok(None) => ThreadState::new(
                item.thread_id.clone(),
                item.event.conversation.to_string(),
                0,
                now,
            ),
            Err(e) => {
                tracing::error!(error = %e, "cannot load thread");
                let thread = ThreadState::new(
                    item.thread_id.clone(),
                    item.event.conversation.to_string(),
                    0,
                    now,
                );
                return (
                    thread,
                    "⚠️ Sorry, I could not load this conversation.".to_owned(),
                    "failed",
                );
            }
        };
        let user_id = format!("{}:{}", item.event.channel, item.event.user.id);
        let in_reply_to = item
            .event
            .reply_to
            .clone()
            .unwrap_or_else(|| item.event.event_id.clone());
        let observer = TurnObserver {
            store: inner.store.as_ref(),
            hub: &inner.hub,
            thread_id: &item.thread_id,
            in_reply_to: &in_reply_to,
        };
        // A re-run after a crash continues from the checkpoint this item's turn left, if any,
        // so its user message is not added twice and finished tool rounds do not run again.
        let resume = thread.checkpoint_of == Some(item.seq);
        thread.checkpoint_of = Some(item.seq);
        let run = async {
            if resume {
                inner.runtime.resume(&mut thread, &user_id, &observer).await
            } else {
                inner
                    .runtime
                    .run(&mut thread, &user_id, &item.event.text, &observer)
                    .await
            }
        };
        let (text, outcome) = match tokio::time::timeout(inner.turn_timeout, run).await {
            Ok(Ok(outcome)) if outcome.answer.trim().is_empty() => {
                ("(The model returned an empty answer.)".to_owned(), "ok")
            }
            Ok(Ok(outcome)) => (outcome.answer, "ok"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "turn failed");
                (
                    format!("⚠️ Sorry, the turn failed: {e}. Send your message again to retry."),
                    "failed",
                )
            }
            Err(_) => {
                tracing::warn!(timeout = ?inner.turn_timeout, "turn timed out");
                (
                    format!(
                        "⚠️ Sorry, this took longer than {} seconds and was stopped.",
                        inner.turn_timeout.as_secs()
                    ),
                    "timed_out",
                )
            }
        };
        thread.checkpoint_of = None;
        thread.updated_at_ms = crate::now_ms();
        (thread, text, outcome)
    }

    async fn command(&self, item: &InboxItem, command: Command) -> String {
        match command {
            Command::Help => commands::HELP.to_owned(),
            Command::New => format!("New conversation started (thread {}).", item.thread_id),
            Command::Unknown(name) => format!("Unknown command /{name}.\n{}", commands::HELP),
            Command::Status => self.status(item).await,
        }
    }

    async fn status(&self, item: &InboxItem) -> String {
        let inner = &self.inner;
        let thread = inner.store.thread(&item.thread_id).await.ok().flatten();
        let waiting = inner
            .lanes
            .get()
            .map_or(0, |l| l.waiting(item.event.conversation.as_str()));
        let backlog = inner.store.stats().await.map(|s| s.inbox).unwrap_or(0);
        let mut out = format!("Thread: {}", item.thread_id);
        if let Some(thread) = &thread {
            if let Some(title) = &thread.title {
                out.push_str(&format!(" — {title}"));
            }
            out.push_str(&format!(
                "\nTurns: {} · messages: {}\nTokens: {} prompt + {} completion = {} total",
                thread.turns,
                thread.messages.len(),
                thread.usage.prompt_tokens,
                thread.usage.completion_tokens,
                thread.usage.total_tokens
            ));
        }
        out.push_str(&format!(
            "\nModel: {}\nQueue: {waiting} waiting in this conversation, {backlog} in the inbox",
            inner.runtime.model_name()
        ));
        out
    }
}
