//! Ingress: dedupe → inbox → queue → durable → ack, then the dispatcher.
//!
//! [`Ingress::accept`] answers only after the event is durably in the inbox (or recognised as a
//! redelivery), so an acknowledged message is never lost. Accepting is done by one task, the
//! acceptor, not by the request's handler: once an event is handed over, it is stored, queued
//! and synced whether or not the client that sent it waits for the answer (a handler future is
//! dropped when its client hangs up).
//!
//! The acceptor takes every event waiting at that moment and stores them all in one durable
//! write: each write costs the store a log write and a sync of its own, so batching is what
//! lets accepting keep up with the HTTP edge (the events arriving meanwhile form the next
//! batch). It then queues the new items in the order the inbox numbered them (being the only
//! writer of the inbox, that order is per conversation the arrival order) and answers the
//! batch. A redelivery is answered only after its original was stored and queued; if a write
//! fails after the store kept part of it, what it kept is queued all the same. Accepted items go to the [`Dispatcher`]: one turn at a time per conversation, in
//! inbox order, under a global limit on running turns. The backlog (items accepted and not yet
//! finished) is bounded; when it is full, nothing is stored and the caller is told to retry
//! later.

pub(crate) mod access;
pub(crate) mod approvals;
pub(crate) mod attachments;
pub(crate) mod commands;
mod dispatcher;
pub(crate) mod pairing;
mod replicas;
mod scheduled;
mod turn;

pub(crate) use dispatcher::{Dispatcher, RunTurn};
pub(crate) use turn::{TurnRunner, TurnSettings};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use antler_channel::{Channel, ChatMove, InboundEvent, Press};
use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::{EventHub, Subscription};
use crate::health::ChannelHealth;
use crate::store::{Accept, Accepted, InboxItem, Store, StoreError, ThreadChoice};
use crate::telemetry::TraceContext;
use access::{Access, Admit};
use commands::Command;
use pairing::Pairing;
use tracing::Instrument;

/// How long a client is asked to wait when the backlog is full.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most events stored in one transaction.
const MAX_BATCH: usize = 256;

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
    /// The author may not use the bot and was refused within the last hour: acknowledge the
    /// message, nothing was stored.
    #[error("not allowed to use this bot")]
    Dropped,
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
    dispatcher: Dispatcher,
    queued: Arc<Queued>,
    backlog_limit: usize,
    dedupe_ttl: Duration,
    access: Arc<Access>,
    pairing: Option<Arc<Pairing>>,
    health: ChannelHealth,
    stop: CancellationToken,
    acceptor: mpsc::UnboundedSender<Request>,
    /// Read for follow-ups (is the bot part of their conversation?); written by the acceptor.
    store: Arc<dyn Store>,
    /// Decides what a button press asks (an approval's Approve or Deny).
    approvals: Arc<approvals::Approvals>,
    /// Runs turns (kept for [`Ingress::share_work`]).
    runner: TurnRunner,
    /// Set by [`Ingress::share_work`].
    shared: Arc<OnceLock<replicas::Accepted>>,
}

/// An [`Ingress`] that may be gone.
#[derive(Debug, Clone)]
pub(crate) struct WeakIngress(std::sync::Weak<Inner>);

impl WeakIngress {
    pub(crate) fn upgrade(&self) -> Option<Ingress> {
        self.0.upgrade().map(|inner| Ingress { inner })
    }
}

/// An event handed to the acceptor, and how to answer it.
#[derive(Debug)]
struct Request {
    accept: Accept,
    reply: Reply,
}

/// Where an accept's answer goes, with the backlog slot it holds.
#[derive(Debug)]
struct Reply {
    subscribe: bool,
    answer: oneshot::Sender<Result<Admission, IngressError>>,
    slot: Slot,
}

