//! What antler last learned about the model endpoint: from the probe at start and from every
//! model call since. `/readyz` and `antler doctor` report it; it never fails readiness, since
//! a briefly unreachable model is no reason to take antler out of a load balancer.

use std::sync::{Arc, Mutex};

/// The last known state of the model endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HealthSnapshot {
    /// Whether the endpoint answered at all (a 401 still counts as reachable).
    pub(crate) reachable: bool,
    /// A short description: `ok`, or what went wrong (secrets masked).
    pub(crate) detail: String,
    /// When it was learned, milliseconds since the Unix epoch.
    pub(crate) at_ms: u64,
}

/// Shared, cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct ModelHealth {
    last: Arc<Mutex<Option<HealthSnapshot>>>,
}

impl ModelHealth {
    /// Records an outcome.
    pub(crate) fn record(&self, reachable: bool, detail: impl Into<String>) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(HealthSnapshot {
                reachable,
                detail: detail.into(),
                at_ms: crate::now_ms(),
            });
        }
    }

    /// The last outcome, if any.
    pub(crate) fn snapshot(&self) -> Option<HealthSnapshot> {
        self.last.lock().ok().and_then(|last| last.clone())
    }
}
