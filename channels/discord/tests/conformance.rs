//! The channel conformance list (`antler_testkit::conformance`) run against Discord.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use antler_discord::{DiscordChannel, DiscordSettings};
use antler_testkit::discord::{APPLICATION_ID, BOT_TOKEN, Discord, MockDiscord, public_key_hex};

struct Conformance;

#[async_trait::async_trait]
impl antler_testkit::Conformance for Conformance {
    type Platform = Discord;
    type Channel = DiscordChannel;

    async fn channel(api: &MockDiscord, now_ms: fn() -> u64) -> DiscordChannel {
        DiscordChannel::new(
            &DiscordSettings {
                application_id: APPLICATION_ID.to_owned(),
                public_key: public_key_hex(),
                bot_token: BOT_TOKEN.to_owned(),
                api_url: api.uri(),
                allowed_guilds: Vec::new(),
            },
            now_ms,
        )
        .unwrap()
    }
}

antler_testkit::conformance_tests!(Conformance);