/// A reserved place in the backlog: kept by a new item, given back when dropped otherwise (a
/// redelivery, a failure, even a panic).
#[derive(Debug)]
struct Slot {
    backlog: Arc<AtomicUsize>,
    kept: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.kept {
            self.backlog.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What the acceptor needs.
struct Acceptor {
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    runner: TurnRunner,
    hub: EventHub,
    queued: Arc<Queued>,
    /// With a store shared by replicas: where new items go instead of the dispatcher
    /// ([`replicas`]).
    shared: Arc<OnceLock<replicas::Accepted>>,
}

/// What has been queued to run: the backlog it holds and where the inbox stands.
#[derive(Debug)]
struct Queued {
    /// Items accepted and not yet finished (and requests holding a slot for one).
    backlog: Arc<AtomicUsize>,
    /// One past the highest inbox seq queued so far.
    next: AtomicU64,
}

impl Queued {
    /// Notes that item `seq` was queued.
    fn queued(&self, seq: u64) {
        self.next.fetch_max(seq.saturating_add(1), Ordering::SeqCst);
    }

    /// Queues items found in the inbox (at start, or kept by a failed accept).
    fn recover(&self, dispatcher: &Dispatcher, items: Vec<InboxItem>) {
        self.backlog.fetch_add(items.len(), Ordering::SeqCst);
        metrics::gauge!("antler_inbox_depth").increment(items.len() as f64);
        for item in items {
            self.queued(item.seq);
            dispatcher.push(item.event.conversation.as_str(), item.seq);
        }
    }
}

/// Settings of the ingress.
#[derive(Debug, Clone)]
pub(crate) struct IngressSettings {
    pub(crate) backlog_limit: usize,
    pub(crate) dedupe_ttl: Duration,
    pub(crate) max_concurrent_turns: usize,
    /// Who may talk to the bot on each channel.
    pub(crate) access: Arc<Access>,
    /// DM pairing, for the refusals a channel answers at once (`None`: never).
    pub(crate) pairing: Option<Arc<Pairing>>,
    /// Each platform channel's health, which accepting feeds.
    pub(crate) health: ChannelHealth,
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
        let queued = Arc::new(Queued {
            backlog: Arc::clone(&backlog),
            next: AtomicU64::new(0),
        });
        let approvals = runner.approvals();
        let queue: Arc<dyn turn::QueueView> = Arc::new(dispatcher.clone());
        runner.attach_queue(Arc::downgrade(&queue));
        let (acceptor, requests) = mpsc::unbounded_channel();
        // Ends when the last handle to this ingress is dropped.
        let shared = Arc::new(OnceLock::new());
        tokio::spawn(
            Acceptor {
                store: Arc::clone(&store),
                dispatcher: dispatcher.clone(),
                runner: runner.clone(),
                hub,
                queued: Arc::clone(&queued),
                shared: Arc::clone(&shared),
            }
            .run(requests),
        );
        Self {
            inner: Arc::new(Inner {
                dispatcher,
                queued,
                backlog_limit: settings.backlog_limit,
                dedupe_ttl: settings.dedupe_ttl,
                access: Arc::clone(&settings.access),
                pairing: settings.pairing.clone(),
                health: settings.health.clone(),
                store,
                stop,
                acceptor,
                approvals,
                runner,
                shared,
            }),
        }
    }

    /// Shares the work with other replicas of a shared store
    /// ([`crate::store::ReplicaStore`]): from here, accepted items are queued by the
    /// conversation's holder, and the work of conversations nobody holds is adopted (its
    /// replies through `delivery`), until `stop`. Subagent tasks of gone replicas fail with
    /// `interrupted`. Called once, before intake starts.
    pub(crate) fn share_work(
        &self,
        delivery: crate::delivery::Delivery,
        interrupted: &'static str,
        stop: CancellationToken,
    ) {
        let inner = &self.inner;
        let (work, accepted, receiver) = replicas::ReplicaWork::new(
            Arc::clone(&inner.store),
            inner.dispatcher.clone(),
            Arc::clone(&inner.queued),
            inner.runner.clone(),
            delivery,
            interrupted,
            inner.pairing.clone(),
        );
        if inner.shared.set(accepted).is_ok() {
            tokio::spawn(work.run(receiver, stop));
        }
    }

    /// A handle that does not keep the ingress alive (the approvals service holds one: the
    /// ingress owns the runner, which owns the service).
    pub(crate) fn downgrade(&self) -> WeakIngress {
        WeakIngress(Arc::downgrade(&self.inner))
    }

    /// Accepts antler's own item resuming a decided approval (`approvals`): stored and
    /// queued like a message, deduplicated by its event id, without the access check (the
    /// requester was admitted when they asked).
    pub(crate) async fn resume(&self, event: InboundEvent) -> Result<Admission, IngressError> {
        if self.inner.stop.is_cancelled() {
            return Err(IngressError::ShuttingDown);
        }
        self.admit(event, false).await
    }

    /// Answers a press of one of the bot's buttons on `channel`: decides what it asks (an
    /// approval's decision is stored once, whoever presses again), then has the channel show
    /// the presser the outcome and replace the button's message. The answer is the body the
    /// press's request is answered with ([`Channel::answer_press`]). A failure to answer is
    /// logged: the decision stands, and a press delivered again answers again.
    pub(crate) async fn press(
        &self,
        channel: &dyn Channel,
        press: &Press,
    ) -> Option<serde_json::Value> {
        metrics::counter!("antler_button_presses_total", "channel" => channel.name()).increment(1);
        let mut press = press.clone();
        // As for a message: the channel's `admins` (and pairing) make an operator.
        press.user.admin = self.inner.access.is_admin(&press.channel, &press.user);
        let answer = commands::approvals::press(&self.inner.approvals, &press).await;
        match channel.answer_press(&press, &answer).await {
            Ok(body) => body,
            Err(e) => {
                tracing::warn!(channel = channel.name(), error = %e, "cannot answer a button press");
                metrics::counter!("antler_button_answers_failed_total", "channel" => channel.name())
                    .increment(1);
                None
            }
        }
    }

    /// Items accepted and not yet finished.
    pub(crate) fn backlog(&self) -> usize {
        self.inner.queued.backlog.load(Ordering::SeqCst)
    }

    /// Turns running now.
    pub(crate) fn running(&self) -> usize {
        self.inner.dispatcher.running()
    }

    /// Each platform channel's health.
    pub(crate) fn health(&self) -> &ChannelHealth {
        &self.inner.health
    }

    /// Requeues what was accepted before a restart (pending or interrupted), in arrival order.
    pub(crate) fn recover(&self, items: Vec<InboxItem>) {
        self.inner.queued.recover(&self.inner.dispatcher, items);
    }

    /// Accepts one event: access check, dedupe + inbox, queue its turn, sync; then answers.
    /// Once handed to the acceptor, the event is accepted even if the caller stops waiting.
    /// An author who may not use the bot is accepted as a refusal, or [`IngressError::Dropped`]
    /// when refused within the last hour ([`access`]).
    pub(crate) async fn accept(
        &self,
        mut event: InboundEvent,
        subscribe: bool,
    ) -> Result<Admission, IngressError> {
        let inner = &self.inner;
        if inner.stop.is_cancelled() {
            return Err(IngressError::ShuttingDown);
        }
        inner.health.received(&event.channel);
        let moved_from = self.moved_from(&mut event).await?;
        let moved_from = moved_from.as_deref();
        if event.follow_up {
            // Not addressed: it runs only where the bot was addressed before, and an author who
            // may not use the bot gets no refusal for talking to someone else.
            let known = inner
                .store
                .conversation(event.conversation.as_str())
                .await
                .map_err(IngressError::Store)?
                .is_some();
            return match inner.access.check(&mut event, moved_from) {
                Admit::Run if known => self.admit(event, subscribe).await,
                _ => Err(IngressError::Dropped),
            };
        }
        match inner.access.check(&mut event, moved_from) {
            Admit::Run => self.admit(event, subscribe).await,
            Admit::Drop => Err(IngressError::Dropped),
            Admit::Refuse => {
                let admitted = self.admit(event.clone(), subscribe).await;
                // No new refusal was stored (a failure, or a redelivery of one already
                // answered): the next message is the one to refuse.
                if admitted.as_ref().map_or(true, |admission| !admission.new) {
                    inner.access.forget(&event);
                }
                admitted
            }
        }
    }

    /// The chat a group `event`'s chat continues, when the access rules would refuse it as it
    /// is: that chat is allowed where the old one was ([`Ingress::move_chat`]). An author who
    /// wrote as the chat itself (an anonymous admin) was the old chat too. The move is kept on
    /// the chat's own conversation, `<channel>:<chat>` (a topic's messages live in others).
    async fn moved_from(&self, event: &mut InboundEvent) -> Result<Option<String>, IngressError> {
        let inner = &self.inner;
        let Some(chat) = event.chat.as_deref().filter(|_| event.group) else {
            return Ok(None);
        };
        if inner.access.admits(event) {
            return Ok(None);
        }
        let key = format!("{}:{chat}", event.channel);
        let Some(old) = inner
            .store
            .conversation(&key)
            .await?
            .and_then(|record| record.moved_from_chat)
        else {
            return Ok(None);
        };
        if event.user.id == chat {
            event.user.aliases.push(old.clone());
        }
        Ok(Some(old))
    }

    /// Moves a chat's conversation where the platform says the chat went (a group upgraded to
    /// a supergroup): the new chat goes on with the old one's thread and is allowed where the
    /// old one was; the memory of the chat itself (an anonymous admin writes as the group, so
    /// the old chat id was a memory key) moves too. Nothing of the old chat is lost: its
    /// records stay. *Durable* when it returns; doing it twice changes nothing.
    pub(crate) async fn move_chat(&self, chat_move: &ChatMove) -> Result<(), IngressError> {
        let store = &self.inner.store;
        store.move_conversation(chat_move).await?;
        let channel = chat_move.to.channel();
        let from = format!("{channel}:{}", chat_move.from_chat);
        let to = format!("{channel}:{}", chat_move.to_chat);
        if let Some(doc) = store.memory(&from).await? {
            store
                .update_memory(&to, &mut |current| current.or_else(|| Some(doc.clone())))
                .await?;
            store.clear_memory(&from, &[]).await?;
        }
        tracing::info!(
            from = %chat_move.from,
            to = %chat_move.to,
            "a chat moved; its conversation, access and memory follow it"
        );
        metrics::counter!("antler_chat_moves_total", "channel" => channel.to_owned()).increment(1);
        Ok(())
    }

    /// The refusal text for `event` when its author may not use the bot (their pairing code
    /// where pairing applies), checked for a channel that refuses at once instead of storing
    /// a refusal; `None` lets it through (an admin marked as such).
    pub(crate) async fn refusal(&self, event: &mut InboundEvent) -> Option<String> {
        if self.inner.access.allows(event) {
            return None;
        }
        Some(
            pairing::refusal(self.inner.pairing.as_deref(), event)
                .await
                .0,
        )
    }

    /// Hands an event that passed the access check to the acceptor and waits for its answer.
    /// Its trace begins here: the `accept` span's context is stored with the inbox item.
    async fn admit(&self, event: InboundEvent, subscribe: bool) -> Result<Admission, IngressError> {
        let span = tracing::info_span!(
            "accept",
            channel = %event.channel,
            conversation = %event.conversation,
            trace = tracing::field::Empty,
        );
        let trace = TraceContext::of_span(&span);
        span.record("trace", tracing::field::display(trace.trace_hex()));
        self.admit_traced(event, subscribe, trace)
            .instrument(span)
            .await
    }

    async fn admit_traced(
        &self,
        event: InboundEvent,
        subscribe: bool,
        trace: TraceContext,
    ) -> Result<Admission, IngressError> {
        let inner = &self.inner;
        let reserved = inner.queued.backlog.fetch_add(1, Ordering::SeqCst);
        let slot = Slot {
            backlog: Arc::clone(&inner.queued.backlog),
            kept: false,
        };
        if reserved >= inner.backlog_limit {
            metrics::counter!("antler_ingress_overloaded_total").increment(1);
            return Err(IngressError::Overloaded {
                limit: inner.backlog_limit,
            });
        }
        // A refused author's `/new` must not start a fresh thread for a shared conversation.
        let thread = match commands::parse(&event.text) {
            Some(Command::New) if !event.refused => ThreadChoice::Fresh,
            _ => ThreadChoice::Current,
        };
        let (answer, answered) = oneshot::channel();
        let request = Request {
            accept: Accept {
                dedupe_ttl_ms: u64::try_from(inner.dedupe_ttl.as_millis()).unwrap_or(u64::MAX),
                trace,
                now_ms: crate::now_ms(),
                event,
                thread,
            },
            reply: Reply {
                subscribe,
                answer,
                slot,
            },
        };
        if inner.acceptor.send(request).is_err() {
            return Err(IngressError::ShuttingDown);
        }
        answered
            .await
            .map_err(|_| IngressError::Internal("the acceptor stopped".to_owned()))?
    }
}

impl Acceptor {
    /// Takes whatever is waiting, stores it in one durable write, queues the new items in
    /// inbox order and answers; until every sender is gone. A panic while handling a
    /// batch fails that batch's requests (their slots go back) and the acceptor goes on.
    async fn run(self, mut requests: mpsc::UnboundedReceiver<Request>) {
        let mut batch = Vec::new();
        while requests.recv_many(&mut batch, MAX_BATCH).await > 0 {
            let requests: Vec<Request> = std::mem::take(&mut batch);
            metrics::histogram!("antler_accept_batch_size").record(requests.len() as f64);
            let handled = std::panic::AssertUnwindSafe(self.accept_batch(requests))
                .catch_unwind()
                .await;
            if handled.is_err() {
                tracing::error!("accepting a batch panicked; its requests failed");
                metrics::counter!("antler_accept_panics_total").increment(1);
            }
        }
    }

