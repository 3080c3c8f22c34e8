//! What each platform channel last did, for `/readyz` and the metrics: when it last received a
//! message, its connection's state where antler holds one (Telegram polling, the Discord
//! Gateway, Slack's Socket Mode, Feishu's long connection), the last delivery error, and
//! whether the platform refuses the bot itself (a revoked token, another instance polling:
//! [`ChannelError::Refused`]), which makes the channel unhealthy until a call succeeds again.
//!
//! Recording is a short lock on a small map, off the hot path's I/O; reading copies it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use antler_channel::ChannelError;
use serde::Serialize;

/// The health of every platform channel. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChannelHealth {
    channels: Arc<Mutex<BTreeMap<String, ChannelState>>>,
}

/// One channel's health, as `/readyz` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ChannelState {
    /// No refusal of the bot stands.
    pub(crate) ok: bool,
    /// The connection antler holds (`connected`, `reconnecting`, `stopped`), or `webhook`
    /// where the platform posts to antler.
    pub(crate) state: &'static str,
    /// Why the platform refuses the bot, while it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) refused: Option<String>,
    /// The last error receiving or delivering, with when (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_error_at_ms: Option<u64>,
    /// When a message last came in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_received_at_ms: Option<u64>,
    /// When an answer was last delivered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_delivered_at_ms: Option<u64>,
}

impl ChannelHealth {
    /// Starts tracking `channel`, received through `state` (`webhook`, or a connection's
    /// first state).
    pub(crate) fn register(&self, channel: &str, state: &'static str) {
        if let Ok(mut channels) = self.channels.lock() {
            channels.entry(channel.to_owned()).or_default();
        }
        self.update(channel, |s| s.state = state);
    }

    /// A message came in on `channel` (nothing for a channel not registered: the API's).
    pub(crate) fn received(&self, channel: &str) {
        let now = crate::now_ms();
        self.update(channel, |s| s.last_received_at_ms = Some(now));
    }

    /// `channel`'s connection is now in `state`; a connection that works clears a refusal.
    pub(crate) fn connection(&self, channel: &str, state: &'static str) {
        self.update(channel, |s| {
            s.state = state;
            if state == "connected" {
                s.refused = None;
            }
        });
    }

    /// An answer went out on `channel`.
    pub(crate) fn delivered(&self, channel: &str) {
        let now = crate::now_ms();
        self.update(channel, |s| {
            s.last_delivered_at_ms = Some(now);
            s.refused = None;
        });
    }

    /// Receiving or delivering on `channel` failed with `error`; a refusal of the bot makes
    /// the channel unhealthy.
    pub(crate) fn failed(&self, channel: &str, error: &ChannelError) {
        let now = crate::now_ms();
        self.update(channel, |s| {
            s.last_error = Some(error.to_string());
            s.last_error_at_ms = Some(now);
            if let ChannelError::Refused(why) = error {
                s.refused = Some(why.clone());
            }
        });
    }

    /// Every tracked channel's state, by name.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, ChannelState> {
        self.channels
            .lock()
            .map(|channels| channels.clone())
            .unwrap_or_default()
    }

    /// Changes a registered channel's state.
    fn update(&self, channel: &str, change: impl FnOnce(&mut ChannelState)) {
        let Ok(mut channels) = self.channels.lock() else {
            return;
        };
        let Some(state) = channels.get_mut(channel) else {
            return;
        };
        change(state);
        let ok = state.refused.is_none();
        // A new state starts not ok, so its first update sets the gauge.
        if ok != state.ok {
            metrics::gauge!("antler_channel_healthy", "channel" => channel.to_owned()).set(if ok {
                1.0
            } else {
                0.0
            });
        }
        state.ok = ok;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_makes_a_channel_unhealthy_until_a_call_works_again() {
        let health = ChannelHealth::default();
        health.received("api");
        assert!(
            health.snapshot().is_empty(),
            "only registered channels are tracked"
        );
        health.register("telegram", "connecting");
        health.connection("telegram", "connected");
        health.received("telegram");
        let state = &health.snapshot()["telegram"];
        assert!(state.ok && state.last_received_at_ms.is_some());
        assert_eq!(state.state, "connected");

        health.failed(
            "telegram",
            &ChannelError::Transient("502 Bad Gateway".into()),
        );
        assert!(
            health.snapshot()["telegram"].ok,
            "a passing failure is not a refusal"
        );
        health.failed(
            "telegram",
            &ChannelError::Refused("the bot token was refused".into()),
        );
        let state = &health.snapshot()["telegram"];
        assert!(!state.ok);
        assert_eq!(state.refused.as_deref(), Some("the bot token was refused"));
        assert_eq!(
            state.last_error.as_deref(),
            Some("refused: the bot token was refused")
        );
        health.connection("telegram", "reconnecting");
        assert!(!health.snapshot()["telegram"].ok);
        health.delivered("telegram");
        let state = &health.snapshot()["telegram"];
        assert!(state.ok && state.refused.is_none() && state.last_error.is_some());
    }
}
