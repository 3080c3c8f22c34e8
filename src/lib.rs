//! # antler
//!
//! A chat-ops agent gateway: platform webhooks in, one durable agent runtime, answers out.
//!
//! ## Layout
//! - [`config`]: the typed TOML configuration, `${ENV}` substitution and validation.
//! - `http`: the axum router (webhooks, the API channel, health, metrics).
//! - `ingress`: dedupe, inbox, the per-conversation dispatcher, commands, access and DM
//!   pairing ([`pairing`] is its CLI).
//! - `delivery`: the outbox and a delivery worker per channel.
//! - `agent`: the runtime (model client, tools, middleware chain), free of HTTP and platforms.
//! - `memory`: long-term memory documents and their update queue.
//! - `schedule`: prompts sent to a conversation on a timetable, through the inbox.
//! - `store`: the `Store` trait and its sled implementation.
//! - `sandbox`: how shell commands are confined; [`main_if_launcher`] is its launcher process.
//! - `beneath`: files opened beneath a folder handle, links refused.
//! - `metrics_catalog`: every Prometheus metric antler emits, described and registered at zero.
//! - [`doctor`], [`chat`], [`logging`], [`cli`]: what the binary's subcommands and setup use.
//! - `fuzzing`: thin entry points into internal parsers for the fuzz targets in `fuzz/` (hidden).
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::single_range_in_vec_init
    )
)]

pub(crate) mod agent;
mod app;
mod beneath;
pub mod chat;
pub mod cli;
pub mod config;
pub(crate) mod delivery;
pub mod doctor;
pub(crate) mod events;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod health;
pub(crate) mod http;
pub(crate) mod ingress;
pub mod init;
mod intake;
pub(crate) mod lanes;
mod live;
pub mod logging;
pub(crate) mod memory;
mod metrics_catalog;
pub(crate) mod opcommands;
pub mod pairing;
pub(crate) mod retry;
pub(crate) mod sandbox;
pub(crate) mod schedule;
pub(crate) mod secret;
pub mod setup;
pub(crate) mod store;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod test_support;
pub(crate) mod units;

pub use app::{AppError, migrate, serve, serve_reloading, store_copy};
pub use sandbox::main_if_launcher;

/// Milliseconds since the Unix epoch (wall clock, for stored timestamps).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
