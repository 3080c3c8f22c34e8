//! Feishu / Lark end to end: events in through `POST /webhooks/feishu/events` (plain with the
//! verification token, and AES-encrypted and signed with an Encrypt Key), the real runtime with
//! the mock model, answers out to a mock Open Platform (tenant token, bot info, reply, patch).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, Client, TestApp, wait_until};

const APP_ID: &str = "cli_a1b2c3d4e5f60001";
const APP_SECRET: &str = "feishu-APP-secret-0001";
const VERIFICATION_TOKEN: &str = "vTok3nFixture0001";
const TENANT_TOKEN: &str = "t-TENANT-token-0001";
/// The bot's open_id, as the group fixture mentions it.
const BOT_OPEN_ID: &str = "ou_b07b07b07b07b07b07b07b07b07b07b0";
/// The sender of both fixtures.
const ADA: &str = "ou_7d8a6e6df7621556ce0d21922b676706";
const GROUP_MESSAGE: &str = "om_dc13264520392913993dd051dba21dcf";
const P2P_MESSAGE: &str = "om_11112222333344445555666677778888";

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/channels/feishu/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// An Open Platform that issues a token, knows the bot and accepts every reply and patch.
async fn feishu_api() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/open-apis/auth/v3/tenant_access_token/internal"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "code": 0, "msg": "ok", "tenant_access_token": TENANT_TOKEN, "expire": 7200
        })))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/open-apis/bot/v3/info"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "code": 0, "msg": "ok",
            "bot": {"activate_status": 2, "app_name": "OpsBot", "open_id": BOT_OPEN_ID}
        })))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex("^/open-apis/im/v1/messages/[^/]+/reply$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "code": 0, "msg": "success",
            "data": {"message_id": "om_reply000000000000000000000001", "chat_id": "oc_x",
                     "msg_type": "interactive", "create_time": "1767225601000"}
        })))
        .mount(&server)
        .await;
    Mock::given(method("PATCH"))
        .and(path_regex("^/open-apis/im/v1/messages/[^/]+$"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"code": 0, "msg": "success"})),
        )
        .mount(&server)
        .await;
    server
}

fn overrides(api: &MockServer, extra: &str) -> String {
    format!(
        "[channels.feishu]\nenabled = true\napp_id = \"{APP_ID}\"\napp_secret = \"{APP_SECRET}\"\n\
         verification_token = \"{VERIFICATION_TOKEN}\"\napi_url = \"{}\"\n{extra}",
        api.uri()
    )
}

async fn app(model: &MockModel, api: &MockServer, extra: &str) -> TestApp {
    TestApp::spawn(model, &overrides(api, extra)).await
}

async fn post(client: &Client, body: &Value) -> StatusCode {
    client
        .http
        .post(format!("{}/webhooks/feishu/events", client.base))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
}

/// `event` as another delivery of it: a new event id, everything else the same.
fn resent(event: &Value, event_id: &str) -> Value {
    let mut event = event.clone();
    event["header"]["event_id"] = json!(event_id);
    event
}

/// A message event of `message_type` with `content`, from Ada, in the p2p chat.
fn p2p(message_id: &str, message_type: &str, content: &Value) -> Value {
    let mut event = fixture("feishu_im_p2p_thread_reply.json");
    event["header"]["event_id"] = json!(format!("ev-{message_id}"));
    event["event"]["message"]["message_id"] = json!(message_id);
    event["event"]["message"]["message_type"] = json!(message_type);
    event["event"]["message"]["content"] = json!(content.to_string());
    event
}

/// The requests the Open Platform got whose path matches `suffix`, with their JSON bodies.
async fn calls(api: &MockServer, http_method: &str, suffix: &str) -> Vec<(String, Value)> {
    api.received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.method.as_str() == http_method && r.url.path().ends_with(suffix))
        .map(|r| {
            (
                r.url.path().to_owned(),
                serde_json::from_slice(&r.body).unwrap_or(Value::Null),
            )
        })
        .collect()
}

