//! Discord end to end: Ed25519-signed interactions in through
//! `POST /webhooks/discord/interactions`, the real runtime with the mock model, answers out to a
//! mock Discord API (`/api/v10/webhooks/{app}/{token}[/messages/@original]`) on 127.0.0.1.

use std::time::{Duration, Instant};

use antler_testkit::discord::{
    ADA, APPLICATION_ID, BOT_TOKEN, MockDiscord, ask, fixture, key, mock_gateway, post, post_raw,
    post_signed, signed_headers, user_installed,
};
use antler_testkit::now_secs;
use ed25519_dalek::SigningKey;
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, TestApp, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_command_is_deferred_at_once_and_its_answer_edits_the_original() {
    let model = MockModel::start(Behaviour::Echo).await;
    // The model does not answer until the deferral is back: the deferral cannot wait for it.
    model.hold();
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let started = Instant::now();
    let deferral = post(
        &app.base,
        &ask("1300000000000000950", "tok-a", "why is p99 high?"),
    )
    .await;
    let took = started.elapsed();
    eprintln!("discord deferral answered in {took:?}");
    assert_eq!(deferral, json!({"type": 5}));
    // Discord's deadline is 3 s; the model is still held, so nothing but acceptance ran.
    assert!(took < Duration::from_secs(3), "{took:?}");
    model.release();
    let edits = api.wait_for_edit("tok-a").await;
    assert_eq!(edits[0]["content"], "echo: why is p99 high?");
    assert_eq!(edits[0]["allowed_mentions"], json!({"parse": []}));
    app.client.wait_idle().await;
    assert!(api.follow_ups("tok-a").await.is_empty());
    assert_eq!(model.count(), 1);
    // The bot token never goes to an interaction webhook.
    for request in api.received_requests().await.unwrap() {
        assert!(request.headers.get("authorization").is_none());
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_gets_exactly_type_1_and_a_bad_signature_401_with_nothing_stored() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let (status, body) = post_signed(&app.base, &fixture("discord_ping.json"), &key()).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, r#"{"type":1}"#));

    let forger = SigningKey::from_bytes(&[7; 32]);
    let interaction = ask("1300000000000000951", "tok-forged", "hi");
    let (status, body) = post_signed(&app.base, &interaction, &forger).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The 401 names what failed: the Discord key, not the HTTP API's bearer token.
    let refused: Value = serde_json::from_str(&body).unwrap();
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("channels.discord.public_key"), "{message}");
    assert!(!message.contains("bearer"), "{message}");
    // A flipped byte after signing.
    let body = serde_json::to_vec(&interaction).unwrap();
    let signed = signed_headers(&key(), now_secs(), &body);
    let mut flipped = body.clone();
    flipped[5] ^= 1;
    let (status, _) = post_raw(&app.base, flipped, &signed).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Stored nothing: the same interaction, properly signed, is new and runs.
    assert_eq!(post(&app.base, &interaction).await, json!({"type": 5}));
    api.wait_for_edit("tok-forged").await;
    app.client.wait_idle().await;
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5000_character_answer_is_an_edit_and_follow_ups_of_at_most_2000() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let prompt = "lorem ipsum dolor sit amet ".repeat(186);
    let prompt = prompt.trim_end().to_owned();
    assert!(prompt.chars().count() >= 5000 - 6);
    post(&app.base, &ask("1300000000000000952", "tok-long", &prompt)).await;
    app.client.wait_idle().await;
    let edits = api.edits_of_original("tok-long").await;
    let follow_ups = api.follow_ups("tok-long").await;
    assert_eq!(edits.len(), 1, "{edits:?}");
    assert_eq!(follow_ups.len(), 2, "{follow_ups:?}");
    let parts: Vec<String> = edits
        .iter()
        .chain(&follow_ups)
        .map(|body| body["content"].as_str().unwrap().to_owned())
        .collect();
    for part in &parts {
        assert!(part.chars().count() <= 2000, "{}", part.chars().count());
    }
    let whole = parts.join(" ");
    assert_eq!(
        whole.split_whitespace().collect::<Vec<_>>(),
        format!("echo: {prompt}")
            .split_whitespace()
            .collect::<Vec<_>>(),
        "nothing lost between the parts"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_interaction_id_runs_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let interaction = ask("1300000000000000953", "tok-twice", "once please");
    assert_eq!(post(&app.base, &interaction).await, json!({"type": 5}));
    assert_eq!(post(&app.base, &interaction).await, json!({"type": 5}));
    api.wait_for_edit("tok-twice").await;
    app.client.wait_idle().await;
    assert_eq!(post(&app.base, &interaction).await, json!({"type": 5}));
    app.client.wait_idle().await;
    assert_eq!(model.count(), 1);
    assert_eq!(api.edits_of_original("tok-twice").await.len(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_delays_the_edit_and_it_still_arrives_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    // `Retry-After: 1` but `retry_after: 1.2` in the body: the longer one must be waited.
    api.rate_limit_next(
        &format!("^/api/v10/webhooks/{APPLICATION_ID}/tok-limited/messages/@original$"),
        1,
        1.2,
    )
    .await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    post(
        &app.base,
        &ask("1300000000000000954", "tok-limited", "slowly"),
    )
    .await;
    let first_try = wait_until("the first attempt", || async {
        (!api.edits_of_original("tok-limited").await.is_empty()).then(Instant::now)
    })
    .await;
    wait_until("the answer delivered", || async {
        (api.edits_of_original("tok-limited").await.len() >= 2).then_some(())
    })
    .await;
    assert!(
        first_try.elapsed() >= Duration::from_millis(1100),
        "retry_after (1.2 s) was honoured: {:?}",
        first_try.elapsed()
    );
    app.client.wait_idle().await;
    let edits = api.edits_of_original("tok-limited").await;
    assert_eq!(edits.len(), 2, "one refused attempt, one delivery");
    assert_eq!(edits[1]["content"], "echo: slowly");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_outside_the_allowlist_gets_an_ephemeral_refusal_and_no_model_call() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(
        &model,
        &api.config("allowed_users = [\"1200000000000000099\"]\n"),
    )
    .await;
    for id in ["1300000000000000955", "1300000000000000956"] {
        let reply = post(&app.base, &ask(id, "tok-refused", "let me in")).await;
        assert_eq!(reply["type"], 4, "{reply}");
        assert_eq!(reply["data"]["flags"], 64, "ephemeral: {reply}");
        let text = reply["data"]["content"].as_str().unwrap();
        assert!(
            text.contains(ADA) && text.contains("channels.discord.allowed_users"),
            "{text}"
        );
    }
    app.client.wait_idle().await;
    assert_eq!(model.count(), 0);
    assert!(
        api.calls().await.is_empty(),
        "nothing sent: {:?}",
        api.calls().await
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_deferral_and_a_restart_answer_exactly_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockDiscord::start().await;
    let rig = ChildRig::new(&model, &api.config(""));
    let mut first = rig.serve().await;
    let interaction = ask("1300000000000000957", "tok-crash", "survive this");
    assert_eq!(post(&first.base, &interaction).await, json!({"type": 5}));
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    let edits = api.wait_for_edit("tok-crash").await;
    assert_eq!(edits[0]["content"], "echo: survive this");
    second.client.wait_idle().await;
    assert_eq!(api.edits_of_original("tok-crash").await.len(), 1);
    let log = second.log_text();
    assert!(
        !log.contains("tok-crash"),
        "the interaction token is never logged:\n{log}"
    );
    assert!(!log.contains(BOT_TOKEN), "the bot token is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_streams_into_the_original_edited_until_it_is_the_answer() {
    // About 4 seconds of stream; the deferred response is edited at most once a second.
    let model = MockModel::start(Behaviour::Trickle {
        pieces: 6,
        every: Duration::from_millis(700),
    })
    .await;
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    post(
        &app.base,
        &ask("1300000000000000958", "tok-stream", "stream it"),
    )
    .await;
    api.wait_for_edit("tok-stream").await;
    app.client.wait_idle().await;
    let edits = api.edits_of_original("tok-stream").await;
    assert!(
        edits.len() >= 2,
        "edited while writing, then finished: {edits:?}"
    );
    assert_eq!(edits.last().unwrap()["content"], "echo: stream it");
    assert!(api.follow_ups("tok-stream").await.is_empty(), "one message");
    // At most once a second: the stream takes about 4 s, so at most ~5 edits plus the answer.
    assert!(edits.len() <= 7, "{} edits", edits.len());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_commands_writes_only_when_changed_and_doctor_checks_the_bot_token() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::empty().await;
    let route = format!("/api/v10/applications/{APPLICATION_ID}/guilds/77/commands");
    Mock::given(method("GET"))
        .and(path(&route))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .up_to_n_times(1)
        .mount(&api)
        .await;
    let mut registered = serde_json::to_value(antler::setup::discord_commands(
        &antler::config::Config::default(),
    ))
    .unwrap();
    for command in registered.as_array_mut().unwrap() {
        command["id"] = json!("1600000000000000001");
        command["application_id"] = json!(APPLICATION_ID);
        command["version"] = json!("1600000000000000002");
    }
    Mock::given(method("GET"))
        .and(path(&route))
        .respond_with(ResponseTemplate::new(200).set_body_json(registered))
        .mount(&api)
        .await;
    Mock::given(method("PUT"))
        .and(path(&route))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(1)
        .mount(&api)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v10/users/@me"))
        .and(wiremock::matchers::header(
            "authorization",
            format!("Bot {BOT_TOKEN}").as_str(),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": APPLICATION_ID, "username": "antler", "discriminator": "0",
            "global_name": null, "avatar": null, "bot": true
        })))
        .mount(&api)
        .await;
    let rig = ChildRig::new(&model, &api.config(""));
    let config = rig.config.to_str().unwrap();
    let (code, stdout, stderr) = crate::support::run_binary(&[
        "discord",
        "register-commands",
        "--config",
        config,
        "--guild",
        "77",
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("scope: guild 77"), "{stdout}");
    assert!(
        stdout.contains("commands: registered (/ask, /help, /new, /status"),
        "{stdout}"
    );
    assert!(stdout.contains("Ask antler"), "{stdout}");
    let (code, stdout, _) = crate::support::run_binary(&[
        "discord",
        "register-commands",
        "--config",
        config,
        "--guild",
        "77",
    ])
    .await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("commands: unchanged"), "{stdout}");
    api.verify().await;
    let put = api
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.method.as_str() == "PUT")
        .unwrap();
    let sent: Value = serde_json::from_slice(&put.body).unwrap();
    let names: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.first(), Some(&"ask"));
    assert_eq!(names.last(), Some(&"Ask antler"));
    assert!(names.contains(&"new") && names.contains(&"status"));

    let (code, stdout, _) = crate::support::run_binary(&["doctor", "--config", config]).await;
    let line = stdout
        .lines()
        .find(|l| l.contains("discord"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("the bot token works: the bot is antler"),
        "{stdout}"
    );
    assert!(!stdout.contains(BOT_TOKEN) && !stderr.contains(BOT_TOKEN));
    let _ = code;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gateway_a_mention_is_answered_once_across_a_reconnect() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    let mention = json!({
        "id": "1700000000000000001", "channel_id": "1100000000000000050",
        "guild_id": "1100000000000000001",
        "author": {"id": ADA, "username": "ada_ops", "discriminator": "0",
                   "global_name": "Ada", "avatar": null},
        "member": {"roles": [], "joined_at": "2024-03-01T10:00:00.000000+00:00", "deaf": false,
                   "mute": false, "flags": 0},
        "content": format!("<@{APPLICATION_ID}> hello there"),
        "timestamp": "2026-01-01T00:00:00.000000+00:00", "edited_timestamp": null,
        "tts": false, "mention_everyone": false,
        "mentions": [{"id": APPLICATION_ID, "username": "antler", "discriminator": "0",
                      "global_name": null, "avatar": null, "bot": true}],
        "mention_roles": [], "attachments": [], "embeds": [], "pinned": false, "type": 0
    });
    let (url, sent) = mock_gateway(mention).await;
    api.serve_gateway_url(&url).await;
    let app = TestApp::spawn(&model, &api.config("gateway = true\n")).await;
    let posted = wait_until("the mention answered", || async {
        let posted: Vec<Value> = api
            .calls()
            .await
            .into_iter()
            .filter(|(m, p, _)| {
                m == "POST" && p == "/api/v10/channels/1100000000000000050/messages"
            })
            .map(|(_, _, body)| body)
            .collect();
        (!posted.is_empty()).then_some(posted)
    })
    .await;
    assert_eq!(posted[0]["content"], "echo: hello there");
    assert_eq!(
        posted[0]["message_reference"]["message_id"],
        "1700000000000000001"
    );
    // The replay after the reconnect is recognised.
    wait_until("the message replayed on the new session", || async {
        (sent.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    // Time for the replay to reach the inbox (it must not: it is a duplicate).
    tokio::time::sleep(Duration::from_millis(500)).await;
    app.client.wait_idle().await;
    let answers = api
        .calls()
        .await
        .into_iter()
        .filter(|(m, p, _)| m == "POST" && p.ends_with("/messages"))
        .count();
    assert_eq!(answers, 1, "answered once");
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

/// The parts of an answer, in order, rejoined: nothing lost between them.
fn rejoined(parts: &[Value]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|body| {
            body["content"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn long_prompt(words: usize) -> String {
    "lorem ipsum dolor sit amet "
        .repeat(words)
        .trim_end()
        .to_owned()
}

/// Discord: "Apps installed to a user ... are limited to 5 followup messages per
/// interaction". An answer of 8 parts to a user-installed app is the edited original, 5
/// follow-ups, and the rest as the bot's messages in the channel: nothing refused, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_installed_app_sends_at_most_5_follow_ups_and_the_rest_in_the_channel() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    api.limit_follow_ups("tok-user").await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let prompt = long_prompt(560);
    let interaction = user_installed(ask("1300000000000000961", "tok-user", &prompt));
    post(&app.base, &interaction).await;
    app.client.wait_idle().await;
    let edits = api.edits_of_original("tok-user").await;
    let follow_ups = api.follow_ups("tok-user").await;
    let in_channel = api.channel_messages().await;
    assert_eq!(edits.len(), 1, "{edits:?}");
    assert_eq!(follow_ups.len(), 5, "never a sixth follow-up");
    assert!(!in_channel.is_empty(), "the rest went to the channel");
    let parts: Vec<Value> = edits
        .into_iter()
        .chain(follow_ups)
        .chain(in_channel)
        .collect();
    assert!(parts.len() >= 7, "{}", parts.len());
    assert_eq!(
        rejoined(&parts),
        format!("echo: {prompt}")
            .split_whitespace()
            .collect::<Vec<_>>(),
        "nothing lost between the parts"
    );
    app.shutdown().await;
}

/// A 404 Unknown Webhook (code 10015) on the interaction webhook is like an expired token:
/// the answer goes to the channel as the bot's own message instead of being given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_webhook_falls_back_to_a_channel_message() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    api.forget_webhook("tok-gone").await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    post(
        &app.base,
        &ask("1300000000000000962", "tok-gone", "still there?"),
    )
    .await;
    let in_channel = wait_until("the answer in the channel", || async {
        let messages = api.channel_messages().await;
        (!messages.is_empty()).then_some(messages)
    })
    .await;
    app.client.wait_idle().await;
    assert_eq!(in_channel.len(), 1, "{in_channel:?}");
    assert_eq!(in_channel[0]["content"], "echo: still there?");
    assert_eq!(in_channel[0]["allowed_mentions"]["parse"], json!([]));
    app.shutdown().await;
}

/// A 2xx whose body lacks fields antler's model of a message expects is still a delivered
/// part: every part is sent once, none again, none dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_antler_cannot_fully_parse_is_a_delivered_part_and_the_rest_follows() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    api.answer_sparsely("tok-sparse").await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let prompt = long_prompt(186);
    post(
        &app.base,
        &ask("1300000000000000963", "tok-sparse", &prompt),
    )
    .await;
    app.client.wait_idle().await;
    let edits = api.edits_of_original("tok-sparse").await;
    let follow_ups = api.follow_ups("tok-sparse").await;
    assert_eq!(edits.len(), 1, "{edits:?}");
    assert_eq!(follow_ups.len(), 2, "{follow_ups:?}");
    assert!(api.channel_messages().await.is_empty());
    let parts: Vec<Value> = edits.into_iter().chain(follow_ups).collect();
    assert_eq!(
        rejoined(&parts),
        format!("echo: {prompt}")
            .split_whitespace()
            .collect::<Vec<_>>()
    );
    app.shutdown().await;
}
