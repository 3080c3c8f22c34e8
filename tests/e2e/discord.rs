//! Discord end to end: Ed25519-signed interactions in through
//! `POST /webhooks/discord/interactions`, the real runtime with the mock model, answers out to a
//! mock Discord API (`/api/v10/webhooks/{app}/{token}[/messages/@original]`) on 127.0.0.1.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signer, SigningKey};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, Client, TestApp, wait_until};

const APPLICATION_ID: &str = "1300000000000000001";
const BOT_TOKEN: &str = "discord-e2e-BOT-TOKEN";
/// The DM fixture's user and channel.
const ADA: &str = "1200000000000000001";
const DM_CHANNEL: &str = "1100000000000000077";

fn key() -> SigningKey {
    SigningKey::from_bytes(&[42; 32])
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/channels/discord/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The DM `/ask` fixture as interaction `id` with token `token` and `prompt`.
fn ask(id: &str, token: &str, prompt: &str) -> Value {
    let mut interaction = fixture("discord_slash_dm.json");
    interaction["id"] = json!(id);
    interaction["token"] = json!(token);
    interaction["data"]["options"][0]["value"] = json!(prompt);
    interaction
}

fn message(id: &str) -> Value {
    json!({
        "id": id, "channel_id": DM_CHANNEL,
        "author": {"id": APPLICATION_ID, "username": "antler", "discriminator": "0",
                   "global_name": null, "avatar": null, "bot": true},
        "content": "ok", "timestamp": "2026-01-01T00:00:00.000000+00:00",
        "edited_timestamp": null, "tts": false, "mention_everyone": false, "mentions": [],
        "mention_roles": [], "attachments": [], "embeds": [], "pinned": false, "type": 0
    })
}

/// A Discord API that accepts every interaction-webhook edit and follow-up.
async fn discord_api() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("PATCH"))
        .and(path_regex(
            r"^/api/v10/webhooks/\d+/[^/]+/messages/@original$",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(message("1500000000000000001")))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/api/v10/webhooks/\d+/[^/]+$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(message("1500000000000000002")))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/api/v10/channels/\d+/messages$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(message("1500000000000000003")))
        .mount(&server)
        .await;
    server
}

