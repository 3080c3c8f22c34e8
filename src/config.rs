//! HELPER: configuration.
