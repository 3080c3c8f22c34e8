//! Running this replica's share of the work when several replicas share one store
//! (`crate::store::ReplicaStore`).
//!
//! Any replica accepts a message (a load balancer picks one); the conversation's turns run on
//! the replica holding it. So with a shared store the acceptor queues nothing itself: it
//! hands the conversations of what it accepted to [`ReplicaWork`], one task, which holds them
//! (the first replica to accept into a conversation takes it; the others send its holder a
//! notice) and queues what waits in the ones it holds, reading the inbox after the last item
//! it queued there. Being the only one queuing, it keeps each conversation's items in inbox
//! order, whichever replica accepted them and whenever their notices arrive.
//!
//! Every second it also adopts the work of conversations no live replica holds (a replica
//! that died, or stopped), their unfinished messages to the dispatcher and their replies
//! still to deliver to delivery; every five it fails the subagent tasks of replicas that are
//! gone and reads again the users approved through pairing (on any replica), and every three it checks the conversations it holds for items a lost notice named
//! (or that a replica stopped before telling).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::pairing::Pairing;
use super::{Dispatcher, Queued, TurnRunner, commands, commands::Command};
use crate::delivery::Delivery;
use crate::store::{InboxItem, Store};

/// How often to look for conversations nobody holds and for lost notices.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Conversations adopted at most per look.
const ADOPT_AT_ONCE: usize = 64;
/// Every how many looks the tasks of gone replicas are failed.
const FAIL_TASKS_EVERY: u32 = 5;
/// Every how many looks the conversations held are checked for items a lost notice named.
const RECHECK_EVERY: u32 = 3;
/// Every how many looks the record of idle conversations is trimmed.
const TRIM_EVERY: u32 = 600;

/// The shared-store side of an ingress: what the acceptor hands over.
#[derive(Debug, Clone)]
pub(crate) struct Accepted(mpsc::UnboundedSender<Vec<String>>);

impl Accepted {
    /// Conversations into which new messages were accepted.
    pub(super) fn send(&self, conversations: Vec<String>) {
        if !conversations.is_empty() {
            // Gone only while stopping: what was accepted runs on the next start.
            let _ = self.0.send(conversations);
        }
    }
}

/// The task queuing this replica's share of the work; see the module doc.
pub(crate) struct ReplicaWork {
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    queued: Arc<Queued>,
    runner: TurnRunner,
    delivery: Delivery,
    /// The subagent tasks' failure reason when their replica is gone.
    interrupted: &'static str,
    /// Users approved through pairing, which another replica may have approved: read again
    /// now and then.
    pairing: Option<Arc<Pairing>>,
    /// Per conversation held, the last inbox item queued.
    last: HashMap<Arc<str>, u64>,
    /// Conversations to look at again (a store error got in the way).
    again: HashSet<String>,
}

impl ReplicaWork {
    pub(super) fn new(
        store: Arc<dyn Store>,
        dispatcher: Dispatcher,
        queued: Arc<Queued>,
        runner: TurnRunner,
        delivery: Delivery,
        interrupted: &'static str,
        pairing: Option<Arc<Pairing>>,
    ) -> (Self, Accepted, mpsc::UnboundedReceiver<Vec<String>>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let work = Self {
            store,
            dispatcher,
            queued,
            runner,
            delivery,
            interrupted,
            pairing,
            last: HashMap::new(),
            again: HashSet::new(),
        };
        (work, Accepted(sender), receiver)
    }