fn overrides(api: &MockServer, more: &str) -> String {
    format!(
        "[channels.discord]\nenabled = true\napplication_id = \"{APPLICATION_ID}\"\n\
         public_key = \"{}\"\nbot_token = \"{BOT_TOKEN}\"\napi_url = \"{}\"\n{more}",
        hex::encode(key().verifying_key().as_bytes()),
        api.uri()
    )
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Posts `interaction` signed as Discord does (Ed25519 over timestamp + body) by `signer`.
async fn post_signed(
    client: &Client,
    interaction: &Value,
    signer: &SigningKey,
) -> (StatusCode, String) {
    let body = serde_json::to_vec(interaction).unwrap();
    let timestamp = now_secs().to_string();
    let mut signed = timestamp.as_bytes().to_vec();
    signed.extend_from_slice(&body);
    let signature = hex::encode(signer.sign(&signed).to_bytes());
    let response = client
        .http
        .post(format!("{}/webhooks/discord/interactions", client.base))
        .header("content-type", "application/json")
        .header("X-Signature-Ed25519", signature)
        .header("X-Signature-Timestamp", timestamp)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

async fn post(client: &Client, interaction: &Value) -> Value {
    let (status, body) = post_signed(client, interaction, &key()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Every call to the API: (method, path, JSON body).
async fn calls(api: &MockServer) -> Vec<(String, String, Value)> {
    api.received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| {
            (
                r.method.to_string(),
                r.url.path().to_owned(),
                serde_json::from_slice(&r.body).unwrap_or(Value::Null),
            )
        })
        .collect()
}

async fn edits_of_original(api: &MockServer, token: &str) -> Vec<Value> {
    let original = format!("/api/v10/webhooks/{APPLICATION_ID}/{token}/messages/@original");
    calls(api)
        .await
        .into_iter()
        .filter(|(m, p, _)| m == "PATCH" && *p == original)
        .map(|(_, _, body)| body)
        .collect()
}

async fn follow_ups(api: &MockServer, token: &str) -> Vec<Value> {
    let webhook = format!("/api/v10/webhooks/{APPLICATION_ID}/{token}");
    calls(api)
        .await
        .into_iter()
        .filter(|(m, p, _)| m == "POST" && *p == webhook)
        .map(|(_, _, body)| body)
        .collect()
}

async fn wait_for_edit(api: &MockServer, token: &str) -> Vec<Value> {
    wait_until("the deferred response edited", || async {
        let edits = edits_of_original(api, token).await;
        (!edits.is_empty()).then_some(edits)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_command_is_deferred_at_once_and_its_answer_edits_the_original() {
    let model = MockModel::start(Behaviour::Echo).await;
    // The model does not answer until the deferral is back: the deferral cannot wait for it.
    model.hold();
    let api = discord_api().await;
    let app = TestApp::spawn(&model, &overrides(&api, "")).await;
    let started = Instant::now();
    let deferral = post(
        &app.client,
        &ask("1300000000000000950", "tok-a", "why is p99 high?"),
    )
    .await;
    let took = started.elapsed();
    eprintln!("discord deferral answered in {took:?}");
    assert_eq!(deferral, json!({"type": 5}));
    // Discord's deadline is 3 s; the model is still held, so nothing but acceptance ran.
    assert!(took < Duration::from_secs(3), "{took:?}");
    model.release();
    let edits = wait_for_edit(&api, "tok-a").await;
    assert_eq!(edits[0]["content"], "echo: why is p99 high?");
    assert_eq!(edits[0]["allowed_mentions"], json!({"parse": []}));
    app.client.wait_idle().await;
    assert!(follow_ups(&api, "tok-a").await.is_empty());
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
    let api = discord_api().await;
    let app = TestApp::spawn(&model, &overrides(&api, "")).await;
    let (status, body) = post_signed(&app.client, &fixture("discord_ping.json"), &key()).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, r#"{"type":1}"#));

    let forger = SigningKey::from_bytes(&[7; 32]);
    let interaction = ask("1300000000000000951", "tok-forged", "hi");
    let (status, _) = post_signed(&app.client, &interaction, &forger).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A flipped byte after signing.
    let body = serde_json::to_vec(&interaction).unwrap();
    let timestamp = now_secs().to_string();
    let mut signed = timestamp.as_bytes().to_vec();
    signed.extend_from_slice(&body);
    let signature = hex::encode(key().sign(&signed).to_bytes());
    let mut flipped = body.clone();
    flipped[5] ^= 1;
    let response = app
        .client
        .http
        .post(format!("{}/webhooks/discord/interactions", app.client.base))
        .header("X-Signature-Ed25519", signature)
        .header("X-Signature-Timestamp", timestamp)
        .body(flipped)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // Stored nothing: the same interaction, properly signed, is new and runs.
    assert_eq!(post(&app.client, &interaction).await, json!({"type": 5}));
    wait_for_edit(&api, "tok-forged").await;
    app.client.wait_idle().await;
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5000_character_answer_is_an_edit_and_follow_ups_of_at_most_2000() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = discord_api().await;
    let app = TestApp::spawn(&model, &overrides(&api, "")).await;
    let prompt = "lorem ipsum dolor sit amet ".repeat(186);
    let prompt = prompt.trim_end().to_owned();
    assert!(prompt.chars().count() >= 5000 - 6);
    post(
        &app.client,
        &ask("1300000000000000952", "tok-long", &prompt),
    )
    .await;
    app.client.wait_idle().await;
    let edits = edits_of_original(&api, "tok-long").await;
    let follow_ups = follow_ups(&api, "tok-long").await;
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
    let api = discord_api().await;
    let app = TestApp::spawn(&model, &overrides(&api, "")).await;
    let interaction = ask("1300000000000000953", "tok-twice", "once please");
    assert_eq!(post(&app.client, &interaction).await, json!({"type": 5}));
    assert_eq!(post(&app.client, &interaction).await, json!({"type": 5}));
    wait_for_edit(&api, "tok-twice").await;
    app.client.wait_idle().await;
    assert_eq!(post(&app.client, &interaction).await, json!({"type": 5}));
    app.client.wait_idle().await;
    assert_eq!(model.count(), 1);
    assert_eq!(edits_of_original(&api, "tok-twice").await.len(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_delays_the_edit_and_it_still_arrives_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = discord_api().await;
    Mock::given(method("PATCH"))
        .and(path(format!(
            "/api/v10/webhooks/{APPLICATION_ID}/tok-limited/messages/@original"
        )))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .insert_header("X-RateLimit-Scope", "user")
                .set_body_json(json!({
                    "message": "You are being rate limited.", "retry_after": 1.2, "global": false
                })),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&api)
        .await;
    let app = TestApp::spawn(&model, &overrides(&api, "")).await;
    post(
        &app.client,
        &ask("1300000000000000954", "tok-limited", "slowly"),
    )
    .await;
    let first_try = wait_until("the first attempt", || async {
        (!edits_of_original(&api, "tok-limited").await.is_empty()).then(Instant::now)
    })
    .await;
    wait_until("the answer delivered", || async {
        (edits_of_original(&api, "tok-limited").await.len() >= 2).then_some(())
    })
    .await;
    assert!(
        first_try.elapsed() >= Duration::from_millis(1100),
        "retry_after (1.2 s) was honoured: {:?}",
        first_try.elapsed()
    );
    app.client.wait_idle().await;
    let edits = edits_of_original(&api, "tok-limited").await;
    assert_eq!(edits.len(), 2, "one refused attempt, one delivery");
    assert_eq!(edits[1]["content"], "echo: slowly");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_outside_the_allowlist_gets_an_ephemeral_refusal_and_no_model_call() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = discord_api().await;
    let app = TestApp::spawn(
        &model,
        &overrides(&api, "allowed_users = [\"1200000000000000099\"]\n"),
    )
    .await;
    for id in ["1300000000000000955", "1300000000000000956"] {
        let reply = post(&app.client, &ask(id, "tok-refused", "let me in")).await;
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
        calls(&api).await.is_empty(),
        "nothing sent: {:?}",
        calls(&api).await
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_deferral_and_a_restart_answer_exactly_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = discord_api().await;
    let rig = ChildRig::new(&model, &overrides(&api, ""));
    let mut first = rig.serve().await;
    let interaction = ask("1300000000000000957", "tok-crash", "survive this");
    assert_eq!(post(&first.client, &interaction).await, json!({"type": 5}));
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    let edits = wait_for_edit(&api, "tok-crash").await;
    assert_eq!(edits[0]["content"], "echo: survive this");
    second.client.wait_idle().await;
    assert_eq!(edits_of_original(&api, "tok-crash").await.len(), 1);
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
    let api = discord_api().await;
    let app = TestApp::spawn(&model, &overrides(&api, "")).await;
    post(
        &app.client,
        &ask("1300000000000000958", "tok-stream", "stream it"),
    )
    .await;
    wait_for_edit(&api, "tok-stream").await;
    app.client.wait_idle().await;
    let edits = edits_of_original(&api, "tok-stream").await;
    assert!(
        edits.len() >= 2,
        "edited while writing, then finished: {edits:?}"
    );
    assert_eq!(edits.last().unwrap()["content"], "echo: stream it");
    assert!(
        follow_ups(&api, "tok-stream").await.is_empty(),
        "one message"
    );
    // At most once a second: the stream takes about 4 s, so at most ~5 edits plus the answer.
    assert!(edits.len() <= 7, "{} edits", edits.len());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_commands_writes_only_when_changed_and_doctor_checks_the_bot_token() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockServer::start().await;
    let route = format!("/api/v10/applications/{APPLICATION_ID}/guilds/77/commands");
    Mock::given(method("GET"))
        .and(path(&route))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .up_to_n_times(1)
        .mount(&api)
        .await;
    let mut registered = serde_json::to_value(antler::setup::discord_commands()).unwrap();
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
    let rig = ChildRig::new(&model, &overrides(&api, ""));
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

/// A Discord Gateway on 127.0.0.1: HELLO; IDENTIFY gets READY and then `message_create`;
/// the first session is then told to reconnect (op 7) and closed; a RESUME gets the same
/// `message_create` again (a replay, as Discord does for events it is unsure were received)
/// and RESUMED. Returns its `ws://` URL and how many times it sent the `message_create`.
async fn mock_gateway(
    message_create: Value,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use futures_util::{SinkExt, StreamExt};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio_tungstenite::tungstenite::Message as Ws;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let sent = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    let sessions = AtomicUsize::new(0);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = sessions.fetch_add(1, Ordering::SeqCst);
            let message_create = message_create.clone();
            let counted = counted.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                let send = |value: Value| Ws::Text(value.to_string());
                let _ = ws
                    .send(send(
                        json!({"op": 10, "d": {"heartbeat_interval": 45000}, "s": null, "t": null}),
                    ))
                    .await;
                let dispatch = |s: u64, t: &str, d: Value| json!({"op": 0, "s": s, "t": t, "d": d});
                while let Some(Ok(frame)) = ws.next().await {
                    let Ws::Text(text) = frame else { continue };
                    let payload: Value = serde_json::from_str(&text).unwrap();
                    match payload["op"].as_u64() {
                        Some(1) => {
                            let _ = ws
                                .send(send(json!({"op": 11, "d": null, "s": null, "t": null})))
                                .await;
                        }
                        Some(2) => {
                            let ready = json!({
                                "v": 10, "session_id": "session-1",
                                "resume_gateway_url": "ws://127.0.0.1:9",
                                "user": {"id": APPLICATION_ID, "username": "antler",
                                         "discriminator": "0", "global_name": null,
                                         "avatar": null, "bot": true, "verified": true,
                                         "mfa_enabled": false, "flags": 0},
                                "guilds": [], "shard": [0, 1],
                                "application": {"id": APPLICATION_ID, "flags": 0}
                            });
                            let _ = ws.send(send(dispatch(1, "READY", ready))).await;
                            let _ = ws
                                .send(send(dispatch(2, "MESSAGE_CREATE", message_create.clone())))
                                .await;
                            counted.fetch_add(1, Ordering::SeqCst);
                            if n == 0 {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                let _ = ws
                                    .send(send(json!({"op": 7, "d": null, "s": null, "t": null})))
                                    .await;
                                let _ = ws.close(None).await;
                                return;
                            }
                        }
                        Some(6) => {
                            let _ = ws
                                .send(send(dispatch(2, "MESSAGE_CREATE", message_create.clone())))
                                .await;
                            counted.fetch_add(1, Ordering::SeqCst);
                            let _ = ws.send(send(dispatch(3, "RESUMED", json!({})))).await;
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    (url, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gateway_a_mention_is_answered_once_across_a_reconnect() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = discord_api().await;
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
    // serenity's `Client::start` (one shard) asks `GET /gateway`; autosharding asks `/gateway/bot`.
    Mock::given(method("GET"))
        .and(path_regex(r"^/api/v10/gateway(/bot)?$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "url": url, "shards": 1,
            "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0,
                                    "max_concurrency": 1}
        })))
        .mount(&api)
        .await;
    let app = TestApp::spawn(&model, &overrides(&api, "gateway = true\n")).await;
    let posted = wait_until("the mention answered", || async {
        let posted: Vec<Value> = calls(&api)
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
    let answers = calls(&api)
        .await
        .into_iter()
        .filter(|(m, p, _)| m == "POST" && p.ends_with("/messages"))
        .count();
    assert_eq!(answers, 1, "answered once");
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}
