//! The channel conformance list (`antler_testkit::conformance`) run against Telegram.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use antler_telegram::{TelegramChannel, TelegramSettings};
use antler_testkit::telegram::{MockTelegram, SECRET, TOKEN, Telegram};

struct Conformance;

#[async_trait::async_trait]
impl antler_testkit::Conformance for Conformance {
    type Platform = Telegram;
    type Channel = TelegramChannel;

    /// As antler starts it: the bot's username learned with `getMe`.
    async fn channel(api: &MockTelegram, now_ms: fn() -> u64) -> TelegramChannel {
        let channel = TelegramChannel::new(
            &TelegramSettings {
                bot_token: TOKEN.to_owned(),
                webhook_secret: SECRET.to_owned(),
                api_url: api.uri(),
            },
            now_ms,
        )
        .unwrap();
        channel.learn_identity().await.unwrap();
        channel
    }
}

antler_testkit::conformance_tests!(Conformance);
