//! Long-term memory: the per-user document and the update queue (DESIGN.md section 6).
