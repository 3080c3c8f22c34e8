//! A title being written: the helper call the title middleware starts when a thread's first
//! run ends, handed out with the run's outputs (`RunOutputs::title`) so the turn runner can
//! finish the turn and send the reply first, then wait for it and write what it brings. Apart
//! from the middleware, so that the run's context can carry it.

use tokio_util::task::AbortOnDropHandle;

use crate::agent::message::TokenUsage;
use crate::agent::thread::ThreadState;

/// What a title call came back with.
#[derive(Debug, Clone, Default)]
pub(crate) struct ModelTitle {
    /// The model's title, cleaned and held to the limits; `None` when the call failed, timed
    /// out or said nothing usable.
    pub(crate) title: Option<String>,
    /// The tokens the call used.
    pub(crate) usage: Option<TokenUsage>,
}

/// The model's title of a new thread, asked for when the thread's first run ended and
/// written after the reply: the thread carries `fallback` meanwhile. Dropping it abandons the
/// call.
#[derive(Debug)]
pub(crate) struct PendingTitle {
    fallback: String,
    call: AbortOnDropHandle<ModelTitle>,
}

impl PendingTitle {
    /// The title `call` will bring; the thread carries `fallback` meanwhile.
    pub(crate) fn new(fallback: String, call: AbortOnDropHandle<ModelTitle>) -> Self {
        Self { fallback, call }
    }

    /// Waits for the call (at most its time limit) and what it brings to the thread.
    pub(crate) async fn wait(self) -> TitleUpdate {
        let Self { fallback, call } = self;
        let model = call.await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the title call ended without an answer; the question stays the title");
            ModelTitle::default()
        });
        TitleUpdate {
            fallback,
            title: model.title,
            usage: model.usage,
        }
    }
}

/// What a finished title call brings to its thread.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TitleUpdate {
    /// The title the thread's first run gave it.
    fallback: String,
    /// The model's title, if it gave one.
    title: Option<String>,
    /// The tokens the call used.
    usage: Option<TokenUsage>,
}

impl TitleUpdate {
    /// Whether it can change a thread: the model gave a title other than the fallback, or the
    /// call used tokens.
    pub(crate) fn changes_anything(&self) -> bool {
        self.usage.is_some() || self.title.as_ref().is_some_and(|t| *t != self.fallback)
    }

    /// Gives `thread` the model's title when it still carries the fallback its first run gave
    /// it (a title set meanwhile is kept), and counts the call's tokens towards the thread.
    /// Returns whether the thread changed.
    pub(crate) fn apply(&self, thread: &mut ThreadState) -> bool {
        let mut changed = false;
        if let Some(title) = &self.title
            && thread.title.as_deref() == Some(self.fallback.as_str())
            && *title != self.fallback
        {
            thread.title = Some(title.clone());
            changed = true;
        }
        if let Some(usage) = &self.usage {
            thread.usage.add(usage);
            changed = true;
        }
        changed
    }
}
