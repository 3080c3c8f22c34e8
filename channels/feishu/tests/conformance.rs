//! The channel conformance list (`antler_testkit::conformance`) run against Feishu, with an
//! Encrypt Key (every event encrypted and signed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use antler_feishu::{FeishuChannel, FeishuSettings};
use antler_testkit::feishu::{
    APP_ID, APP_SECRET, ENCRYPT_KEY, Feishu, MockFeishu, VERIFICATION_TOKEN,
};

struct Conformance;

#[async_trait::async_trait]
impl antler_testkit::Conformance for Conformance {
    type Platform = Feishu;
    type Channel = FeishuChannel;

    /// As antler starts it: the bot's open_id learned from `bot/v3/info`.
    async fn channel(api: &MockFeishu, now_ms: fn() -> u64) -> FeishuChannel {
        let channel = FeishuChannel::new(
            &FeishuSettings {
                app_id: APP_ID.to_owned(),
                app_secret: APP_SECRET.to_owned(),
                verification_token: VERIFICATION_TOKEN.to_owned(),
                encrypt_key: Some(ENCRYPT_KEY.to_owned()),
                api_url: api.uri(),
                cards: true,
                websocket: false,
            },
            now_ms,
        )
        .unwrap();
        channel.learn_identity().await.unwrap();
        channel
    }
}

antler_testkit::conformance_tests!(Conformance);
