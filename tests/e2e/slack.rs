//! Slack end to end: signed Events API and slash-command requests in through
//! `POST /webhooks/slack/{events,commands}`, the real runtime with the mock model, answers out to
//! a mock Slack Web API (`/api/chat.postMessage`, `/api/chat.update`, `/api/auth.test`).

use std::time::{Duration, Instant};

use antler_testkit::now_secs;
use antler_testkit::slack::{
    CHANNEL, DM, MockSlack, SIGNING_SECRET, THREAD, bot_message, channel_message, fixture,
    post_event, post_signed, signed_headers,
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

/// Slack, "Responding to slash commands": the answer goes to the command's `response_url`
/// (`{"text", "response_type": "ephemeral"|"in_channel"}`), which posts where the command ran
/// even where the bot is no member; `chat.postMessage` there would fail `not_in_channel`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_command_is_answered_through_its_response_url_privately_unless_configured() {
    let model = MockModel::start(Behaviour::Echo).await;
    for (more, response_type) in [
        ("", "ephemeral"),
        ("slash_response = \"in_channel\"\n", "in_channel"),
    ] {
        let api = MockSlack::start().await;
        // The bot is in no channel: a post there is refused, as Slack does.
        api.refuse_posts_in(CHANNEL, "not_in_channel").await;
        let app = TestApp::spawn(&model, &api.config(more)).await;
        let started = Instant::now();
        let (status, body) = post_signed(
            &app.base,
            "commands",
            &api.slash_command("status payments-api"),
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
        let responses = wait_until("the answer through the response_url", || async {
            let responses = api.responses().await;
            (!responses.is_empty()).then_some(responses)
        })
        .await;
        assert_eq!(responses[0]["text"], "echo: status payments-api");
        assert_eq!(responses[0]["response_type"], response_type, "{more}");
        assert_eq!(responses[0]["replace_original"], false);
        app.wait_idle().await;
        assert_eq!(api.responses().await.len(), 1);
        assert!(api.posted().await.is_empty(), "no chat.postMessage");
        assert!(api.dms_opened().await.is_empty());
        app.shutdown().await;
    }
}

/// A `response_url` answers "up to five times within 30 minutes" (Slack); after that
/// `404 expired_url`. A private answer then reaches the user in a DM, with a note; a public
/// one goes to the channel, and where the bot cannot post there, to the DM too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_response_url_falls_back_to_a_dm_with_a_note() {
    let model = MockModel::start(Behaviour::Echo).await;
    for more in ["", "slash_response = \"in_channel\"\n"] {
        let api = MockSlack::start().await;
        api.expire_response_urls().await;
        api.refuse_posts_in(CHANNEL, "not_in_channel").await;
        let app = TestApp::spawn(&model, &api.config(more)).await;
        let (status, _) = post_signed(
            &app.base,
            "commands",
            &api.slash_command("status payments-api"),
            SIGNING_SECRET,
            now_secs(),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let dm = wait_until("the answer in the DM", || async {
            api.posted()
                .await
                .into_iter()
                .find(|post| post["channel"] == DM)
        })
        .await;
        let text = dm["text"].as_str().unwrap();
        assert!(text.contains(&format!("<#{CHANNEL}>")), "the note: {text}");
        assert!(text.ends_with("echo: status payments-api"), "{text}");
        assert_eq!(api.dms_opened().await, ["U0ADA00001"]);
        app.wait_idle().await;
        assert_eq!(api.responses().await.len(), 1, "tried once: {more}");
        let in_channel = api
            .posted()
            .await
            .iter()
            .filter(|post| post["channel"] == CHANNEL)
            .count();
        assert_eq!(
            in_channel,
            usize::from(!more.is_empty()),
            "a private answer is never tried in the channel: {more}"
        );
        app.shutdown().await;
    }
}

/// A mention answered in a channel the bot was since removed from (`not_in_channel`) or that
/// it cannot see (`channel_not_found`) reaches its user in a DM instead of a log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_bot_cannot_post_where_it_was_asked_goes_to_the_users_dm() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    api.refuse_posts_in(CHANNEL, "channel_not_found").await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post_event(&app.base, &fixture("slack_app_mention_thread.json")).await,
        StatusCode::OK
    );
    let dm = wait_until("the answer in the DM", || async {
        api.posted()
            .await
            .into_iter()
            .find(|post| post["channel"] == DM)
    })
    .await;
    let text = dm["text"].as_str().unwrap();
    assert!(text.contains("where I cannot post"), "{text}");
    assert!(
        text.ends_with("echo: restart web-api &amp; report"),
        "{text}"
    );
    assert_eq!(api.dms_opened().await, ["U0ADA00001"]);
    app.shutdown().await;
}

