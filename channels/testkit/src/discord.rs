//! Discord: Ed25519-signed interactions, a mock HTTP API and a mock Gateway.
//!
//! Discord signs `timestamp || body` with the application's Ed25519 key: the hex signature in
//! `X-Signature-Ed25519`, the Unix time in `X-Signature-Timestamp` (protocols.md §3.1). A
//! 429's body is `{"message", "retry_after": <float seconds>, "global": bool}` with a
//! `Retry-After` header, and `X-RateLimit-*` headers name the bucket (§3.4).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ed25519_dalek::{Signer, SigningKey};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::Call;
use crate::conformance::{Expect, Fixture, MockApi, Platform, Vector, Written};

/// The application id.
pub const APPLICATION_ID: &str = "1300000000000000001";
/// The bot token.
pub const BOT_TOKEN: &str = "discord-e2e-BOT-TOKEN";
/// The DM fixture's user.
pub const ADA: &str = "1200000000000000001";
/// The DM fixture's channel.
pub const DM_CHANNEL: &str = "1100000000000000077";
/// The id of the deferred response (`@original`) as the mock API returns it.
pub const ORIGINAL_ID: &str = "1500000000000000001";
/// The header with the signature.
pub const SIGNATURE_HEADER: &str = "x-signature-ed25519";
/// The header with the signing time.
pub const TIMESTAMP_HEADER: &str = "x-signature-timestamp";

/// The application's key: the recorded vectors' (seed `sha256("discord-fixture-seed")`).
#[must_use]
pub fn key() -> SigningKey {
    SigningKey::from_bytes(&Sha256::digest(b"discord-fixture-seed").into())
}

/// The application's public key as `channels.discord.public_key` takes it: 64 hex characters.
#[must_use]
pub fn public_key_hex() -> String {
    hex::encode(key().verifying_key().as_bytes())
}

/// The recorded payload `name` (with its extension) as JSON.
#[must_use]
pub fn fixture(name: &str) -> Value {
    crate::fixture_json("discord", name)
}

/// The signature headers for `body` signed by `signer` at `timestamp`.
#[must_use]
pub fn signed_headers(signer: &SigningKey, timestamp: u64, body: &[u8]) -> http::HeaderMap {
    let timestamp = timestamp.to_string();
    let mut signed = timestamp.as_bytes().to_vec();
    signed.extend_from_slice(body);
    let signature = hex::encode(signer.sign(&signed).to_bytes());
    crate::headers([
        (SIGNATURE_HEADER, signature.as_str()),
        (TIMESTAMP_HEADER, timestamp.as_str()),
    ])
}

/// Posts `interaction` to `<base>/webhooks/discord/interactions` signed now by `signer`, as
/// Discord does.
pub async fn post_signed(
    base: &str,
    interaction: &Value,
    signer: &SigningKey,
) -> (reqwest::StatusCode, String) {
    let body = serde_json::to_vec(interaction).expect("JSON");
    let mut headers = signed_headers(signer, crate::now_secs(), &body);
    headers.insert(
        "content-type",
        "application/json".parse().expect("a header value"),
    );
    post_raw(base, body, &headers).await
}

/// Posts `body` with `headers` to `<base>/webhooks/discord/interactions` as they are.
pub async fn post_raw(
    base: &str,
    body: Vec<u8>,
    headers: &http::HeaderMap,
) -> (reqwest::StatusCode, String) {
    let answered = crate::post_webhook(
        &reqwest::Client::new(),
        &format!("{base}/webhooks/discord/interactions"),
        body,
        headers,
    )
    .await;
    (answered.status, answered.text)
}

/// Posts `interaction` signed by [`key`]; it must be answered 200, with JSON, which is returned.
pub async fn post(base: &str, interaction: &Value) -> Value {
    let (status, body) = post_signed(base, interaction, &key()).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    serde_json::from_str(&body).expect("a JSON answer")
}

