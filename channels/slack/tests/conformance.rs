//! The channel conformance list (`antler_testkit::conformance`) run against Slack.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use antler_slack::{SlackChannel, SlackSettings};
use antler_testkit::slack::{MockSlack, SIGNING_SECRET, Slack, TOKEN};

struct Conformance;

#[async_trait::async_trait]
impl antler_testkit::Conformance for Conformance {
    type Platform = Slack;
    type Channel = SlackChannel;

    /// As antler starts it: the bot's identity learned with `auth.test`.
    async fn channel(api: &MockSlack, now_ms: fn() -> u64) -> SlackChannel {
        let channel = SlackChannel::new(
            &SlackSettings {
                bot_token: TOKEN.to_owned(),
                signing_secret: SIGNING_SECRET.to_owned(),
                api_url: api.api_url(),
                ..SlackSettings::default()
            },
            now_ms,
        )
        .unwrap();
        channel.learn_identity().await.unwrap();
        channel
    }
}

antler_testkit::conformance_tests!(Conformance);
