//! Slack end to end: signed Events API and slash-command requests in through
//! `POST /webhooks/slack/{events,commands}`, the real runtime with the mock model, answers out to
//! a mock Slack Web API (`/api/chat.postMessage`, `/api/chat.update`, `/api/auth.test`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, Client, TestApp, wait_until};

const TOKEN: &str = "xoxb-0000-TEST-token";
const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
/// The thread the mention fixture was written in, and its channel.
const THREAD: &str = "1767225500.000100";
const CHANNEL: &str = "C0SRE00001";

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/channels/slack/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path).unwrap()
}

/// A Web API that knows the bot and accepts every message.
async fn slack_api() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/auth.test"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "ok": true, "url": "https://acme-ops.slack.com/", "team": "Acme Ops",
            "user": "opsbot", "team_id": "T0OPS00001", "user_id": "U0BOT00001",
            "bot_id": "B0BOT00001", "is_enterprise_install": false
        })))
        .mount(&server)
        .await;
    for method_name in ["reactions.add", "reactions.remove"] {
        Mock::given(method("POST"))
            .and(path(format!("/api/{method_name}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
            .mount(&server)
            .await;
    }
    for method_name in ["chat.postMessage", "chat.update"] {
        Mock::given(method("POST"))
            .and(path(format!("/api/{method_name}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "ok": true, "channel": CHANNEL, "ts": "1767229999.000900",
                "text": "ok",
                "message": {"type": "message", "text": "ok", "user": "U0BOT00001",
                            "bot_id": "B0BOT00001", "ts": "1767229999.000900"}
            })))
            .mount(&server)
            .await;
    }
    server
}

fn overrides(api: &MockServer) -> String {
    format!(
        "[channels.slack]\nenabled = true\nbot_token = \"{TOKEN}\"\n\
         signing_secret = \"{SIGNING_SECRET}\"\napi_url = \"{}/api\"\n",
        api.uri()
    )
}

async fn app(model: &MockModel, api: &MockServer) -> TestApp {
    TestApp::spawn(model, &overrides(api)).await
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Posts `body` to `/webhooks/slack/<route>`, signed with `secret` at `timestamp`, as Slack
/// does; `retry` adds `X-Slack-Retry-Num`.
async fn post_signed(
    client: &Client,
    route: &str,
    body: &str,
    secret: &str,
    timestamp: u64,
    retry: Option<u32>,
) -> (StatusCode, String) {
    let timestamp = timestamp.to_string();
    let signature = antler_channel::verify::hmac_sha256_hex(
        secret.as_bytes(),
        &[b"v0:", timestamp.as_bytes(), b":", body.as_bytes()],
    );
    let content_type = if route == "commands" {
        "application/x-www-form-urlencoded"
    } else {
        "application/json"
    };
    let mut request = client
        .http
        .post(format!("{}/webhooks/slack/{route}", client.base))
        .header("content-type", content_type)
        .header("X-Slack-Request-Timestamp", &timestamp)
        .header("X-Slack-Signature", format!("v0={signature}"))
        .body(body.to_owned());
    if let Some(retry) = retry {
        request = request
            .header("X-Slack-Retry-Num", retry.to_string())
            .header("X-Slack-Retry-Reason", "http_timeout");
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

async fn post_event(client: &Client, body: &str) -> StatusCode {
    post_signed(client, "events", body, SIGNING_SECRET, now_secs(), None)
        .await
        .0
}

/// The bodies of every call of `method` the Web API got, in order.
async fn calls(api: &MockServer, method_name: &str) -> Vec<Value> {
    let suffix = format!("/{method_name}");
    api.received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.url.path().ends_with(&suffix))
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

async fn posted(api: &MockServer) -> Vec<Value> {
    calls(api, "chat.postMessage").await
}

async fn wait_for_posts(api: &MockServer, n: usize) -> Vec<Value> {
    wait_until(&format!("{n} messages posted to Slack"), || async {
        let posted = posted(api).await;
        (posted.len() >= n).then_some(posted)
    })
    .await
}

/// A message event in `CHANNEL`, as Slack sends it for `message.channels`.
fn channel_message(ts: &str, thread_ts: Option<&str>, text: &str, event_id: &str) -> String {
    let mut event = json!({
        "type": "message", "user": "U0ADA00001", "text": text, "ts": ts,
        "team": "T0OPS00001", "channel": CHANNEL, "event_ts": ts, "channel_type": "channel"
    });
    if let Some(thread_ts) = thread_ts {
        event["thread_ts"] = json!(thread_ts);
    }
    json!({
        "token": "x", "team_id": "T0OPS00001", "api_app_id": "A0OPSBOT001",
        "event": event, "type": "event_callback", "event_id": event_id,
        "event_time": 1767225600,
        "authorizations": [{"enterprise_id": null, "team_id": "T0OPS00001",
                            "user_id": "U0BOT00001", "is_bot": true,
                            "is_enterprise_install": false}]
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_is_answered_in_its_thread_once_despite_retries_and_twins() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = slack_api().await;
    let app = app(&model, &api).await;
    let mention = fixture("slack_app_mention_thread.json");
    assert_eq!(post_event(&app.client, &mention).await, StatusCode::OK);
    // Slack's retry of the same delivery, and the `message.channels` twin of the same post.
    let (status, _) = post_signed(
        &app.client,
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
    assert_eq!(post_event(&app.client, &twin).await, StatusCode::OK);

    let posted = wait_for_posts(&api, 1).await;
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
    assert_eq!(self::posted(&api).await.len(), 1, "one post, one answer");
    assert_eq!(model.count(), 1);
    // 👀 while it worked, then ✅ in its place, on the user's message.
    let marks = wait_until("the end mark", || async {
        let marks: Vec<(String, String)> = api
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.url.path().contains("/reactions."))
            .map(|r| {
                let body: Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(body["channel"], CHANNEL);
                assert_eq!(body["timestamp"], "1767225600.000200");
                let method_name = r.url.path().rsplit('/').next().unwrap().to_owned();
                (method_name, body["name"].as_str().unwrap().to_owned())
            })
            .collect();
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
    let api = slack_api().await;
    let app = app(&model, &api).await;
    assert_eq!(
        post_event(&app.client, &fixture("slack_message_im.json")).await,
        StatusCode::OK
    );
    let posted = wait_for_posts(&api, 1).await;
    assert_eq!(posted[0]["channel"], "D0ADA00001");
    assert_eq!(posted[0]["text"], "echo: status payments-api");
    assert_eq!(
        posted[0].get("thread_ts"),
        None,
        "a DM is answered in place"
    );
    assert_eq!(
        post_event(&app.client, &fixture("slack_message_im_own_bot_echo.json")).await,
        StatusCode::OK
    );
    app.wait_idle().await;
    assert_eq!(self::posted(&api).await.len(), 1);
    assert_eq!(model.count(), 1, "the bot's own message ran nothing");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_in_the_bots_thread_is_answered_and_elsewhere_ignored() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = slack_api().await;
    let app = app(&model, &api).await;
    // A thread the bot was never mentioned in: nothing.
    let stray = channel_message(
        "1767225610.000300",
        Some("1767220000.000001"),
        "anyone?",
        "Ev1",
    );
    assert_eq!(post_event(&app.client, &stray).await, StatusCode::OK);
    assert_eq!(
        post_event(&app.client, &fixture("slack_app_mention_thread.json")).await,
        StatusCode::OK
    );
    wait_for_posts(&api, 1).await;
    let follow_up = channel_message("1767225620.000400", Some(THREAD), "and the db?", "Ev2");
    assert_eq!(post_event(&app.client, &follow_up).await, StatusCode::OK);
    let posted = wait_for_posts(&api, 2).await;
    assert_eq!(posted[1]["thread_ts"], THREAD);
    assert_eq!(posted[1]["text"], "echo: and the db?");
    app.wait_idle().await;
    assert_eq!(model.count(), 2, "the stray thread ran nothing");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slash_command_is_acknowledged_at_once_and_answered_in_the_channel() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = slack_api().await;
    let app = app(&model, &api).await;
    let started = Instant::now();
    let (status, body) = post_signed(
        &app.client,
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
    let posted = wait_for_posts(&api, 1).await;
    assert_eq!(posted[0]["channel"], CHANNEL);
    assert_eq!(posted[0]["text"], "echo: status payments-api");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_and_challenge_requests_get_their_answers() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = slack_api().await;
    let app = app(&model, &api).await;
    let mention = fixture("slack_app_mention_thread.json");
    let (status, _) = post_signed(
        &app.client,
        "events",
        &mention,
        "not-the-secret",
        now_secs(),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = post_signed(
        &app.client,
        "events",
        &mention,
        SIGNING_SECRET,
        now_secs() - 600,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a replayed old request");
    let tampered = mention.replace("restart", "destroy");
    let timestamp = now_secs().to_string();
    let signature = antler_channel::verify::hmac_sha256_hex(
        SIGNING_SECRET.as_bytes(),
        &[b"v0:", timestamp.as_bytes(), b":", mention.as_bytes()],
    );
    let status = app
        .client
        .http
        .post(format!("{}/webhooks/slack/events", app.client.base))
        .header("X-Slack-Request-Timestamp", &timestamp)
        .header("X-Slack-Signature", format!("v0={signature}"))
        .body(tampered)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a tampered body");
    let (status, body) = post_signed(
        &app.client,
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
    assert!(posted(&api).await.is_empty());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_from_slack_delays_the_answer_and_it_still_arrives_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = slack_api().await;
    Mock::given(method("POST"))
        .and(path("/api/chat.postMessage"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .set_body_json(json!({"ok": false, "error": "ratelimited"})),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&api)
        .await;
    let app = app(&model, &api).await;
    assert_eq!(
        post_event(&app.client, &fixture("slack_message_im.json")).await,
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
        (posted(&api).await.len() >= 2).then_some(())
    })
    .await;
    assert!(
        first_try.elapsed() >= Duration::from_millis(900),
        "Retry-After was honoured"
    );
    app.wait_idle().await;
    assert_eq!(
        posted(&api).await.len(),
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
    let api = slack_api().await;
    let app = app(&model, &api).await;
    assert_eq!(
        post_event(&app.client, &fixture("slack_message_im.json")).await,
        StatusCode::OK
    );
    wait_for_posts(&api, 1).await;
    app.wait_idle().await;
    let posted = posted(&api).await;
    assert_eq!(posted.len(), 1, "one message, the draft: {posted:?}");
    let updates = calls(&api, "chat.update").await;
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
    let api = slack_api().await;
    let rig = ChildRig::new(&model, &overrides(&api));
    let mut first = rig.serve().await;
    let mention = fixture("slack_app_mention_thread.json");
    assert_eq!(post_event(&first.client, &mention).await, StatusCode::OK);
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    wait_for_posts(&api, 1).await;
    // Slack retries the delivery it saw no answer to: recognised.
    let (status, _) = post_signed(
        &second.client,
        "events",
        &mention,
        SIGNING_SECRET,
        now_secs(),
        Some(1),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    second.client.wait_idle().await;
    let posted = posted(&api).await;
    assert_eq!(posted.len(), 1, "{posted:?}\n{}", second.log_text());
    assert_eq!(posted[0]["thread_ts"], THREAD);
}
