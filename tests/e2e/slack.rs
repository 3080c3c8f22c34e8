//! Slack end to end: signed Events API and slash-command requests in through
//! `POST /webhooks/slack/{events,commands}`, the real runtime with the mock model, answers out to
//! a mock Slack Web API (`/api/chat.postMessage`, `/api/chat.update`, `/api/auth.test`).

use std::time::{Duration, Instant};

use antler_testkit::now_secs;
use antler_testkit::slack::{
    CHANNEL, MockSlack, SIGNING_SECRET, THREAD, channel_message, fixture, post_event, post_signed,
    signed_headers,
};
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, TestApp, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_is_answered_in_its_thread_once_despite_retries_and_twins() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let mention = fixture("slack_app_mention_thread.json");
    assert_eq!(post_event(&app.base, &mention).await, StatusCode::OK);
    // Slack's retry of the same delivery, and the `message.channels` twin of the same post.
    let (status, _) = post_signed(
        &app.base,
        "events",
        &mention,
        SIGNING_SECRET,
        now_secs(),
        Some(1),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let twin = channel_message(
        "1767225600.000200",
        Some(THREAD),
        "<@U0BOT00001> restart web-api & report",
        "Ev0OPS0000B9",
    );
    assert_eq!(post_event(&app.base, &twin).await, StatusCode::OK);

    let posted = api.wait_for_posts(1).await;
    assert_eq!(posted[0]["channel"], CHANNEL);
    assert_eq!(
        posted[0]["thread_ts"], THREAD,
        "the answer stays in the thread"
    );
    assert_eq!(
        posted[0]["text"], "echo: restart web-api &amp; report",
        "the mention is stripped and the answer is escaped mrkdwn"
    );
    app.wait_idle().await;
    assert_eq!(api.posted().await.len(), 1, "one post, one answer");
    assert_eq!(model.count(), 1);
    // 👀 while it worked, then ✅ in its place, on the user's message.
    let marks = wait_until("the end mark", || async {
        // Each on the user's message in its channel (`reactions` asserts it).
        let marks = api.reactions(CHANNEL, "1767225600.000200").await;
        (marks.len() >= 3).then_some(marks)
    })
    .await;
    let marks: Vec<(&str, &str)> = marks
        .iter()
        .map(|(m, n)| (m.as_str(), n.as_str()))
        .collect();
    assert_eq!(
        marks,
        [
            ("reactions.add", "eyes"),
            ("reactions.add", "white_check_mark"),
            ("reactions.remove", "eyes")
        ]
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_is_answered_and_the_bots_own_echo_is_ignored() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post_event(&app.base, &fixture("slack_message_im.json")).await,
        StatusCode::OK
    );
    let posted = api.wait_for_posts(1).await;
    assert_eq!(posted[0]["channel"], "D0ADA00001");
    assert_eq!(posted[0]["text"], "echo: status payments-api");
    assert_eq!(
        posted[0].get("thread_ts"),
        None,
        "a DM is answered in place"
    );
    assert_eq!(
        post_event(&app.base, &fixture("slack_message_im_own_bot_echo.json")).await,
        StatusCode::OK
    );
    app.wait_idle().await;
    assert_eq!(api.posted().await.len(), 1);
    assert_eq!(model.count(), 1, "the bot's own message ran nothing");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_in_the_bots_thread_is_answered_and_elsewhere_ignored() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    // A thread the bot was never mentioned in: nothing.
    let stray = channel_message(
        "1767225610.000300",
        Some("1767220000.000001"),
        "anyone?",
        "Ev1",
    );
    assert_eq!(post_event(&app.base, &stray).await, StatusCode::OK);
    assert_eq!(
        post_event(&app.base, &fixture("slack_app_mention_thread.json")).await,
        StatusCode::OK
    );
    api.wait_for_posts(1).await;
    let follow_up = channel_message("1767225620.000400", Some(THREAD), "and the db?", "Ev2");
    assert_eq!(post_event(&app.base, &follow_up).await, StatusCode::OK);
    let posted = api.wait_for_posts(2).await;
    assert_eq!(posted[1]["thread_ts"], THREAD);
    assert_eq!(posted[1]["text"], "echo: and the db?");
    app.wait_idle().await;
    assert_eq!(model.count(), 2, "the stray thread ran nothing");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slash_command_is_acknowledged_at_once_and_answered_in_the_channel() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let started = Instant::now();
    let (status, body) = post_signed(
        &app.base,
        "commands",
        fixture("slack_slash_command.form").trim(),
        SIGNING_SECRET,
        now_secs(),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "Slack waits 3 s at most"
    );
    let ack: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ack["response_type"], "ephemeral");
    let posted = api.wait_for_posts(1).await;
    assert_eq!(posted[0]["channel"], CHANNEL);
    assert_eq!(posted[0]["text"], "echo: status payments-api");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_and_challenge_requests_get_their_answers() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let mention = fixture("slack_app_mention_thread.json");
    let (status, _) = post_signed(
        &app.base,
        "events",
        &mention,
        "not-the-secret",
        now_secs(),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = post_signed(
        &app.base,
        "events",
        &mention,
        SIGNING_SECRET,
        now_secs() - 600,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a replayed old request");
    let tampered = mention.replace("restart", "destroy");
    // Signed over the mention, sent with another body.
    let signed = signed_headers(SIGNING_SECRET, now_secs(), mention.as_bytes());
    let status = antler_testkit::post_webhook(
        &app.http,
        &format!("{}/webhooks/slack/events", app.base),
        tampered,
        &signed,
    )
    .await
    .status;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a tampered body");
    let (status, body) = post_signed(
        &app.base,
        "events",
        &fixture("slack_url_verification.json"),
        SIGNING_SECRET,
        now_secs(),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let challenge: Value = serde_json::from_str(&body).unwrap();
    assert!(challenge["challenge"].is_string(), "{body}");
    app.wait_idle().await;
    assert_eq!(model.count(), 0, "nothing ran");
    assert!(api.posted().await.is_empty());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_from_slack_delays_the_answer_and_it_still_arrives_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    api.rate_limit_next_post(1).await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post_event(&app.base, &fixture("slack_message_im.json")).await,
        StatusCode::OK
    );
    let first_try = wait_until("the first attempt", || async {
        api.received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .find(|r| r.url.path().ends_with("/chat.postMessage"))
            .map(|_| Instant::now())
    })
    .await;
    wait_until("the answer delivered", || async {
        (api.posted().await.len() >= 2).then_some(())
    })
    .await;
    assert!(
        first_try.elapsed() >= Duration::from_millis(900),
        "Retry-After was honoured"
    );
    app.wait_idle().await;
    assert_eq!(
        api.posted().await.len(),
        2,
        "one refused attempt, one delivery"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_streams_into_one_message_updated_until_it_is_the_answer() {
    // About 4 seconds of stream; DMs are updated at most once a second.
    let model = MockModel::start(Behaviour::Trickle {
        pieces: 6,
        every: Duration::from_millis(700),
    })
    .await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post_event(&app.base, &fixture("slack_message_im.json")).await,
        StatusCode::OK
    );
    api.wait_for_posts(1).await;
    app.wait_idle().await;
    let posted = api.posted().await;
    assert_eq!(posted.len(), 1, "one message, the draft: {posted:?}");
    let updates = api.calls("chat.update").await;
    assert!(
        updates.len() >= 2,
        "updated while writing, then finished: {updates:?}"
    );
    for update in &updates {
        assert_eq!(update["channel"], "D0ADA00001");
        assert_eq!(update["ts"], "1767229999.000900", "the draft's ts");
    }
    assert_eq!(
        updates.last().unwrap()["text"],
        "echo: status payments-api",
        "the last update is the whole answer"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_ack_and_a_restart_answer_exactly_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockSlack::start().await;
    let rig = ChildRig::new(&model, &api.config(""));
    let mut first = rig.serve().await;
    let mention = fixture("slack_app_mention_thread.json");
    assert_eq!(post_event(&first.base, &mention).await, StatusCode::OK);
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    api.wait_for_posts(1).await;
    // Slack retries the delivery it saw no answer to: recognised.
    let (status, _) = post_signed(
        &second.base,
        "events",
        &mention,
        SIGNING_SECRET,
        now_secs(),
        Some(1),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    second.client.wait_idle().await;
    let posted = api.posted().await;
    assert_eq!(posted.len(), 1, "{posted:?}\n{}", second.log_text());
    assert_eq!(posted[0]["thread_ts"], THREAD);
}