/// The DM `/ask` fixture as interaction `id` with token `token` and `prompt`.
#[must_use]
pub fn ask(id: &str, token: &str, prompt: &str) -> Value {
    let mut interaction = fixture("discord_slash_dm.json");
    interaction["id"] = json!(id);
    interaction["token"] = json!(token);
    interaction["data"]["options"][0]["value"] = json!(prompt);
    interaction
}

/// `interaction` as Discord sends it to an app installed to the user only (not to the
/// server): `authorizing_integration_owners` names the user install (key `1`, the user's id)
/// and no guild install (key `0`).
#[must_use]
pub fn user_installed(mut interaction: Value) -> Value {
    interaction["authorizing_integration_owners"] = json!({"1": ADA});
    interaction
}

/// A press of the button `action` on the bot's message `message_id`, as Discord sends it to the
/// Interactions Endpoint: a component interaction (type 3, `data.component_type` 2) with id
/// `id` and token `token`, by [`ADA`] in the DM fixture's channel (`user`, no `member`, no
/// `guild_id`: "`member` is sent when the interaction is invoked in a guild, and `user` is
/// sent when invoked in a DM").
#[must_use]
pub fn press(id: &str, token: &str, action: &str, message_id: &str) -> Value {
    let mut interaction = fixture("discord_button_guild.json");
    let object = interaction.as_object_mut().expect("an object");
    let member = object.remove("member").expect("the fixture's member");
    for key in ["guild_id", "guild", "guild_locale", "app_permissions"] {
        object.remove(key);
    }
    object.insert("user".to_owned(), member["user"].clone());
    object.insert("channel_id".to_owned(), json!(DM_CHANNEL));
    object.insert(
        "channel".to_owned(),
        json!({"id": DM_CHANNEL, "type": 1, "flags": 0, "last_message_id": null,
               "recipients": [member["user"].clone()]}),
    );
    object.insert("context".to_owned(), json!(1));
    interaction["id"] = json!(id);
    interaction["token"] = json!(token);
    interaction["data"]["custom_id"] = json!(action);
    interaction["message"]["id"] = json!(message_id);
    interaction["message"]["channel_id"] = json!(DM_CHANNEL);
    interaction
}

/// [`press`] in the recorded server channel (`guild_id` 1100000000000000001, channel
/// 1100000000000000050), by [`ADA`] as a member (`member.user`).
#[must_use]
pub fn press_in_server(id: &str, token: &str, action: &str, message_id: &str) -> Value {
    let mut interaction = fixture("discord_button_guild.json");
    interaction["id"] = json!(id);
    interaction["token"] = json!(token);
    interaction["data"]["custom_id"] = json!(action);
    interaction["message"]["id"] = json!(message_id);
    interaction
}

/// `interaction` pressed by the user `user_id` named `name` instead (`member.user` in a
/// server, `user` in a DM).
#[must_use]
pub fn pressed_by(mut interaction: Value, user_id: &str, name: &str) -> Value {
    let user = if interaction.get("member").is_some() {
        &mut interaction["member"]["user"]
    } else {
        &mut interaction["user"]
    };
    user["id"] = json!(user_id);
    user["username"] = json!(name);
    user["global_name"] = json!(name);
    interaction
}

