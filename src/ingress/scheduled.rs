//! Schedule firings into the inbox: the scheduler's [`Enqueue`]. A firing is admitted like a
//! message (the backlog bound, dedupe, inbox order, the durable write before the answer)
//! without the access check: its author is the schedule, which an admin made.

use antler_channel::InboundEvent;

use super::{Ingress, IngressError};
use crate::schedule::{Enqueue, EnqueueError};

#[async_trait::async_trait]
impl Enqueue for Ingress {
    async fn enqueue(&self, event: InboundEvent) -> Result<(), EnqueueError> {
        if self.inner.stop.is_cancelled() {
            return Err(EnqueueError::ShuttingDown);
        }
        match self.admit(event, false).await {
            Ok(_) => Ok(()),
            Err(IngressError::ShuttingDown) => Err(EnqueueError::ShuttingDown),
            Err(e) => Err(EnqueueError::Later(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ingress::access::{Access, AccessRules};
    use crate::ingress::tests::harness_with;
    use crate::store::InboxStore;
    use crate::test_support::event;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_firing_enqueued_twice_runs_once_where_only_others_may_talk() {
        // Only alice may talk on the API: the schedule is no allowed user, and still runs.
        let rules = AccessRules::new(&["alice".to_owned()], &[], &[]);
        let h = harness_with(3, Access::new([("api".to_owned(), rules)]));
        let mut firing = event("ops", "schedule:morning:1764835200000", "morning report");
        firing.user.id = "schedule:morning".to_owned();
        firing.user.admin = true;
        // The second time is the scheduler after a crash that lost the mark, not the firing.
        h.ingress.enqueue(firing.clone()).await.unwrap();
        h.ingress.enqueue(firing).await.unwrap();
        h.until_sent(1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(h.sent(), ["echo: morning report"]);
        assert!(h.store.inbox().await.unwrap().is_empty());

        h.stop.cancel();
        let late = event("ops", "schedule:morning:1764921600000", "morning report");
        assert!(matches!(
            h.ingress.enqueue(late).await,
            Err(EnqueueError::ShuttingDown)
        ));
    }
}
