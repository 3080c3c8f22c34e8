//! Subagents: the registry record types (the executor comes with a later issue).
