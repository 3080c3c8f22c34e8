//! Delivery: the outbox drained by a lane per conversation.
//!
//! Each outbox item is rendered by its channel into one or more parts (platform messages) and
//! sent part by part, each recorded with the platform's receipt as it goes, so neither a retry
//! nor a restart sends a part again. Failures are retried with exponential backoff (honouring a
//! platform's retry-after). A reply whose turn wrote a live draft replaces the draft with its
//! first part (the draft itself is written by [`Draft`] while the turn runs). Replies of one
//! conversation go out in order; a slow or rate-limited chat does
//! not hold up the others. On start, every pending item is queued again.
//!
//! A reply's files ([`antler_channel::OutboundFile`], names under the thread's outputs) go
//! out after its text, each as one more recorded part, on channels that send files
//! ([`Capabilities::files`](antler_channel::Capabilities::files)); elsewhere the text gets a line per file naming it instead. Each
//! file is opened here, beneath the thread's outputs folder with links refused and checked on
//! the open file ([`open_presented`]), and the channel gets that open file: the sandbox may
//! have swapped the file for a link since it was presented, and then it is not sent; a short
//! note in the chat says so instead.

mod draft;

use crate::store::{OutboxItem, OutboxStatus, OutboxStore, StoreError};
pub(crate) use draft::Draft;
// The policy is the runtime's too (MCP restarts), so it lives in the agent layer.
use crate::retry::RetryPolicy;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use antler_channel::{
    Button, Channel, ChannelError, FileContent, OutboundFile, OutboundMessage, Part, Receipt,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::agent::input::ThreadFolders;
use crate::agent::tools::present_files::open_presented;
use crate::beneath::Refused;
use crate::health::ChannelHealth;
use crate::lanes::Lanes;
use crate::units::human_size;

/// Where the files of replies are: the store's folder (threads are under `threads/`) and the
/// largest file sent (`agent.max_attachment_bytes`).
#[derive(Debug, Clone)]
pub(crate) struct ReplyFiles {
    pub(crate) data_root: PathBuf,
    pub(crate) max_bytes: u64,
}

impl ReplyFiles {
    /// Opens `file` of the reply to `thread_id` for sending (see the module doc).
    async fn open(&self, thread_id: &str, file: &OutboundFile) -> Result<FileContent, Refused> {
        let folders =
            ThreadFolders::new(&self.data_root, thread_id).map_err(|_| Refused::Outside)?;
        let name = file.name.clone();
        let max_bytes = self.max_bytes;
        let opened =
            tokio::task::spawn_blocking(move || open_presented(&folders, &name, max_bytes))
                .await
                .map_err(|e| Refused::Io(std::io::Error::other(e.to_string())))??;
        Ok(FileContent {
            file: opened.file,
            size: opened.size,
        })
    }
}

/// The items waiting out a backoff: what wakes each early (an operator's retry or drop) and
/// when it is tried next (ms since the epoch). Cloning shares them.
#[derive(Debug, Clone, Default)]
struct Backoffs(Arc<Mutex<HashMap<u64, Backoff>>>);

/// One item's backoff.
#[derive(Debug)]
struct Backoff {
    wake: Arc<Notify>,
    next_ms: u64,
}

impl Backoffs {
    fn waiting(&self, seq: u64, wait: std::time::Duration) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        let next_ms =
            crate::now_ms().saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        if let Ok(mut waiting) = self.0.lock() {
            waiting.insert(
                seq,
                Backoff {
                    wake: Arc::clone(&notify),
                    next_ms,
                },
            );
        }
        notify
    }

    fn done(&self, seq: u64) {
        if let Ok(mut waiting) = self.0.lock() {
            waiting.remove(&seq);
        }
    }

    /// Ends `seq`'s backoff now; whether it was waiting one.
    fn wake(&self, seq: u64) -> bool {
        let notify = self
            .0
            .lock()
            .ok()
            .and_then(|w| w.get(&seq).map(|b| Arc::clone(&b.wake)));
        notify.inspect(|n| n.notify_one()).is_some()
    }

    fn next_ms(&self, seq: u64) -> Option<u64> {
        self.0
            .lock()
            .ok()
            .and_then(|w| w.get(&seq).map(|b| b.next_ms))
    }
}

