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