    /// Runs until `stop`.
    pub(super) async fn run(
        mut self,
        mut accepted: mpsc::UnboundedReceiver<Vec<String>>,
        stop: CancellationToken,
    ) {
        let mut notices = self.listen().await;
        let mut every = tokio::time::interval(LOOK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut looks: u32 = 0;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                Some(conversations) = accepted.recv() => self.hold(conversations).await,
                notice = recv(&mut notices) => match notice {
                    Some(conversation) => self.queue_waiting(&conversation).await,
                    None => {
                        // Lost: listen again; what was missed meanwhile is looked for below.
                        notices = self.listen().await;
                        let held: Vec<Arc<str>> = self.last.keys().cloned().collect();
                        self.again.extend(held.iter().map(|c| c.to_string()));
                    }
                },
                _ = every.tick() => {
                    looks = looks.wrapping_add(1);
                    self.look(looks).await;
                    if notices.is_none() {
                        notices = self.listen().await;
                    }
                }
            }
        }
    }

    async fn listen(&self) -> Option<mpsc::Receiver<String>> {
        match self.store.notices().await {
            Ok(notices) => notices,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for notices from other replicas; looking every second");
                None
            }
        }
    }

    /// Holds the conversations the acceptor stored messages in, and queues their waiting
    /// items; the holders of the others were sent a notice.
    async fn hold(&mut self, conversations: Vec<String>) {
        let keys: Vec<&str> = conversations.iter().map(String::as_str).collect();
        match self.store.hold(&keys).await {
            Ok(held) => {
                // Replies a gone replica left in a conversation taken now go out first.
                self.delivery.enqueue(held.replies);
                for conversation in held.conversations {
                    self.queue_waiting(&conversation).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot hold conversations; trying again");
                self.again.extend(conversations);
            }
        }
    }

    /// Queues the items of `conversation` after the last one queued (if this replica holds
    /// it: the store reads nothing otherwise).
    async fn queue_waiting(&mut self, conversation: &str) {
        let after = self.last.get(conversation).copied().unwrap_or(0);
        match self.store.waiting_after(conversation, after).await {
            Ok(items) => self.queue(items),
            Err(e) => {
                tracing::warn!(conversation, error = %e, "cannot read waiting messages; trying again");
                self.again.insert(conversation.to_owned());
            }
        }
    }

    /// Queues `items` (in inbox order) that were not queued yet.
    fn queue(&mut self, items: Vec<InboxItem>) {
        let fresh: Vec<InboxItem> = items
            .into_iter()
            .filter(|item| {
                let conversation = item.event.conversation.as_str();
                let last = self.last.get(conversation).copied().unwrap_or(0);
                if item.seq <= last {
                    return false;
                }
                match self.last.get_mut(conversation) {
                    Some(last) => *last = item.seq,
                    None => {
                        self.last.insert(Arc::from(conversation), item.seq);
                    }
                }
                true
            })
            .collect();
        for item in &fresh {
            // A refused author's `/stop` must not stop someone else's turn.
            if !item.event.refused && commands::parse(&item.event.text) == Some(Command::Stop) {
                self.runner.stop(item.event.conversation.as_str(), item.seq);
            }
        }
        self.queued.recover(&self.dispatcher, fresh);
    }

    /// Adopts what nobody holds, looks again where an error got in the way, fails gone
    /// replicas' tasks, and forgets idle conversations now and then.
    async fn look(&mut self, looks: u32) {
        match self.store.adopt(ADOPT_AT_ONCE).await {
            Ok(adopted) => {
                if !adopted.inbox.is_empty() || !adopted.outbox.is_empty() {
                    tracing::info!(
                        inbox = adopted.inbox.len(),
                        outbox = adopted.outbox.len(),
                        "adopted conversations no live replica holds"
                    );
                    metrics::counter!("antler_adopted_items_total")
                        .increment((adopted.inbox.len() + adopted.outbox.len()) as u64);
                }
                self.queue(adopted.inbox);
                self.delivery.enqueue(adopted.outbox);
            }
            Err(e) => tracing::warn!(error = %e, "cannot look for conversations to adopt"),
        }
        if looks % RECHECK_EVERY == 0 {
            match self.store.held_waiting().await {
                Ok(held) => {
                    let missed = held.into_iter().filter(|(conversation, newest)| {
                        self.last.get(conversation.as_str()).copied().unwrap_or(0) < *newest
                    });
                    self.again
                        .extend(missed.map(|(conversation, _)| conversation));
                }
                Err(e) => tracing::warn!(error = %e, "cannot check the conversations held"),
            }
        }
        for conversation in std::mem::take(&mut self.again) {
            self.queue_waiting(&conversation).await;
        }
        if looks % FAIL_TASKS_EVERY == 0 {
            match self
                .store
                .fail_unfinished_subagents(self.interrupted, crate::now_ms())
                .await
            {
                Ok(0) => {}
                Ok(failed) => tracing::info!(failed, "failed the tasks of replicas that are gone"),
                Err(e) => tracing::warn!(error = %e, "cannot fail the tasks of gone replicas"),
            }
            if let Some(pairing) = &self.pairing {
                if let Err(e) = pairing.load().await {
                    tracing::warn!(error = %e, "cannot read the users approved through pairing");
                }
            }
        }
        if looks % TRIM_EVERY == 0 {
            let dispatcher = &self.dispatcher;
            self.last
                .retain(|conversation, _| dispatcher.is_busy(conversation));
        }
    }
}

/// The next notice, or never when there is no channel.
async fn recv(notices: &mut Option<mpsc::Receiver<String>>) -> Option<String> {
    match notices {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}