/// The buttons of a message body the bot sent: its `components`' action rows' buttons, as
/// (label, style, `custom_id`).
#[must_use]
pub fn buttons_of(body: &Value) -> Vec<(String, u64, String)> {
    body["components"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|row| row["components"].as_array().cloned().unwrap_or_default())
        .map(|button| {
            (
                button["label"].as_str().unwrap_or_default().to_owned(),
                button["style"].as_u64().unwrap_or_default(),
                button["custom_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A message of the bot's as the API returns it.
#[must_use]
pub fn message(id: &str) -> Value {
    json!({
        "id": id, "channel_id": DM_CHANNEL,
        "author": {"id": APPLICATION_ID, "username": "antler", "discriminator": "0",
                   "global_name": null, "avatar": null, "bot": true},
        "content": "ok", "timestamp": "2026-01-01T00:00:00.000000+00:00",
        "edited_timestamp": null, "tts": false, "mention_everyone": false, "mentions": [],
        "mention_roles": [], "attachments": [], "embeds": [], "pinned": false, "type": 0
    })
}

/// A mock Discord HTTP API on 127.0.0.1 (`/api/v10/…`): accepts every edit of a deferred
/// response, every follow-up and every bot message, and records every request.
#[derive(Debug)]
pub struct MockDiscord {
    server: MockServer,
}

impl std::ops::Deref for MockDiscord {
    type Target = MockServer;

    fn deref(&self) -> &MockServer {
        &self.server
    }
}

impl MockDiscord {
    /// The API, accepting every interaction-webhook edit and follow-up and every bot message.
    pub async fn start() -> Self {
        let server = Self::empty().await;
        let answer = |http_method: &str, route: &str, id: &str| {
            Mock::given(method(http_method))
                .and(path_regex(route))
                .respond_with(ResponseTemplate::new(200).set_body_json(message(id)))
        };
        answer(
            "PATCH",
            r"^/api/v10/webhooks/\d+/[^/]+/messages/@original$",
            ORIGINAL_ID,
        )
        .mount(&server)
        .await;
        answer(
            "POST",
            r"^/api/v10/webhooks/\d+/[^/]+$",
            "1500000000000000002",
        )
        .mount(&server)
        .await;
        answer(
            "POST",
            r"^/api/v10/channels/\d+/messages$",
            "1500000000000000003",
        )
        .mount(&server)
        .await;
        // "Interaction Callback: Create a response to an Interaction. Returns 204 unless
        // `with_response` is set to `true`."
        Mock::given(method("POST"))
            .and(path_regex(r"^/api/v10/interactions/\d+/[^/]+/callback$"))
            .respond_with(ResponseTemplate::new(204))
            .mount(&server)
            .await;
        server
    }

    /// The API knowing nothing: every route is for the test to mount.
    pub async fn empty() -> Self {
        Self {
            server: MockServer::start().await,
        }
    }

    /// The `[channels.discord]` config for this API, with `more` lines.
    #[must_use]
    pub fn config(&self, more: &str) -> String {
        format!(
            "[channels.discord]\nenabled = true\napplication_id = \"{APPLICATION_ID}\"\n\
             public_key = \"{}\"\nbot_token = \"{BOT_TOKEN}\"\napi_url = \"{}\"\n{}{more}",
            public_key_hex(),
            self.server.uri(),
            crate::open_unless_listed(more)
        )
    }

    /// Every call: (method, path, JSON body).
    pub async fn calls(&self) -> Vec<(String, String, Value)> {
        crate::calls_of(&self.server)
            .await
            .into_iter()
            .map(|c| (c.method, c.path, c.body))
            .collect()
    }

    /// The bodies of every edit of the deferred response of the interaction `token`.
    pub async fn edits_of_original(&self, token: &str) -> Vec<Value> {
        let original = format!("/api/v10/webhooks/{APPLICATION_ID}/{token}/messages/@original");
        self.calls()
            .await
            .into_iter()
            .filter(|(m, p, _)| m == "PATCH" && *p == original)
            .map(|(_, _, body)| body)
            .collect()
    }

    /// The bodies of every follow-up of the interaction `token`.
    pub async fn follow_ups(&self, token: &str) -> Vec<Value> {
        let webhook = format!("/api/v10/webhooks/{APPLICATION_ID}/{token}");
        self.calls()
            .await
            .into_iter()
            .filter(|(m, p, _)| m == "POST" && *p == webhook)
            .map(|(_, _, body)| body)
            .collect()
    }

    /// Waits until the deferred response of `token` was edited; its edits.
    pub async fn wait_for_edit(&self, token: &str) -> Vec<Value> {
        crate::wait_for_at_least("the deferred response edited", 1, || {
            self.edits_of_original(token)
        })
        .await
    }

    /// Refuses the next request on `route` (a path regex) as Discord does: HTTP 429 with
    /// `Retry-After` (`header_secs`), the bucket spent (`X-RateLimit-Remaining: 0`,
    /// `X-RateLimit-Reset-After`), scope `user`, and the body's float `retry_after`
    /// (`body_secs`) (protocols.md §3.4).
    pub async fn rate_limit_next(&self, route: &str, header_secs: u64, body_secs: f64) {
        Mock::given(path_regex(route))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("Retry-After", header_secs.to_string().as_str())
                    .insert_header("X-RateLimit-Limit", "5")
                    .insert_header("X-RateLimit-Remaining", "0")
                    .insert_header("X-RateLimit-Reset-After", body_secs.to_string().as_str())
                    .insert_header("X-RateLimit-Scope", "user")
                    .set_body_json(json!({
                        "message": "You are being rate limited.",
                        "retry_after": body_secs, "global": false
                    })),
            )
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// Limits the follow-ups of the interaction `token` as Discord does for an app installed
    /// to the user only: "Apps installed to a user ... are limited to 5 followup messages per
    /// interaction". A sixth is refused (HTTP 400; the exact error body is not documented).
    pub async fn limit_follow_ups(&self, token: &str) {
        let webhook = format!("^/api/v10/webhooks/{APPLICATION_ID}/{token}$");
        Mock::given(method("POST"))
            .and(path_regex(webhook.as_str()))
            .respond_with(ResponseTemplate::new(200).set_body_json(message("1500000000000000002")))
            .up_to_n_times(5)
            .with_priority(2)
            .mount(&self.server)
            .await;
        Mock::given(method("POST"))
            .and(path_regex(webhook.as_str()))
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                "message": "Maximum number of follow-up messages reached"
            })))
            .with_priority(3)
            .mount(&self.server)
            .await;
    }

    /// Answers every request on the interaction webhook of `token` as Discord does once it
    /// no longer knows it: HTTP 404 `{"message": "Unknown Webhook", "code": 10015}`.
    pub async fn forget_webhook(&self, token: &str) {
        Mock::given(path_regex(format!(
            "^/api/v10/webhooks/{APPLICATION_ID}/{token}(/.*)?$"
        )))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({
            "message": "Unknown Webhook", "code": 10015
        })))
        .with_priority(1)
        .mount(&self.server)
        .await;
    }

    /// Answers every request on the interaction webhook of `token` with a 2xx whose body
    /// lacks fields a message object has (`author`, `timestamp`, …): the id only for edits of
    /// `@original`, nothing at all for follow-ups. The messages are created all the same.
    pub async fn answer_sparsely(&self, token: &str) {
        Mock::given(method("PATCH"))
            .and(path_regex(format!(
                "^/api/v10/webhooks/{APPLICATION_ID}/{token}/messages/@original$"
            )))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": ORIGINAL_ID})))
            .with_priority(1)
            .mount(&self.server)
            .await;
        Mock::given(method("POST"))
            .and(path_regex(format!(
                "^/api/v10/webhooks/{APPLICATION_ID}/{token}$"
            )))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"flags": 0})))
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    /// The bodies of every message the bot sent or edited with buttons under it (with
    /// `components` that are not empty), in order.
    pub async fn messages_with_buttons(&self) -> Vec<Value> {
        self.calls()
            .await
            .into_iter()
            .filter(|(_, p, body)| !p.contains("/callback") && !buttons_of(body).is_empty())
            .map(|(_, _, body)| body)
            .collect()
    }

    /// Every interaction callback (`POST /interactions/{id}/{token}/callback`, how an
    /// interaction received over the Gateway is answered): (interaction id, body).
    pub async fn interaction_callbacks(&self) -> Vec<(String, Value)> {
        self.calls()
            .await
            .into_iter()
            .filter(|(m, p, _)| m == "POST" && p.ends_with("/callback"))
            .map(|(_, path, body)| {
                let id = path
                    .trim_start_matches("/api/v10/interactions/")
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                (id, body)
            })
            .collect()
    }

    /// The bodies of every message the bot created in a channel with its token.
    pub async fn channel_messages(&self) -> Vec<Value> {
        self.calls()
            .await
            .into_iter()
            .filter(|(m, p, _)| {
                m == "POST" && p.starts_with("/api/v10/channels/") && p.ends_with("/messages")
            })
            .map(|(_, _, body)| body)
            .collect()
    }

    /// Answers the Gateway's address (`GET /gateway` for one shard, `/gateway/bot` when
    /// sharding automatically) with `url`.
    pub async fn serve_gateway_url(&self, url: &str) {
        Mock::given(method("GET"))
            .and(path_regex(r"^/api/v10/gateway(/bot)?$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "url": url, "shards": 1,
                "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0,
                                        "max_concurrency": 1}
            })))
            .mount(&self.server)
            .await;
    }
}