async fn replies(api: &MockServer) -> Vec<(String, Value)> {
    calls(api, "POST", "/reply").await
}

async fn wait_for_replies(api: &MockServer, n: usize) -> Vec<(String, Value)> {
    wait_until(&format!("{n} replies sent to Feishu"), || async {
        let replies = replies(api).await;
        (replies.len() >= n).then_some(replies)
    })
    .await
}

/// The Markdown a reply or patch body shows: the `content` of its card's markdown element
/// (the card is a JSON string inside the body), or the text of a text message.
fn shown(body: &Value) -> String {
    fn markdown(card: &Value) -> Option<String> {
        match card {
            Value::Object(map) => {
                if map.get("tag").and_then(Value::as_str) == Some("markdown") {
                    return map
                        .get("content")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
                map.values().find_map(markdown)
            }
            Value::Array(items) => items.iter().find_map(markdown),
            _ => None,
        }
    }
    let content: Value = serde_json::from_str(body["content"].as_str().unwrap()).unwrap();
    let shown = markdown(&content)
        .or_else(|| content["text"].as_str().map(str::to_owned))
        .unwrap_or_default();
    decode_entities(&shown)
}

/// Card Markdown with its HTML entities decoded, as Feishu shows it (`&#95;` is `_`).
fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('&') {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let decoded = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            _ => entity
                .strip_prefix('#')
                .and_then(|n| n.parse::<u32>().ok())
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_p2p_message_is_answered_with_the_reply_api_and_the_token_is_reused() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = feishu_api().await;
    let app = app(&model, &api, "").await;
    let event = fixture("feishu_im_p2p_thread_reply.json");
    assert_eq!(post(&app.client, &event).await, StatusCode::OK);
    let replies = wait_for_replies(&api, 1).await;
    assert_eq!(
        replies[0].0,
        format!("/open-apis/im/v1/messages/{P2P_MESSAGE}/reply")
    );
    assert_eq!(replies[0].1["msg_type"], "interactive");
    assert_eq!(shown(&replies[0].1), "echo: and the error rate?");
    // A second message: its reply reuses the cached token.
    let second = p2p("om_second", "text", &json!({"text": "and latency?"}));
    assert_eq!(post(&app.client, &second).await, StatusCode::OK);
    wait_for_replies(&api, 2).await;
    app.wait_idle().await;
    let tokens = calls(&api, "POST", "/tenant_access_token/internal").await;
    assert_eq!(tokens.len(), 1, "one token for everything");
    let authorized = api
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path().ends_with("/reply"))
        .all(|r| r.headers["authorization"] == format!("Bearer {TENANT_TOKEN}").as_str());
    assert!(authorized, "replies carry the tenant token");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_groups_only_mentions_and_commands_are_answered_in_their_topic() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = feishu_api().await;
    let app = app(&model, &api, "").await;
    // No mention, no command: nothing runs.
    let mut plain = fixture("feishu_im_group_mention.json");
    plain["header"]["event_id"] = json!("ev-plain");
    plain["event"]["message"]["message_id"] = json!("om_plain");
    plain["event"]["message"]["content"] = json!(json!({"text": "lunch?"}).to_string());
    plain["event"]["message"]["mentions"] = json!([]);
    assert_eq!(post(&app.client, &plain).await, StatusCode::OK);

    let mention = fixture("feishu_im_group_mention.json");
    assert_eq!(post(&app.client, &mention).await, StatusCode::OK);
    let replies = wait_for_replies(&api, 1).await;
    assert_eq!(
        replies[0].0,
        format!("/open-apis/im/v1/messages/{GROUP_MESSAGE}/reply")
    );
    assert_eq!(
        shown(&replies[0].1),
        "echo: restart web-api",
        "the bot's mention is removed"
    );

    let mut status = plain.clone();
    status["header"]["event_id"] = json!("ev-status");
    status["event"]["message"]["message_id"] = json!("om_status");
    status["event"]["message"]["content"] = json!(json!({"text": "/status"}).to_string());
    assert_eq!(post(&app.client, &status).await, StatusCode::OK);
    let replies = wait_for_replies(&api, 2).await;
    assert_eq!(replies[1].0, "/open-apis/im/v1/messages/om_status/reply");
    assert!(shown(&replies[1].1).contains("Thread:"), "{:?}", replies[1]);
    app.wait_idle().await;
    assert_eq!(model.count(), 1, "only the mention reached the model");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_and_a_resend_with_a_new_event_id_are_answered_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = feishu_api().await;
    let app = app(&model, &api, "").await;
    let event = fixture("feishu_im_p2p_thread_reply.json");
    assert_eq!(post(&app.client, &event).await, StatusCode::OK);
    assert_eq!(post(&app.client, &event).await, StatusCode::OK);
    assert_eq!(
        post(&app.client, &resent(&event, "ev-resent-0001")).await,
        StatusCode::OK
    );
    wait_for_replies(&api, 1).await;
    app.wait_idle().await;
    assert_eq!(replies(&api).await.len(), 1);
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_fills_one_card_that_ends_complete() {
    let model = MockModel::start(Behaviour::Trickle {
        pieces: 6,
        every: Duration::from_millis(500),
    })
    .await;
    let api = feishu_api().await;
    let app = app(&model, &api, "").await;
    assert_eq!(
        post(&app.client, &fixture("feishu_im_p2p_thread_reply.json")).await,
        StatusCode::OK
    );
    wait_for_replies(&api, 1).await;
    app.wait_idle().await;
    assert_eq!(replies(&api).await.len(), 1, "one card");
    let patches = calls(&api, "PATCH", "/om_reply000000000000000000000001").await;
    assert!(
        patches.len() >= 2,
        "updated while writing, then finished: {patches:?}"
    );
    assert_eq!(
        shown(&patches.last().unwrap().1),
        "echo: and the error rate?",
        "the last update is the whole answer"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_from_feishu_delays_the_answer_and_it_still_arrives_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = feishu_api().await;
    Mock::given(method("POST"))
        .and(path_regex("/reply$"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("x-ogw-ratelimit-reset", "1")
                .set_body_json(json!({"code": 99991400, "msg": "request trigger frequency limit"})),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&api)
        .await;
    let app = app(&model, &api, "").await;
    assert_eq!(
        post(&app.client, &fixture("feishu_im_p2p_thread_reply.json")).await,
        StatusCode::OK
    );
    let first_try = wait_until("the first attempt", || async {
        (!replies(&api).await.is_empty()).then(Instant::now)
    })
    .await;
    wait_for_replies(&api, 2).await;
    assert!(
        first_try.elapsed() >= Duration::from_millis(900),
        "the reset was waited out"
    );
    app.wait_idle().await;
    assert_eq!(
        replies(&api).await.len(),
        2,
        "one refused attempt, one reply"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_wrong_tokens_and_challenges() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = feishu_api().await;
    let app = app(&model, &api, "allowed_users = [\"ou_someone_else\"]\n").await;
    let mut forged = fixture("feishu_im_p2p_thread_reply.json");
    forged["header"]["token"] = json!("not-the-token");
    assert_eq!(post(&app.client, &forged).await, StatusCode::UNAUTHORIZED);
    let challenge = fixture("feishu_url_verification.json");
    let answer: Value = app
        .client
        .http
        .post(format!("{}/webhooks/feishu/events", app.client.base))
        .body(challenge.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["challenge"], "ajls384kdj1234");
    // Ada is not in the allowlist: one refusal naming her id, no model call.
    assert_eq!(
        post(&app.client, &fixture("feishu_im_p2p_thread_reply.json")).await,
        StatusCode::OK
    );
    let replies = wait_for_replies(&api, 1).await;
    assert!(shown(&replies[0].1).contains(ADA), "{:?}", replies[0]);
    app.wait_idle().await;
    assert_eq!(model.count(), 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_ack_and_a_restart_answer_exactly_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = feishu_api().await;
    let rig = ChildRig::new(&model, &overrides(&api, ""));
    let mut first = rig.serve().await;
    let event = fixture("feishu_im_p2p_thread_reply.json");
    assert_eq!(post(&first.client, &event).await, StatusCode::OK);
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    wait_for_replies(&api, 1).await;
    // Feishu delivers it again, with a new event id: recognised.
    assert_eq!(
        post(&second.client, &resent(&event, "ev-after-crash")).await,
        StatusCode::OK
    );
    second.client.wait_idle().await;
    let replies = replies(&api).await;
    assert_eq!(replies.len(), 1, "{replies:?}\n{}", second.log_text());
}

const ENCRYPT_KEY: &str = "e2e-encrypt-key-0001";

/// `plain` as Feishu sends it with an Encrypt Key: `{"encrypt": base64(iv + AES-256-CBC)}`
/// (key = SHA-256 of the Encrypt Key), and its signature headers made `now`.
fn encrypted(plain: &Value, nonce: &str) -> (String, [(&'static str, String); 3]) {
    use aes::cipher::{BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
    use base64::Engine;
    use sha2::{Digest, Sha256};

    let key: [u8; 32] = Sha256::digest(ENCRYPT_KEY.as_bytes()).into();
    let iv: [u8; 16] = *b"e2e-fixed-iv-016";
    let sealed = cbc::Encryptor::<aes::Aes256>::new(&key.into(), &iv.into())
        .encrypt_padded_vec_mut::<Pkcs7>(plain.to_string().as_bytes());
    let mut payload = iv.to_vec();
    payload.extend(sealed);
    let body =
        json!({"encrypt": base64::engine::general_purpose::STANDARD.encode(payload)}).to_string();
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let signature = hex::encode(Sha256::digest(
        format!("{timestamp}{nonce}{ENCRYPT_KEY}{body}").as_bytes(),
    ));
    (
        body,
        [
            ("X-Lark-Request-Timestamp", timestamp),
            ("X-Lark-Request-Nonce", nonce.to_owned()),
            ("X-Lark-Signature", signature),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_and_signed_events_are_answered_and_forgeries_refused() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = feishu_api().await;
    let app = app(&model, &api, &format!("encrypt_key = \"{ENCRYPT_KEY}\"\n")).await;
    let send = |body: String, headers: Vec<(&'static str, String)>| {
        let mut request = app
            .client
            .http
            .post(format!("{}/webhooks/feishu/events", app.client.base))
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move { request.send().await.unwrap() }
    };
    // The challenge, encrypted (and unsigned, as Feishu may send it).
    let (body, _) = encrypted(&fixture("feishu_url_verification.json"), "n0");
    let answer: Value = send(body, Vec::new()).await.json().await.unwrap();
    assert_eq!(answer["challenge"], "ajls384kdj1234");

    let event = fixture("feishu_im_p2p_thread_reply.json");
    // A plain body where an encrypted one is expected, and a forged signature: 401.
    assert_eq!(
        send(event.to_string(), Vec::new()).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let (body, mut headers) = encrypted(&event, "n1");
    headers[2].1 = "0".repeat(64);
    assert_eq!(
        send(body, headers.to_vec()).await.status(),
        StatusCode::UNAUTHORIZED
    );
    app.wait_idle().await;
    assert!(replies(&api).await.is_empty(), "nothing ran");

    let (body, headers) = encrypted(&event, "n2");
    assert_eq!(send(body, headers.to_vec()).await.status(), StatusCode::OK);
    let replies = wait_for_replies(&api, 1).await;
    assert_eq!(shown(&replies[0].1), "echo: and the error rate?");
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}
