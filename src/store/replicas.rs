//! Several antler processes (replicas) on one store: who runs which conversation.
//!
//! Only a database shared over the network (PostgreSQL) can have replicas. Each one marks
//! itself alive in the store for `store.lease_secs` and renews the mark; a conversation's
//! turns and replies run on the one replica that holds it, for as long as that replica's mark
//! is alive. A replica holds a conversation from its first message there (whichever replica
//! accepted it) until it stops: a clean stop lets go of everything at once, a dead replica's
//! conversations are adopted by the others once its mark runs out, from their last
//! checkpoint. The store refuses to start or finish a turn for a replica that does not hold
//! its conversation ([`StoreError::NotHeld`]), so a replica that stalled past its mark cannot
//! finish a turn its successor runs again.
//!
//! A store one process opens (sled, memory) has nothing to share: [`ReplicaStore::shared`]
//! is false and the other methods are never called.

use tokio::sync::mpsc;

use super::{InboxItem, OutboxItem, StoreError};

/// Work a replica adopted: the unfinished messages and the replies still to deliver of the
/// conversations it took over, each in inbox order.
#[derive(Debug, Default)]
pub(crate) struct Adopted {
    pub(crate) inbox: Vec<InboxItem>,
    pub(crate) outbox: Vec<OutboxItem>,
}

/// Conversations a replica holds after [`ReplicaStore::hold`], and the replies still to
/// deliver of those it took from a replica that is gone (or that nobody held).
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) conversations: Vec<String>,
    pub(crate) replies: Vec<OutboxItem>,
}

/// What replicas sharing a store agree through it.
#[async_trait::async_trait]
pub(crate) trait ReplicaStore: Send + Sync + std::fmt::Debug {
    /// Whether other processes may share this store.
    fn shared(&self) -> bool {
        false
    }

    /// Marks this replica alive for `lease_ms` from now, by the store's clock: `joining`
    /// adds the mark of a process that has just started, otherwise it is extended.
    /// [`StoreError::LeaseLost`] when the mark had run out (or was cleared): the others may
    /// have adopted this replica's conversations, so it must stop. *Durable.*
    async fn mark_alive(&self, lease_ms: u64, joining: bool) -> Result<(), StoreError> {
        let _ = (lease_ms, joining);
        Ok(())
    }

    /// Clears this replica's mark and lets go of its conversations (a clean stop). *Durable.*
    async fn leave(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Takes each of `conversations` that no live replica holds; returns those this replica
    /// holds now, with the pending replies of the ones it took (a replica that died may have
    /// left some: they go out before anything newer). The holders of the others are sent a
    /// notice ([`ReplicaStore::notices`]). *Durable.*
    async fn hold(&self, conversations: &[&str]) -> Result<Held, StoreError> {
        Ok(Held {
            conversations: conversations.iter().map(|c| (*c).to_owned()).collect(),
            replies: Vec::new(),
        })
    }

    /// Takes up to `limit` conversations with work (unfinished messages, replies to deliver)
    /// that no live replica holds, skipping what another replica is taking at the same moment,
    /// and returns their work. Clears the marks that ran out long ago. *Durable.*
    async fn adopt(&self, limit: usize) -> Result<Adopted, StoreError> {
        let _ = limit;
        Ok(Adopted::default())
    }

    /// The unfinished messages of `conversation` numbered after `after`, in inbox order, if
    /// this replica holds it (none otherwise).
    async fn waiting_after(
        &self,
        conversation: &str,
        after: u64,
    ) -> Result<Vec<InboxItem>, StoreError> {
        let _ = (conversation, after);
        Ok(Vec::new())
    }

    /// The conversations this replica holds that have unfinished messages, each with the
    /// highest inbox number waiting: what a lost notice would have named.
    async fn held_waiting(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(Vec::new())
    }

    /// The id of the folder every replica must share (`[store] path`): the one the store
    /// names, or `candidate` if it names none yet (then it does from now on). `None` where
    /// nothing is shared. *Durable.*
    async fn folder_id(&self, candidate: &str) -> Result<Option<String>, StoreError> {
        let _ = candidate;
        Ok(None)
    }

    /// Notices for this replica, one conversation key each: another replica accepted a
    /// message in a conversation this one holds. `None` where nothing is shared. The channel
    /// closes when the store's connection for notices is lost: listen again, and look for
    /// what was missed meanwhile.
    async fn notices(&self) -> Result<Option<mpsc::Receiver<String>>, StoreError> {
        Ok(None)
    }
}