#[async_trait::async_trait]
impl MockApi for MockDiscord {
    async fn start() -> Self {
        Self::start().await
    }

    fn server(&self) -> &MockServer {
        &self.server
    }

    /// Edits of the deferred response and of messages, follow-ups and bot messages.
    fn written_by(call: &Call) -> Option<Written> {
        let message =
            call.path.contains("/messages") || call.path.starts_with("/api/v10/webhooks/");
        message.then(|| Written {
            edit: call.method == "PATCH",
            text: call.body["content"].as_str().unwrap_or_default().to_owned(),
        })
    }

    fn message_id(&self) -> String {
        ORIGINAL_ID.to_owned()
    }

    async fn rate_limit_next_message(&self, retry_after_secs: u64) {
        // The deferred response is what a reply's first part edits.
        self.rate_limit_next(
            r"/messages/@original$",
            retry_after_secs,
            retry_after_secs as f64,
        )
        .await;
    }
}

/// Discord's protocol facts for the conformance list.
#[derive(Debug)]
pub struct Discord;

impl Platform for Discord {
    type Mock = MockDiscord;

    const NAME: &'static str = "discord";

    /// Discord documents no window; antler allows five minutes, as Slack does.
    const REPLAY_WINDOW: Option<Duration> = Some(Duration::from_secs(300));

