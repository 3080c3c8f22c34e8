//! A value a configuration reload (SIGHUP) may replace while antler runs.
//!
//! Readers take the current value as an `Arc` and keep using it for as long as they need
//! (a run keeps the system prompt it started with); a reload swaps in the next one for
//! whoever reads after it.

use std::sync::{Arc, RwLock};

/// The current value of something a reload may change.
#[derive(Debug)]
pub(crate) struct Live<T: ?Sized>(RwLock<Arc<T>>);

impl<T: ?Sized> Live<T> {
    pub(crate) fn new(value: Arc<T>) -> Self {
        Self(RwLock::new(value))
    }

    /// The value now.
    pub(crate) fn current(&self) -> Arc<T> {
        // A panic while swapping an `Arc` cannot leave it half-written.
        Arc::clone(
            &self
                .0
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// Replaces the value for every later reader.
    pub(crate) fn set(&self, value: Arc<T>) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = value;
    }
}

impl<T: Default> Default for Live<T> {
    fn default() -> Self {
        Self::new(Arc::default())
    }
}

impl Live<str> {
    /// A shared prompt that starts as `text`.
    pub(crate) fn text(text: &str) -> Arc<Self> {
        Arc::new(Self::new(Arc::from(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_keeps_what_it_took_and_later_readers_see_the_new_value() {
        let prompt = Live::text("first");
        let taken = prompt.current();
        prompt.set(Arc::from("second"));
        assert_eq!(&*taken, "first");
        assert_eq!(&*prompt.current(), "second");
    }
}
