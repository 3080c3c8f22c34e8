//! Approval buttons on Slack end to end (issue 26): a tool call listed in `[approvals] tools`
//! is shown as a message with Block Kit buttons (Approve, Deny) on the mock Web API; presses
//! come back as signed `block_actions` payloads to `POST /webhooks/slack/interactions` (or as
//! `interactive` Socket Mode envelopes) and are answered through the Web API: the presser
//! alone is told (`chat.postEphemeral`), and a decision replaces the message
//! (`chat.update`, buttons gone).
//!
//! The mock model calls `current_time` until a tool result is last, then answers "The time is
//! <result>".

use antler_testkit::slack::{
    APP_TOKEN, CHANNEL, MockSlack, MockSocket, POSTED_TS, PRESSER, REQUESTER, THREAD,
    block_actions, fixture, post_event, post_interaction,
};
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{TestApp, wait_until};

/// Approvals for `current_time`, decided by [`PRESSER`] alone.
fn approvals() -> String {
    format!(
        "\n[approvals]\ntools = [\"current_time\"]\napprovers = [\"slack:{PRESSER}\"]\n\
         timeout_secs = 900\n"
    )
}

/// The prompt: the first message posted with blocks.
async fn prompt(api: &MockSlack) -> Value {
    wait_until("the prompt with its buttons", || async {
        api.posted()
            .await
            .into_iter()
            .find(|post| post.get("blocks").is_some())
    })
    .await
}