/// What an operator's retry did ([`Delivery::retry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retried {
    /// Given up on before; pending again and queued.
    Requeued,
    /// Waiting out a backoff; it is tried now.
    Woken,
    /// Pending and on its way (queued behind others, or being sent): nothing to do.
    Underway,
    /// Sent already: nothing to do.
    Sent,
}

/// Sends outbox items. Cloning shares it.
#[derive(Clone)]
pub(crate) struct Delivery {
    lanes: Lanes<OutboxItem>,
    channels: Arc<HashMap<String, Arc<dyn Channel>>>,
    store: Arc<dyn OutboxStore>,
    backoffs: Backoffs,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut channels: Vec<&str> = self.channels.keys().map(String::as_str).collect();
        channels.sort_unstable();
        f.debug_struct("Delivery")
            .field("lanes", &self.lanes)
            .field("channels", &channels)
            .finish()
    }
}

impl Delivery {
    pub(crate) fn new(
        store: Arc<dyn OutboxStore>,
        channels: HashMap<String, Arc<dyn Channel>>,
        policy: RetryPolicy,
        files: ReplyFiles,
        health: ChannelHealth,
        tracker: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        let channels = Arc::new(channels);
        let files = Arc::new(files);
        let backoffs = Backoffs::default();
        let lanes = {
            let channels = Arc::clone(&channels);
            let store = Arc::clone(&store);
            let backoffs = backoffs.clone();
            let lane_stop = stop.clone();
            Lanes::new(
                move |item: OutboxItem| {
                    let store = Arc::clone(&store);
                    let channels = Arc::clone(&channels);
                    let files = Arc::clone(&files);
                    let health = health.clone();
                    let backoffs = backoffs.clone();
                    let stop = stop.clone();
                    async move {
                        let done = Delivering {
                            store: store.as_ref(),
                            channels: &channels,
                            files: &files,
                            health: &health,
                            backoffs: &backoffs,
                        };
                        done.deliver(policy, &stop, item).await;
                    }
                },
                tracker,
                lane_stop,
            )
        };
        Self {
            lanes,
            channels,
            store,
            backoffs,
        }
    }

    /// When outbox item `seq` is tried next, while it waits out a backoff here.
    pub(crate) fn next_retry_ms(&self, seq: u64) -> Option<u64> {
        self.backoffs.next_ms(seq)
    }

    /// An operator's "retry now" of outbox item `seq`: an item given up on is pending again
    /// and queued; one waiting out a backoff is tried at once.
    pub(crate) async fn retry(&self, seq: u64) -> Result<Retried, StoreError> {
        let Some(item) = self.store.outbox_item(seq).await? else {
            return Err(StoreError::Missing {
                what: "outbox item",
                key: seq.to_string(),
            });
        };
        match item.status {
            OutboxStatus::Sent => Ok(Retried::Sent),
            OutboxStatus::Pending if self.backoffs.wake(seq) => Ok(Retried::Woken),
            OutboxStatus::Pending => Ok(Retried::Underway),
            OutboxStatus::Failed => {
                let item = self.store.requeue_delivery(seq).await?;
                tracing::info!(seq, "delivery retried by an operator");
                self.enqueue(vec![item]);
                Ok(Retried::Requeued)
            }
        }
    }

    /// An operator drops outbox item `seq`, stuck or failing: it is given up on (kept for
    /// inspection as failed, with why) and a backoff it waits out ends, so its lane goes on.
    /// Whether it was pending; an item sent or given up on already is left as it is.
    pub(crate) async fn drop_item(&self, seq: u64) -> Result<bool, StoreError> {
        let Some(item) = self.store.outbox_item(seq).await? else {
            return Err(StoreError::Missing {
                what: "outbox item",
                key: seq.to_string(),
            });
        };
        if item.status != OutboxStatus::Pending {
            return Ok(false);
        }
        self.store
            .delivery_failed(seq, DROPPED, true, crate::now_ms())
            .await?;
        tracing::info!(seq, "delivery dropped by an operator");
        self.backoffs.wake(seq);
        Ok(true)
    }