    async fn accept_batch(&self, requests: Vec<Request>) {
        let (accepts, replies): (Vec<Accept>, Vec<Reply>) =
            requests.into_iter().map(|r| (r.accept, r.reply)).unzip();
        let shared = self.shared.get();
        // With replicas, the conversations' holders queue what was stored, even after a
        // failed write that kept some of it.
        let conversations: Vec<String> = match shared {
            Some(_) => accepts
                .iter()
                .map(|a| a.event.conversation.as_str().to_owned())
                .collect(),
            None => Vec::new(),
        };
        // Durable when it returns, redeliveries included (their originals were stored by this
        // or an earlier batch): no answer gets ahead of its data. Requests arriving meanwhile
        // wait for the next batch, so one sync serves as many of them as are waiting.
        match self.store.accept_batch(accepts).await {
            Ok(outcomes) => {
                for (mut reply, outcome) in replies.into_iter().zip(outcomes) {
                    let admission = self.admit(&mut reply, outcome);
                    // A caller that stopped waiting is fine: its event is stored and queued.
                    let _ = reply.answer.send(Ok(admission));
                }
                if let Some(shared) = shared {
                    shared.send(conversations);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "accepting failed");
                for reply in replies {
                    let _ = reply.answer.send(Err(IngressError::Store(e.clone())));
                }
                match shared {
                    Some(shared) => shared.send(conversations),
                    None => self.queue_what_was_kept().await,
                }
            }
        }
    }

