//! Feishu approval buttons end to end (issue 26): with `[approvals] tools = ["current_time"]`
//! the mock model's tool call is shown as an interactive card with Approve and Deny buttons
//! (a reply on the mock Open Platform); a press comes back as a `card.action.trigger` callback
//! on `/webhooks/feishu/events` (plain, or encrypted and signed) or as a `card` frame on the
//! long connection, and is answered in the callback's response: a toast for the presser
//! alone and, once decided, the card replaced without its buttons. A non-approver's press
//! changes nothing; an approver's runs the tool exactly once however often it is delivered,
//! and the final answer follows; a press after a restart still resumes the call.
//!
//! Feishu's "Card callback communication" page: the response to a callback is
//! `{"toast": {"type": "success|error|info|warning", "content": …}, "card": {"type": "raw",
//! "data": <card JSON>}}`, within 3 seconds; `card` replaces the card the button is on.

use antler_testkit::feishu::{
    ADA, ENCRYPT_KEY, GROUP_MESSAGE, MockFeishu, P2P_MESSAGE, REPLY_ID, buttons, card_action,
    fixture, post_raw, sealed_body, shown, signed_headers,
};
use antler_testkit::feishu_socket::client_config;
use antler_testkit::now_secs;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{TestApp, searchable_tempdir, wait_until};

/// The approver's open_id (an admin of the channel).
const BOSS: &str = "ou_b0550000000000000000000000000b055";
/// The p2p fixture's chat.
const P2P_CHAT: &str = "oc_p2p0000111122223333444455556666";
/// The group fixture's chat.
const GROUP_CHAT: &str = "oc_5ad11d72b830411d72b836c20b1c9d1f";

/// `[approvals]` for `current_time`, decided by `approvers` (a TOML value).
fn approvals(approvers: &str) -> String {
    format!("\n[approvals]\ntools = [\"current_time\"]\napprovers = {approvers}\n")
}

/// The reply holding buttons, once one was sent: (its body, its buttons).
async fn prompt(api: &MockFeishu) -> (Value, Vec<Value>) {
    wait_until("a reply with buttons", || async {
        api.replies().await.into_iter().find_map(|(_, body)| {
            let row = buttons(&body);
            (!row.is_empty()).then_some((body, row))
        })
    })
    .await
}

/// Posts `callback` to the events URL (plain); the status and the JSON answer.
async fn press(app: &TestApp, callback: &Value) -> (StatusCode, Value) {
    let answered = post_raw(
        &app.base,
        callback.to_string().into_bytes(),
        &http::HeaderMap::new(),
    )
    .await;
    let status = answered.status;
    (status, answered.json())
}

/// Waits for the final answer: the resumed turn has no user message to reply to, so it posts
/// to a private chat and replies to a group conversation's topic root. Its text and where it
/// went: the chat id, or `reply:<message id>`.
async fn final_answer(api: &MockFeishu) -> (String, String) {
    wait_until("the final answer", || async {
        let posted = api
            .calls("POST", "/open-apis/im/v1/messages")
            .await
            .into_iter()
            .map(|(_, body)| {
                let chat = body["receive_id"].as_str().unwrap_or_default().to_owned();
                (shown(&body), chat)
            });
        let replied = api.replies().await.into_iter().map(|(path, body)| {
            let to = path
                .trim_end_matches("/reply")
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            (shown(&body), format!("reply:{to}"))
        });
        posted
            .chain(replied)
            .find(|(text, _)| text.contains("The time is "))
    })
    .await
}

/// Ada asks in her private chat (the p2p thread-reply fixture), unencrypted.
async fn ask_in_private(app: &TestApp) {
    let asked = post_raw(
        &app.base,
        fixture("feishu_im_p2p_thread_reply.json")
            .to_string()
            .into_bytes(),
        &http::HeaderMap::new(),
    )
    .await;
    assert_eq!(asked.status, StatusCode::OK);
}