    /// The enabled channel called `name` (the first segment of a conversation key), e.g. to
    /// fetch a message's attachments through it.
    pub(crate) fn channel(&self, name: &str) -> Option<Arc<dyn Channel>> {
        self.channels.get(name).cloned()
    }

    /// Queues items for delivery, each on its conversation's lane.
    pub(crate) fn enqueue(&self, items: Vec<OutboxItem>) {
        for item in items {
            let key = item.message.conversation.as_str().to_owned();
            self.lanes.push(&key, item);
        }
    }
}

/// The error an item dropped by an operator is given up with.
const DROPPED: &str = "dropped by an operator";

/// What delivering one item works with.
struct Delivering<'a> {
    store: &'a dyn OutboxStore,
    channels: &'a HashMap<String, Arc<dyn Channel>>,
    files: &'a ReplyFiles,
    health: &'a ChannelHealth,
    backoffs: &'a Backoffs,
}

impl Delivering<'_> {
    async fn deliver(&self, policy: RetryPolicy, stop: &CancellationToken, mut item: OutboxItem) {
        let Self {
            store,
            channels,
            files,
            health,
            backoffs,
        } = *self;
        let channel_name = item.message.conversation.channel().to_owned();
        let Some(channel) = channels.get(&channel_name) else {
            let error = format!("channel `{channel_name}` is not enabled");
            tracing::error!(seq = item.seq, %error, "cannot deliver");
            if let Err(e) = store
                .delivery_failed(item.seq, &error, true, crate::now_ms())
                .await
            {
                tracing::error!(seq = item.seq, error = %e, "cannot record delivery failure");
            }
            return;
        };
        let channel_label = channel.name();
        loop {
            metrics::counter!("antler_delivery_attempts_total", "channel" => channel_label)
                .increment(1);
            // Each attempt is a span in the trace of the message the reply answers.
            let span = tracing::info_span!(
                "delivery",
                channel = channel_label,
                seq = item.seq,
                attempt = item.attempts + 1,
                parts = tracing::field::Empty,
                outcome = tracing::field::Empty,
            );
            item.trace.adopt(&span);
            let sent = send_parts(store, channel.as_ref(), files, &mut item)
                .instrument(span.clone())
                .await;
            span.record("parts", item.parts.len());
            span.record(
                "outcome",
                match &sent {
                    Ok(()) => "sent",
                    Err(SendError::Store(_)) => "not_recorded",
                    Err(SendError::Channel(e)) if e.is_retryable() => "retryable_error",
                    Err(SendError::Channel(_)) => "error",
                },
            );
            drop(span);
            let error = match sent {
                Ok(()) => {
                    health.delivered(channel_label);
                    return;
                }
                Err(SendError::Store(e)) => {
                    // Sent but not recorded: it may be sent again after a restart.
                    tracing::error!(seq = item.seq, error = %e, "cannot record delivery");
                    return;
                }
                Err(SendError::Channel(error)) => error,
            };
            metrics::counter!("antler_delivery_failures_total", "channel" => channel_label)
                .increment(1);
            health.failed(channel_label, &error);
            let attempts = item.attempts + 1;
            let give_up = !error.is_retryable() || attempts >= policy.max_attempts;
            match store
                .delivery_failed(item.seq, &error.to_string(), give_up, crate::now_ms())
                .await
            {
                Ok(updated) => item = updated,
                Err(e) => {
                    tracing::error!(seq = item.seq, error = %e, "cannot record delivery failure");
                    return;
                }
            }
            if give_up {
                tracing::error!(seq = item.seq, channel = channel_label, attempts, %error, "delivery failed for good");
                metrics::counter!("antler_delivery_abandoned_total", "channel" => channel_label)
                    .increment(1);
                return;
            }
            let wait = match error {
                ChannelError::RateLimited { retry_after } => {
                    retry_after.max(policy.backoff(attempts))
                }
                _ => policy.backoff(attempts),
            };
            tracing::warn!(seq = item.seq, channel = channel_label, attempts, ?wait, %error, "delivery failed; retrying");
            let woken = backoffs.waiting(item.seq, wait);
            let stopped = tokio::select! {
                () = tokio::time::sleep(wait) => false,
                () = woken.notified() => false,
                // Still pending in the store: delivered after the restart.
                () = stop.cancelled() => true,
            };
            backoffs.done(item.seq);
            if stopped {
                return;
            }
            // An operator may have dropped it meanwhile.
            match store.outbox_item(item.seq).await {
                Ok(Some(current)) if current.status == OutboxStatus::Pending => item = current,
                Ok(_) => return,
                Err(e) => {
                    tracing::error!(seq = item.seq, error = %e, "cannot read the delivery back");
                    return;
                }
            }
        }
    }
}