    /// After a failed accept: the store may have kept part of the batch anyway (its sync
    /// failed after the write). What it kept runs, so that a redelivery, answered as a
    /// duplicate, gets its reply. The acceptor is the only writer of the inbox, so the items
    /// past the last one queued are exactly those.
    async fn queue_what_was_kept(&self) {
        let inbox = match self.store.inbox().await {
            Ok(inbox) => inbox,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the inbox; what it kept runs after a restart");
                return;
            }
        };
        let from = self.queued.next.load(Ordering::SeqCst);
        let kept: Vec<InboxItem> = inbox.into_iter().filter(|i| i.seq >= from).collect();
        if !kept.is_empty() {
            tracing::warn!(
                kept = kept.len(),
                "the store kept events it could not acknowledge; they run"
            );
            self.queued.recover(&self.dispatcher, kept);
        }
    }

    /// Queues a new item (keeping its backlog slot) or names the original of a redelivery
    /// (giving the slot back).
    fn admit(&self, reply: &mut Reply, outcome: Accepted) -> Admission {
        match outcome {
            Accepted::Duplicate { thread_id, seq } => {
                metrics::counter!("antler_ingress_duplicates_total").increment(1);
                let events = reply.subscribe.then(|| self.hub.subscribe(&thread_id));
                Admission {
                    thread_id,
                    new: false,
                    seq,
                    events,
                }
            }
            Accepted::New(item) if self.shared.get().is_some() => {
                // Queued by the conversation's holder, maybe another replica: this one's
                // backlog counts what it runs.
                let events = reply.subscribe.then(|| self.hub.subscribe(&item.thread_id));
                Admission {
                    thread_id: item.thread_id,
                    new: true,
                    seq: Some(item.seq),
                    events,
                }
            }
            Accepted::New(item) => {
                reply.slot.kept = true;
                metrics::gauge!("antler_inbox_depth").increment(1.0);
                // Subscribe before the turn is queued, so not even an instant answer is missed.
                let events = reply.subscribe.then(|| self.hub.subscribe(&item.thread_id));
                // A refused author's `/stop` must not stop someone else's turn.
                if !item.event.refused && commands::parse(&item.event.text) == Some(Command::Stop) {
                    // Ahead of the queue: waiting behind the turn it stops would be useless.
                    self.runner.stop(item.event.conversation.as_str(), item.seq);
                }
                self.queued.queued(item.seq);
                self.dispatcher
                    .push(item.event.conversation.as_str(), item.seq);
                Admission {
                    thread_id: item.thread_id,
                    new: true,
                    seq: Some(item.seq),
                    events,
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