/// The `response_url` is kept with the accepted command in the store: a crash between the
/// acknowledgement and the answer still answers through it, and the URL (a credential) is
/// never logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_a_slash_command_and_its_answer_still_answers_through_the_response_url() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockSlack::start().await;
    let rig = ChildRig::new(&model, &api.config(""));
    let mut first = rig.serve().await;
    let (status, _) = post_signed(
        &first.base,
        "commands",
        &api.slash_command("status payments-api"),
        SIGNING_SECRET,
        now_secs(),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    let responses = wait_until("the answer through the response_url", || async {
        let responses = api.responses().await;
        (!responses.is_empty()).then_some(responses)
    })
    .await;
    second.client.wait_idle().await;
    assert_eq!(responses[0]["text"], "echo: status payments-api");
    assert_eq!(api.responses().await.len(), 1);
    assert!(api.posted().await.is_empty());
    for log in [first.log_text(), second.log_text()] {
        assert!(
            !log.contains("xYz123"),
            "the response_url was logged:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_and_challenge_requests_get_their_answers() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let mention = fixture("slack_app_mention_thread.json");
    let (status, body) = post_signed(
        &app.base,
        "events",
        &mention,
        "not-the-secret",
        now_secs(),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The 401 names what failed: the Slack signature, not the HTTP API's bearer token.
    let refused: Value = serde_json::from_str(&body).unwrap();
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("channels.slack.signing_secret"),
        "{message}"
    );
    assert!(!message.contains("bearer"), "{message}");
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

/// `allowed_bots` admits classic bots and incoming webhooks, whose posts are
/// `subtype: bot_message` with a `bot_id` and no `user` (Slack's `bot_message` event), by
/// their bot id or their app id; any other bot is still ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_classic_bots_and_incoming_webhooks_are_answered_by_bot_id_or_app_id() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(
        &model,
        &api.config("allowed_bots = [\"B0CLASSIC1\", \"A0HOOK0001\"]\n"),
    )
    .await;
    let posts = [
        bot_message(
            "1767225700.000100",
            "<@U0BOT00001> deploy failed",
            "B0CLASSIC1",
            None,
            "Ev10",
        ),
        bot_message(
            "1767225700.000200",
            "<@U0BOT00001> disk 91%",
            "B0HOOK0001",
            Some("A0HOOK0001"),
            "Ev11",
        ),
        bot_message(
            "1767225700.000300",
            "<@U0BOT00001> hi",
            "B0OTHER01",
            Some("A0OTHER01"),
            "Ev12",
        ),
    ];
    for post in &posts {
        assert_eq!(post_event(&app.base, post).await, StatusCode::OK);
    }
    let posted = api.wait_for_posts(2).await;
    app.wait_idle().await;
    let mut answers: Vec<(String, String)> = api
        .posted()
        .await
        .iter()
        .map(|p| {
            (
                p["thread_ts"].as_str().unwrap_or_default().to_owned(),
                p["text"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    answers.sort();
    assert_eq!(
        answers,
        [
            (
                "1767225700.000100".to_owned(),
                "echo: deploy failed".to_owned()
            ),
            ("1767225700.000200".to_owned(), "echo: disk 91%".to_owned()),
        ],
        "{posted:?}"
    );
    assert_eq!(model.count(), 2, "the unlisted bot ran nothing");
    app.shutdown().await;
}

/// `body` without its `authorizations`, the envelope field that names the bot's user
/// (protocols.md §2): without it the bot's user id is known from `auth.test` alone.
fn without_authorizations(body: &str) -> String {
    let mut envelope: Value = serde_json::from_str(body).unwrap();
    envelope.as_object_mut().unwrap().remove("authorizations");
    envelope.to_string()
}

/// Issue 24, finding 1: until `auth.test` told the bot's user id, a channel `message` that
/// mentions someone (`<@U…>`) in an envelope without `authorizations` may be for the bot: it is
/// answered 503, so Slack retries it (Events API: a non-2xx answer is a failure, `http_error`,
/// retried up to 3 times with `X-Slack-Retry-Num`; protocols.md §2). An `app_mention` names
/// the bot by its type and is handled at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_mention_before_auth_test_answers_is_retried_by_slack_not_lost() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    api.set_auth_test_down(true);
    let app = TestApp::spawn(&model, &api.config("")).await;
    let mention = without_authorizations(&channel_message(
        "1767225700.000300",
        None,
        "<@U0BOT00001> restart web-api",
        "Ev0OPS0000C1",
    ));
    assert_eq!(
        post_event(&app.base, &mention).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "not acknowledged while the bot's user id is unknown"
    );
    let app_mention = without_authorizations(&fixture("slack_app_mention_thread.json"));
    assert_eq!(post_event(&app.base, &app_mention).await, StatusCode::OK);
    let posted = api.wait_for_posts(1).await;
    assert_eq!(posted[0]["thread_ts"], THREAD);
    app.wait_idle().await;
    assert_eq!(
        model.count(),
        1,
        "the channel mention was neither stored nor run"
    );

    api.set_auth_test_down(false);
    // Slack's retry, once antler's retry of auth.test (with backoff) has succeeded.
    wait_until("the retried mention is taken", || async {
        let (status, _) = post_signed(
            &app.base,
            "events",
            &mention,
            SIGNING_SECRET,
            now_secs(),
            Some(1),
        )
        .await;
        (status == StatusCode::OK).then_some(())
    })
    .await;
    let posted = api.wait_for_posts(2).await;
    assert_eq!(posted[1]["channel"], CHANNEL);
    assert_eq!(posted[1]["text"], "echo: restart web-api");
    app.wait_idle().await;
    assert_eq!(api.posted().await.len(), 2, "the mention is answered once");
    assert_eq!(model.count(), 2, "the mention ran once");
    app.shutdown().await;
}