/// Why [`send_parts`] stopped.
enum SendError {
    Channel(ChannelError),
    Store(StoreError),
}

/// The text a channel renders: the reply's, plus a line per file (`📎 report.csv (12 KB)`)
/// when the channel does not send files itself, so the user still learns they exist.
fn text_with_file_names(message: &OutboundMessage, sends_files: bool) -> String {
    if sends_files || message.files.is_empty() {
        return message.text.clone();
    }
    let mut text = message.text.trim_end().to_owned();
    if !text.is_empty() {
        text.push_str("\n\n");
    }
    let lines: Vec<String> = message
        .files
        .iter()
        .map(|file| format!("📎 {} ({})", file.file_name(), human_size(file.size)))
        .collect();
    text.push_str(&lines.join("\n"));
    text
}

/// One platform message of a reply, in the order they are sent.
enum Planned<'a> {
    /// A part of the text.
    Text(&'a str),
    /// A file, on a channel that sends files.
    File(&'a OutboundFile),
    /// A part of a prompt, with its buttons on the last.
    Prompt(&'a str, &'a [Button]),
}

/// Sends the parts of `item` not sent yet, recording each as it goes, so a retry never sends
/// a part twice. The first part replaces the turn's draft when there is one (an edit); if the
/// draft is gone, it is sent as a new message. The reply's files follow its text, one part
/// each, on channels that send files; a file that can never be sent (gone, refused by the
/// platform) is logged and skipped, so it does not hold back the files after it. Its prompts
/// come last, each its own messages, with its buttons under its last part on channels that
/// show buttons.
async fn send_parts(
    store: &dyn OutboxStore,
    channel: &dyn Channel,
    files: &ReplyFiles,
    item: &mut OutboxItem,
) -> Result<(), SendError> {
    let message = &item.message;
    let capabilities = channel.capabilities();
    let text = text_with_file_names(message, capabilities.files);
    let parts = channel.render(&text).map_err(SendError::Channel)?;
    let prompts = message
        .prompts
        .iter()
        .map(|prompt| {
            let buttons: &[Button] = if capabilities.buttons {
                &prompt.buttons
            } else {
                &[]
            };
            Ok((channel.render(&prompt.text)?, buttons))
        })
        .collect::<Result<Vec<_>, ChannelError>>()
        .map_err(SendError::Channel)?;
    let mut plan: Vec<Planned<'_>> = parts.iter().map(|body| Planned::Text(body)).collect();
    if capabilities.files {
        plan.extend(message.files.iter().map(Planned::File));
    }
    for (bodies, buttons) in &prompts {
        let last = bodies.len().saturating_sub(1);
        plan.extend(
            bodies
                .iter()
                .enumerate()
                .map(|(i, body)| Planned::Prompt(body, if i == last { buttons } else { &[] })),
        );
    }
    if parts.is_empty() && prompts.is_empty() {
        return Err(SendError::Channel(ChannelError::Permanent(
            "the answer is empty".to_owned(),
        )));
    }
    let total = plan.len();
    // The item as the store has it after the last part recorded here; `item` itself, which
    // the plan borrows, is replaced once the parts are sent.
    let mut recorded = None;
    for index in item.parts.len()..total {
        let receipt = match plan.get(index) {
            Some(Planned::Text(body)) => {
                send_text(
                    channel,
                    item,
                    Part {
                        index,
                        body,
                        buttons: &[],
                    },
                )
                .await?
            }
            Some(Planned::File(file)) => send_file(channel, files, item, index, file).await?,
            Some(Planned::Prompt(body, buttons)) => channel
                .send(
                    message,
                    Part {
                        index,
                        body,
                        buttons,
                    },
                )
                .await
                .map_err(SendError::Channel)?,
            None => break,
        };
        let complete = index + 1 == total;
        recorded = Some(
            store
                .part_delivered(item.seq, receipt, complete, crate::now_ms())
                .await
                .map_err(SendError::Store)?,
        );
    }
    if let Some(recorded) = recorded {
        *item = recorded;
    }
    Ok(())
}

/// Sends file `file` of `item` as part `index`: opened and checked here, then handed to the
/// channel. A file that is no longer what was presented (gone, a link, a hard link, too large)
/// is not sent; a note in the chat says so in its place. A file the platform refuses for good
/// is logged and skipped, so it does not hold back the files after it.
async fn send_file(
    channel: &dyn Channel,
    files: &ReplyFiles,
    item: &OutboxItem,
    index: usize,
    file: &OutboundFile,
) -> Result<Receipt, SendError> {
    let content = match files.open(&item.message.thread_id, file).await {
        Ok(content) => content,
        Err(refused) => {
            tracing::warn!(seq = item.seq, file = %file.name, reason = %refused, "a file of the reply is not sent");
            metrics::counter!("antler_delivery_files_refused_total").increment(1);
            let note = format!(
                "⚠️ {} was not sent: it changed after it was presented (it {refused}).",
                file.file_name()
            );
            let rendered = channel.render(&note).map_err(SendError::Channel)?;
            let Some(body) = rendered.first() else {
                return Ok(Receipt {
                    platform_message_id: String::new(),
                });
            };
            return channel
                .send(
                    &item.message,
                    Part {
                        index,
                        body,
                        buttons: &[],
                    },
                )
                .await
                .map_err(SendError::Channel);
        }
    };
    match channel.send_file(&item.message, file, content).await {
        Ok(receipt) => Ok(receipt),
        Err(e) if e.is_retryable() => Err(SendError::Channel(e)),
        Err(e) => {
            tracing::warn!(seq = item.seq, error = %e, "a file of the reply cannot be sent; skipped");
            metrics::counter!("antler_delivery_files_skipped_total").increment(1);
            // Recorded with no platform id: skipped, never tried again.
            Ok(Receipt {
                platform_message_id: String::new(),
            })
        }
    }
}

/// Sends one text part: the first replaces the draft when there is one.
async fn send_text(
    channel: &dyn Channel,
    item: &OutboxItem,
    part: Part<'_>,
) -> Result<Receipt, SendError> {
    match item.draft.as_ref().filter(|_| part.index == 0) {
        Some(draft) => match channel.edit(&item.message, draft, part).await {
            Ok(()) => Ok(draft.clone()),
            Err(e) if e.is_retryable() => Err(SendError::Channel(e)),
            Err(e) => {
                tracing::warn!(seq = item.seq, error = %e, "the draft cannot be edited; sending the answer anew");
                channel
                    .send(&item.message, part)
                    .await
                    .map_err(SendError::Channel)
            }
        },
        None => channel
            .send(&item.message, part)
            .await
            .map_err(SendError::Channel),
    }
}

#[cfg(test)]
mod tests;