    fn sign(body: &[u8], at_secs: u64) -> http::HeaderMap {
        signed_headers(&key(), at_secs, body)
    }

    fn vectors() -> Vec<Vector> {
        [
            "discord_ping.json",
            "discord_slash_guild.json",
            "discord_button_guild.json",
        ]
        .into_iter()
        .map(|name| {
            let meta = fixture(&format!("{name}.meta.json"));
            assert_eq!(meta["public_key_hex"], public_key_hex());
            let header = |h: &str| meta["headers"][h].as_str().unwrap_or_default().to_owned();
            Vector {
                name,
                body: crate::fixture_bytes("discord", &format!("{name}.body")),
                headers: crate::headers([
                    (TIMESTAMP_HEADER, header("X-Signature-Timestamp").as_str()),
                    (SIGNATURE_HEADER, header("X-Signature-Ed25519").as_str()),
                ]),
            }
        })
        .collect()
    }

    fn fixtures() -> Vec<Fixture> {
        let interaction = |name, expect| Fixture {
            route: "interactions",
            name,
            expect,
        };
        vec![
            interaction("discord_ping.json", Expect::Reply(json!({"type": 1}))),
            interaction("discord_slash_guild.json", Expect::EventsWithReply(1)),
            interaction("discord_slash_dm.json", Expect::EventsWithReply(1)),
        ]
    }