/// The card a callback's answer puts in place of the pressed one: its Markdown.
fn settled_text(answer: &Value) -> String {
    assert_eq!(answer["card"]["type"], "raw", "{answer}");
    let elements = answer["card"]["data"]["elements"].as_array().unwrap();
    assert!(
        elements.iter().all(|e| e["tag"] != "action"),
        "no buttons left: {answer}"
    );
    antler_testkit::feishu::decode_entities(elements[0]["content"].as_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_approvers_press_runs_the_call_once_and_the_card_shows_who_decided() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockFeishu::start().await;
    let config = api.config(&format!("admins = [\"{BOSS}\"]\n")) + &approvals("\"admins\"");
    let app = TestApp::spawn(&model, &config).await;
    ask_in_private(&app).await;

    // The call is shown as a reply card with Approve and Deny under it.
    let (card, row) = prompt(&api).await;
    assert_eq!(card["msg_type"], "interactive");
    assert!(
        shown(&card).contains("Approval needed: current_time"),
        "{card}"
    );
    assert_eq!(row.len(), 2);
    assert_eq!(row[0]["text"]["content"], "✅ Approve");
    assert_eq!(row[0]["type"], "primary");
    assert_eq!(row[1]["text"]["content"], "❌ Deny");
    assert_eq!(row[1]["type"], "danger");
    let approve = row[0]["value"].clone();
    assert!(
        approve["action"].as_str().unwrap().starts_with("approve:"),
        "{approve}"
    );
    assert!(approve.get("root").is_none(), "a private chat has no topic");
    let replies = api.replies().await;
    assert!(
        replies
            .iter()
            .all(|(path, _)| path == &format!("/open-apis/im/v1/messages/{P2P_MESSAGE}/reply"))
    );
    app.wait_idle().await;
    assert_eq!(model.count(), 1);

    // Ada asked, but is no approver: refused in a toast only she sees, the card stays.
    let by_ada = card_action("ev-press-ada", &approve, (ADA, "ada01"), REPLY_ID, P2P_CHAT);
    let (status, answer) = press(&app, &by_ada).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["toast"]["type"], "error", "{answer}");
    assert!(
        answer["toast"]["content"]
            .as_str()
            .unwrap()
            .contains("only approvers can decide"),
        "{answer}"
    );
    assert!(answer.get("card").is_none(), "nothing changes: {answer}");
    app.wait_idle().await;
    assert_eq!(model.count(), 1, "the tool did not run");
    assert!(api.calls("PATCH", REPLY_ID).await.is_empty(), "not edited");

    // The admin approves: a toast for them, the card replaced with the decision.
    let by_boss = card_action(
        "ev-press-boss",
        &approve,
        (BOSS, "boss01"),
        REPLY_ID,
        P2P_CHAT,
    );
    let (status, answer) = press(&app, &by_boss).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    assert!(
        answer["toast"]["content"]
            .as_str()
            .unwrap()
            .starts_with("✅ Approved current_time"),
        "plain text in the toast: {answer}"
    );
    let settled = settled_text(&answer);
    assert!(
        settled.contains(&format!("✅ Approved by feishu:{BOSS}")),
        "{settled}"
    );

    // The same callback again (Feishu's redelivery), and a second press: the decision
    // stands, the card is the same, nothing runs again.
    for (event_id, who) in [("ev-press-boss", BOSS), ("ev-press-boss-2", BOSS)] {
        let again = card_action(event_id, &approve, (who, "boss01"), REPLY_ID, P2P_CHAT);
        let (status, answer) = press(&app, &again).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["toast"]["type"], "info", "nothing changed: {answer}");
        assert!(
            answer["toast"]["content"]
                .as_str()
                .unwrap()
                .contains("already; nothing changed"),
            "{answer}"
        );
        assert_eq!(settled_text(&answer), settled);
    }

    // The tool ran once and the final answer followed as a reply to Ada's message.
    let (answer, chat) = final_answer(&api).await;
    assert!(
        answer.contains(&format!("approved by feishu:{BOSS}")),
        "{answer}"
    );
    assert_eq!(chat, P2P_CHAT);
    app.wait_idle().await;
    assert_eq!(model.count(), 2, "one request before, one after the call");
    assert_eq!(model.tool_results().len(), 1, "the tool ran exactly once");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_deny_in_a_group_topic_is_decided_there_and_the_model_is_told() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockFeishu::start().await;
    let config = api.config(&format!("encrypt_key = \"{ENCRYPT_KEY}\"\n"))
        + &approvals(&format!("[\"feishu:{BOSS}\"]"));
    let app = TestApp::spawn(&model, &config).await;
    let sealed = |plain: &Value| {
        let body = sealed_body(plain.to_string().as_bytes(), ENCRYPT_KEY);
        let headers = signed_headers(ENCRYPT_KEY, now_secs(), "n0nce", &body);
        (body, headers)
    };
    let (body, headers) = sealed(&fixture("feishu_im_group_mention.json"));
    wait_until("the mention taken (once the bot knows itself)", || async {
        let answered = post_raw(&app.base, body.clone(), &headers).await;
        (answered.status == StatusCode::OK).then_some(())
    })
    .await;

    let (_, row) = prompt(&api).await;
    let deny = row[1]["value"].clone();
    assert_eq!(deny["root"], GROUP_MESSAGE, "the card names its topic");
    assert!(deny["action"].as_str().unwrap().starts_with("deny:"));

    // A press whose signature does not match: refused before anything is decided.
    let callback = card_action("ev-deny", &deny, (BOSS, "boss01"), REPLY_ID, GROUP_CHAT);
    let (body, mut headers) = sealed(&callback);
    let good = headers.clone();
    headers.insert(
        antler_testkit::feishu::SIGNATURE_HEADER,
        "0".repeat(64).parse().unwrap(),
    );
    let forged = post_raw(&app.base, body.clone(), &headers).await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED);
    app.wait_idle().await;
    assert_eq!(model.count(), 1);

    let answered = post_raw(&app.base, body, &good).await;
    assert_eq!(answered.status, StatusCode::OK);
    let answer = answered.json();
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    let settled = settled_text(&answer);
    assert!(
        settled.contains(&format!("❌ Denied by feishu:{BOSS}")),
        "{settled}"
    );

    // The model is told, and its answer is a reply in the topic.
    let (answer, to) = final_answer(&api).await;
    assert!(answer.contains("denied by"), "{answer}");
    assert_eq!(to, format!("reply:{GROUP_MESSAGE}"));
    let replies = api.replies().await;
    assert!(
        replies
            .iter()
            .all(|(path, _)| path == &format!("/open-apis/im/v1/messages/{GROUP_MESSAGE}/reply")),
        "{replies:?}"
    );
    app.wait_idle().await;
    assert_eq!(model.count(), 2);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_long_connection_a_card_frame_is_answered_with_the_toast_and_card() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockFeishu::start().await;
    let socket = api.serve_socket(client_config()).await;
    let config = api.socket_config(&format!("admins = [\"{BOSS}\"]\n")) + &approvals("\"admins\"");
    let app = TestApp::spawn(&model, &config).await;
    socket
        .send_event("frame-ask", &fixture("feishu_im_p2p_thread_reply.json"))
        .await;
    let (_, row) = prompt(&api).await;
    let approve = row[0]["value"].clone();

    // A stranger's press: answered 200 with an error toast, nothing else.
    let by_ada = card_action("ev-ws-ada", &approve, (ADA, "ada01"), REPLY_ID, P2P_CHAT);
    socket.send_card("frame-ada", &by_ada).await;
    let refused = wait_until("the refusal's answer", || async {
        socket
            .answers()
            .into_iter()
            .find(|a| a.header("message_id") == Some("frame-ada"))
    })
    .await;
    assert_eq!(refused.header("type"), Some("card"));
    assert_eq!(refused.json()["code"], 200);
    let data = refused.data();
    assert_eq!(data["toast"]["type"], "error", "{data}");
    assert!(data.get("card").is_none());
    app.wait_idle().await;
    assert_eq!(model.count(), 1);

    // The admin's press, delivered twice: decided once, the card replaced both times.
    for (frame, toast) in [("frame-boss", "success"), ("frame-boss-again", "info")] {
        let by_boss = card_action("ev-ws-boss", &approve, (BOSS, "boss01"), REPLY_ID, P2P_CHAT);
        socket.send_card(frame, &by_boss).await;
        let answered = wait_until("the press's answer", || async {
            socket
                .answers()
                .into_iter()
                .find(|a| a.header("message_id") == Some(frame))
        })
        .await;
        let data = answered.data();
        assert_eq!(data["toast"]["type"], toast, "{data}");
        assert!(settled_text(&data).contains("Approved by"), "{data}");
    }
    let (answer, _) = final_answer(&api).await;
    assert!(answer.contains("approved by"), "{answer}");
    app.wait_idle().await;
    assert_eq!(model.count(), 2);
    assert_eq!(model.tool_results().len(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_after_a_restart_still_resumes_the_call() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockFeishu::start().await;
    let config = api.config(&format!("admins = [\"{BOSS}\"]\n")) + &approvals("\"admins\"");
    let dir = searchable_tempdir();
    let store = dir.path().join("store");
    let app = TestApp::start(&model, &store, &config).await;
    ask_in_private(&app).await;
    let (_, row) = prompt(&api).await;
    let approve = row[0]["value"].clone();
    app.wait_idle().await;
    app.shutdown().await;

    // The button's card outlives antler: a press after the restart is decided and resumes.
    let app = TestApp::start(&model, &store, &config).await;
    let by_boss = card_action("ev-after", &approve, (BOSS, "boss01"), REPLY_ID, P2P_CHAT);
    let (status, answer) = press(&app, &by_boss).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    assert!(settled_text(&answer).contains("Approved by"), "{answer}");
    let (answer, chat) = final_answer(&api).await;
    assert!(answer.contains("approved by"), "{answer}");
    assert_eq!(chat, P2P_CHAT);
    app.wait_idle().await;
    assert_eq!(model.count(), 2);
    assert_eq!(model.tool_results().len(), 1);
    app.shutdown().await;
}