/// The actions of the prompt's buttons, Approve first.
fn actions(prompt: &Value) -> Vec<String> {
    let blocks = prompt["blocks"].as_array().unwrap();
    let row = blocks.last().unwrap();
    assert_eq!(row["type"], "actions", "{prompt}");
    row["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|button| {
            assert_eq!(button["type"], "button");
            assert_eq!(button["action_id"], button["value"]);
            button["value"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The `chat.update`s that replaced a message's blocks (a live draft's edits have none).
async fn replaced(api: &MockSlack) -> Vec<Value> {
    api.updates()
        .await
        .into_iter()
        .filter(|update| update.get("blocks").is_some())
        .collect()
}

/// Whether `message` is (a draft of) the resumed turn's answer: the decision, then the
/// model's "The time is …".
fn is_answer(message: &Value) -> bool {
    message.get("blocks").is_none()
        && message["text"]
            .as_str()
            .is_some_and(|text| text.contains("The time is"))
}

/// The final answer, once posted (or its draft edited into it).
async fn final_answer(api: &MockSlack) -> Value {
    wait_until("the final answer", || async {
        let mut written = api.posted().await;
        written.extend(api.updates().await);
        written.into_iter().find(is_answer)
    })
    .await
}

/// Slack ("Handling user interaction"): the app must answer a `block_actions` request with
/// HTTP 200 within 3 seconds; antler answers with an empty body and says the rest through
/// the Web API.
async fn press(app: &TestApp, user: &str, action: &str) {
    let payload = block_actions(user, action, POSTED_TS, Some(THREAD));
    let (status, body) = post_interaction(&app.base, &payload).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "", "an empty 200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_approvers_press_runs_the_call_once_and_replaces_the_buttons() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockSlack::start().await;
    let app = TestApp::spawn(&model, &format!("{}{}", api.config(""), approvals())).await;
    assert_eq!(
        post_event(&app.base, &fixture("slack_app_mention_thread.json")).await,
        StatusCode::OK
    );

    // The call is shown in the user's thread with Approve and Deny.
    let prompt = prompt(&api).await;
    assert_eq!(prompt["channel"], CHANNEL);
    assert_eq!(prompt["thread_ts"], THREAD);
    let text = prompt["text"].as_str().unwrap();
    assert!(text.contains("Approval needed: current_time"), "{text}");
    assert!(
        text.contains(&format!("asked by slack:{REQUESTER}")),
        "{text}"
    );
    assert_eq!(prompt["blocks"][0]["type"], "section");
    let actions = actions(&prompt);
    assert_eq!(actions.len(), 2, "{prompt}");
    assert!(actions[0].starts_with("approve:") && actions[1].starts_with("deny:"));
    assert_eq!(prompt["blocks"][1]["elements"][0]["style"], "primary");
    assert_eq!(prompt["blocks"][1]["elements"][1]["style"], "danger");
    app.wait_idle().await;
    assert_eq!(model.count(), 1);

    // The requester is no approver: told so privately, nothing else changes.
    press(&app, REQUESTER, &actions[0]).await;
    let told = api.wait_for_ephemerals(1).await;
    assert_eq!(told[0]["user"], REQUESTER);
    assert_eq!(told[0]["channel"], CHANNEL);
    assert_eq!(told[0]["thread_ts"], THREAD);
    assert!(
        told[0]["text"]
            .as_str()
            .unwrap()
            .contains("only approvers can decide"),
        "{told:?}"
    );
    app.wait_idle().await;
    assert!(replaced(&api).await.is_empty(), "the message is unchanged");
    assert_eq!(model.count(), 1, "the tool did not run");

    // The approver, and the same press delivered again: decided once, run once.
    press(&app, PRESSER, &actions[0]).await;
    press(&app, PRESSER, &actions[0]).await;
    let answer = final_answer(&api).await;
    assert_eq!(answer["thread_ts"], THREAD);
    let told = api.wait_for_ephemerals(3).await;
    assert!(told[1..].iter().all(|t| t["user"] == PRESSER), "{told:?}");
    assert!(
        told[1]["text"].as_str().unwrap().starts_with("✅ Approved"),
        "{told:?}"
    );
    assert!(
        told[2]["text"].as_str().unwrap().contains("already"),
        "{told:?}"
    );
    app.wait_idle().await;
    assert_eq!(model.count(), 2, "one resumed turn");
    assert_eq!(model.tool_results().len(), 1, "the tool ran once");

    // The message now says who decided, its buttons gone (each press set it so).
    let replaced = replaced(&api).await;
    assert!(!replaced.is_empty());
    for update in &replaced {
        assert_eq!(update["channel"], CHANNEL);
        assert_eq!(update["ts"], POSTED_TS);
        let text = update["text"].as_str().unwrap();
        assert!(
            text.contains(&format!("Approved by grace (slack:{PRESSER})")),
            "{text}"
        );
        let blocks = update["blocks"].as_array().unwrap();
        assert!(blocks.iter().all(|b| b["type"] == "section"), "{update}");
    }
    let answers = api.posted().await.into_iter().filter(is_answer).count();
    assert_eq!(answers, 1, "one answer");
    app.shutdown().await;
}

/// With `approvers = "admins"`, the channel's `admins` decide: a press is judged like a
/// message from its user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_deny_press_refuses_the_call_and_a_forged_press_is_refused() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockSlack::start().await;
    let config = format!(
        "{}\n[approvals]\ntools = [\"current_time\"]\napprovers = \"admins\"\n",
        api.config(&format!("admins = [\"{PRESSER}\"]\n"))
    );
    let app = TestApp::spawn(&model, &config).await;
    post_event(&app.base, &fixture("slack_app_mention_thread.json")).await;
    let actions = actions(&prompt(&api).await);

    // Signed with another secret: refused before anything is read.
    let payload = block_actions(PRESSER, &actions[1], POSTED_TS, Some(THREAD));
    let (status, _) = antler_testkit::slack::post_signed(
        &app.base,
        "interactions",
        &antler_testkit::slack::interaction_form(&payload),
        "not-the-signing-secret",
        antler_testkit::now_secs(),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(api.ephemerals().await.is_empty());

    press(&app, PRESSER, &actions[1]).await;
    let answer = final_answer(&api).await;
    let text = answer["text"].as_str().unwrap();
    assert!(text.contains("Denied by grace"), "{text}");
    let replaced = wait_until("the message replaced", || async {
        replaced(&api).await.into_iter().next()
    })
    .await;
    assert!(
        replaced["text"].as_str().unwrap().contains("❌ Denied by"),
        "{replaced}"
    );
    app.wait_idle().await;
    assert_eq!(model.tool_results().len(), 1);
    assert!(model.tool_results()[0].starts_with("Denied"));
    app.shutdown().await;
}

/// Slack, "Using Socket Mode": interactions come as `interactive` envelopes whose payload is
/// the interaction's JSON; the app acknowledges `{"envelope_id"}` within 3 seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_socket_mode_a_press_comes_as_an_interactive_envelope() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockSlack::start().await;
    let socket = MockSocket::start().await;
    api.serve_socket(&socket).await;
    let config = format!("{}{}", api.socket_config(APP_TOKEN, ""), approvals());
    let app = TestApp::spawn(&model, &config).await;
    socket.wait_for_connections(1).await;
    let mention: Value = serde_json::from_str(&fixture("slack_app_mention_thread.json")).unwrap();
    socket.send_envelope("env-mention", "events_api", mention, 0);
    let actions = actions(&prompt(&api).await);

    let payload = block_actions(PRESSER, &actions[0], POSTED_TS, Some(THREAD));
    socket.send_envelope("env-press", "interactive", payload, 0);
    let acks = socket.wait_for_acks("env-press", 1).await;
    assert_eq!(acks[0].get("payload"), None, "a bare ack");
    final_answer(&api).await;
    let told = api.wait_for_ephemerals(1).await;
    assert_eq!(told[0]["user"], PRESSER);
    assert!(!replaced(&api).await.is_empty());
    app.wait_idle().await;
    assert_eq!(model.tool_results().len(), 1);
    app.shutdown().await;
}