    fn answered() -> Fixture {
        Fixture {
            route: "interactions",
            name: "discord_slash_dm.json",
            expect: Expect::EventsWithReply(1),
        }
    }
}

/// A Discord Gateway on 127.0.0.1: HELLO; IDENTIFY gets READY and then `message_create`;
/// the first session is then told to reconnect (op 7) and closed; a RESUME gets the same
/// `message_create` again (a replay, as Discord does for events it is unsure were received)
/// and RESUMED. Returns its `ws://` URL and how many times it sent the `message_create`.
pub async fn mock_gateway(message_create: Value) -> (String, Arc<AtomicUsize>) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Ws;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gateway");
    let url = format!("ws://{}", listener.local_addr().expect("its address"));
    let sent = Arc::new(AtomicUsize::new(0));
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
                    let payload: Value = serde_json::from_str(&text).expect("Gateway JSON");
                    match payload["op"].as_u64() {
                        Some(1) => {
                            let _ = ws
                                .send(send(json!({"op": 11, "d": null, "s": null, "t": null})))
                                .await;
                        }
                        Some(2) => {
                            let ready = ready();
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

/// A Discord Gateway on 127.0.0.1 that stays connected: HELLO; IDENTIFY gets READY and then
/// `message_create`; after that, every interaction sent on the returned sender is dispatched
/// as INTERACTION_CREATE (how Discord delivers interactions to an app with no Interactions
/// Endpoint URL). Returns its `ws://` URL and the sender.
pub async fn mock_gateway_with_interactions(
    message_create: Value,
) -> (String, tokio::sync::mpsc::UnboundedSender<Value>) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Ws;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gateway");
    let url = format!("ws://{}", listener.local_addr().expect("its address"));
    let (sender, mut interactions) = tokio::sync::mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        // One session: the interactions go to whichever connected last.
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                continue;
            };
            let send = |value: Value| Ws::Text(value.to_string());
            let _ = ws
                .send(send(
                    json!({"op": 10, "d": {"heartbeat_interval": 45000}, "s": null, "t": null}),
                ))
                .await;
            let dispatch = |s: u64, t: &str, d: Value| json!({"op": 0, "s": s, "t": t, "d": d});
            let mut seq = 0;
            let mut identified = false;
            loop {
                tokio::select! {
                    frame = ws.next() => {
                        let Some(Ok(Ws::Text(text))) = frame else { break };
                        let payload: Value = serde_json::from_str(&text).expect("Gateway JSON");
                        match payload["op"].as_u64() {
                            Some(1) => {
                                let _ = ws
                                    .send(send(json!({"op": 11, "d": null, "s": null, "t": null})))
                                    .await;
                            }
                            Some(2) => {
                                let ready = ready();
                                seq += 1;
                                let _ = ws.send(send(dispatch(seq, "READY", ready))).await;
                                seq += 1;
                                let _ = ws
                                    .send(send(dispatch(seq, "MESSAGE_CREATE", message_create.clone())))
                                    .await;
                                identified = true;
                            }
                            _ => {}
                        }
                    }
                    interaction = interactions.recv(), if identified => {
                        let Some(interaction) = interaction else { break };
                        seq += 1;
                        let _ = ws
                            .send(send(dispatch(seq, "INTERACTION_CREATE", interaction)))
                            .await;
                    }
                }
            }
        }
    });
    (url, sender)
}

/// The Gateway's READY for the bot (`APPLICATION_ID`), as the mock Gateways send it.
fn ready() -> Value {
    json!({
        "v": 10, "session_id": "session-1",
        "resume_gateway_url": "ws://127.0.0.1:9",
        "user": {"id": APPLICATION_ID, "username": "antler",
                 "discriminator": "0", "global_name": null,
                 "avatar": null, "bot": true, "verified": true,
                 "mfa_enabled": false, "flags": 0},
        "guilds": [], "shard": [0, 1],
        "application": {"id": APPLICATION_ID, "flags": 0}
    })
}
