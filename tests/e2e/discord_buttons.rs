//! Discord approval buttons end to end (issue 26): a tool call waiting for approval shows
//! Approve and Deny as message components under its own message on the mock Discord API; a
//! press comes back as a signed component interaction on `POST /webhooks/discord/interactions`
//! and is answered in the HTTP response: a non-approver's privately (type 4, flags 64: "only
//! the user who invoked the interaction can see it") with nothing changed, an approver's by
//! updating the button's message (type 7 UPDATE_MESSAGE, components removed) to say who
//! decided. The tool runs once however often the press is delivered, and the answer follows.
//!
//! The mock model calls `current_time` until a tool result is last, then answers "The time is
//! <result>".

use antler_testkit::discord::{
    ADA, APPLICATION_ID, MockDiscord, ask, buttons_of, mock_gateway_with_interactions, post, press,
    press_in_server, pressed_by,
};
use serde_json::{Value, json};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{TestApp, wait_until};

/// Someone who may talk to the bot but is not an approver.
const EVE: &str = "1200000000000000099";

/// The follow-up id the mock API gives every follow-up: the prompt's message.
const PROMPT_MESSAGE: &str = "1500000000000000002";

/// The config: the mock API, `current_time` waiting for Ada's approval.
fn config(api: &MockDiscord) -> String {
    format!(
        "{}\n[approvals]\ntools = [\"current_time\"]\napprovers = [\"discord:{ADA}\"]\n",
        api.config("")
    )
}

/// Asks for the time in an `/ask` (token `token`) and waits for the prompt's buttons; the
/// message they were sent with.
async fn ask_and_see_buttons(app: &TestApp, api: &MockDiscord, token: &str) -> Value {
    let deferral = post(
        &app.base,
        &ask("1300000000000000960", token, "what time is it?"),
    )
    .await;
    assert_eq!(deferral, json!({"type": 5}));
    wait_until("the prompt's buttons", || async {
        api.messages_with_buttons().await.into_iter().next()
    })
    .await
}

/// The action of the button labelled `label` in `message`.
fn action(message: &Value, label: &str) -> String {
    buttons_of(message)
        .into_iter()
        .find(|(l, _, _)| l.contains(label))
        .map(|(_, _, action)| action)
        .unwrap_or_else(|| panic!("no {label} button in {message}"))
}

/// The edits of message `id` through the interaction webhook or the bot's channel route.
async fn edits_of(api: &MockDiscord, id: &str) -> Vec<Value> {
    api.calls()
        .await
        .into_iter()
        .filter(|(m, p, _)| m == "PATCH" && p.ends_with(&format!("/messages/{id}")))
        .map(|(_, _, body)| body)
        .collect()
}

/// Waits for the bot to say "The time is …" anywhere; what it said.
async fn final_answer(api: &MockDiscord) -> String {
    wait_until("the answer after the approval", || async {
        api.calls().await.into_iter().find_map(|(_, _, body)| {
            body["content"]
                .as_str()
                .filter(|text| text.contains("The time is"))
                .map(str::to_owned)
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_shows_buttons_and_only_an_approvers_press_runs_it_once() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(&model, &config(&api)).await;
    let prompt = ask_and_see_buttons(&app, &api, "tok-approve").await;

    // The call is shown in its own follow-up, with Approve (Success, green) and Deny (Danger,
    // red) under it, pinging no one.
    let text = prompt["content"].as_str().unwrap();
    assert!(text.contains("Approval needed"), "{text}");
    assert_eq!(prompt["allowed_mentions"], json!({"parse": []}));
    let buttons = buttons_of(&prompt);
    assert_eq!(buttons.len(), 2, "{prompt}");
    assert_eq!((buttons[0].1, buttons[1].1), (3, 4), "{buttons:?}");
    let approve = action(&prompt, "Approve");
    let deny = action(&prompt, "Deny");
    assert!(approve.starts_with("approve:") && deny.starts_with("deny:"));
    assert!(approve.len() <= 100, "custom_id: max 100 characters");
    assert_eq!(api.follow_ups("tok-approve").await.len(), 1);
    app.client.wait_idle().await;
    assert_eq!(model.count(), 1);

    // Eve is not an approver: told privately, and nothing changes.
    let eve = pressed_by(
        press("1300000000000000961", "tok-eve", &approve, PROMPT_MESSAGE),
        EVE,
        "Eve",
    );
    let refused = post(&app.base, &eve).await;
    assert_eq!(refused["type"], 4, "{refused}");
    assert_eq!(refused["data"]["flags"], 64, "ephemeral: {refused}");
    assert!(
        refused["data"]["content"]
            .as_str()
            .unwrap()
            .contains("only approvers can decide"),
        "{refused}"
    );
    app.client.wait_idle().await;
    assert_eq!(model.count(), 1, "nothing ran");
    assert!(edits_of(&api, PROMPT_MESSAGE).await.is_empty());

    // Ada approves: the message now says who decided, its buttons gone; delivered again (the
    // same interaction), it answers the same and nothing runs twice.
    let ada = press("1300000000000000962", "tok-ada", &approve, PROMPT_MESSAGE);
    let first = post(&app.base, &ada).await;
    let again = post(&app.base, &ada).await;
    for update in [&first, &again] {
        assert_eq!(update["type"], 7, "UPDATE_MESSAGE: {update}");
        assert_eq!(update["data"]["components"], json!([]), "{update}");
        assert_eq!(update["data"]["allowed_mentions"], json!({"parse": []}));
        let content = update["data"]["content"].as_str().unwrap();
        assert!(content.contains("Approval needed"), "{content}");
        assert!(
            content.contains(&format!("Approved by Ada (discord:{ADA})")),
            "{content}"
        );
    }
    // Deny pressed afterwards changes nothing either.
    let late = press("1300000000000000963", "tok-late", &deny, PROMPT_MESSAGE);
    let late = post(&app.base, &late).await;
    assert_eq!(late["type"], 7, "{late}");
    assert!(
        late["data"]["content"]
            .as_str()
            .unwrap()
            .contains("Approved by"),
        "{late}"
    );

    let answer = final_answer(&api).await;
    assert!(!answer.contains("Denied"), "{answer}");
    app.client.wait_idle().await;
    assert_eq!(model.count(), 2, "the tool ran and the model answered once");
    let results = model.tool_results();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(!results[0].starts_with("Denied"), "{results:?}");
    // Answered in the responses alone: no edit of the message through the API.
    assert!(edits_of(&api, PROMPT_MESSAGE).await.is_empty());
    app.shutdown().await;
}

/// With `approvers = "admins"`, a presser named in `channels.discord.admins` decides, as their
/// messages would run as an operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_deny_press_refuses_the_call_and_the_model_is_told() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockDiscord::start().await;
    let config = format!(
        "{}\n[approvals]\ntools = [\"current_time\"]\napprovers = \"admins\"\n",
        api.config(&format!("admins = [\"{ADA}\"]\n"))
    );
    let app = TestApp::spawn(&model, &config).await;
    let prompt = ask_and_see_buttons(&app, &api, "tok-deny").await;
    let deny = action(&prompt, "Deny");
    let denied = post(
        &app.base,
        &press(
            "1300000000000000964",
            "tok-deny-press",
            &deny,
            PROMPT_MESSAGE,
        ),
    )
    .await;
    assert_eq!(denied["type"], 7, "{denied}");
    assert!(
        denied["data"]["content"]
            .as_str()
            .unwrap()
            .contains(&format!("Denied by Ada (discord:{ADA})")),
        "{denied}"
    );
    let answer = final_answer(&api).await;
    assert!(answer.contains("Denied by"), "{answer}");
    app.client.wait_idle().await;
    assert_eq!(model.count(), 2);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_on_a_button_antler_did_not_make_changes_nothing() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockDiscord::start().await;
    let app = TestApp::spawn(&model, &config(&api)).await;
    for (id, action) in [
        ("1300000000000000965", "approve:nosuchid"),
        ("1300000000000000966", "something-else"),
    ] {
        let answer = post(&app.base, &press(id, "tok-foreign", action, "15")).await;
        assert_eq!(answer["type"], 4, "{answer}");
        assert_eq!(answer["data"]["flags"], 64, "{answer}");
    }
    app.client.wait_idle().await;
    assert_eq!(model.count(), 0);
    assert!(api.calls().await.is_empty(), "{:?}", api.calls().await);
    app.shutdown().await;
}

/// With the Gateway and no Interactions Endpoint URL, Discord sends a press as
/// INTERACTION_CREATE; antler answers it through `POST /interactions/{id}/{token}/callback`
/// with what the endpoint would have answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_gateway_a_press_is_answered_through_its_callback() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockDiscord::start().await;
    let mention = json!({
        "id": "1700000000000000002", "channel_id": "1100000000000000050",
        "guild_id": "1100000000000000001",
        "author": {"id": ADA, "username": "ada_ops", "discriminator": "0",
                   "global_name": "Ada", "avatar": null},
        "member": {"roles": [], "joined_at": "2024-03-01T10:00:00.000000+00:00", "deaf": false,
                   "mute": false, "flags": 0},
        "content": format!("<@{APPLICATION_ID}> what time is it?"),
        "timestamp": "2026-01-01T00:00:00.000000+00:00", "edited_timestamp": null,
        "tts": false, "mention_everyone": false,
        "mentions": [{"id": APPLICATION_ID, "username": "antler", "discriminator": "0",
                      "global_name": null, "avatar": null, "bot": true}],
        "mention_roles": [], "attachments": [], "embeds": [], "pinned": false, "type": 0
    });
    let (url, interactions) = mock_gateway_with_interactions(mention).await;
    api.serve_gateway_url(&url).await;
    let app = TestApp::spawn(
        &model,
        &format!(
            "{}\n[approvals]\ntools = [\"current_time\"]\napprovers = [\"discord:{ADA}\"]\n",
            api.config("gateway = true\n")
        ),
    )
    .await;
    // The answer is the bot's own messages in the channel; the prompt's carries the buttons.
    let prompt = wait_until("the prompt's buttons", || async {
        api.messages_with_buttons().await.into_iter().next()
    })
    .await;
    let approve = action(&prompt, "Approve");
    let message = "1500000000000000003";

    let eve = pressed_by(
        press_in_server("1300000000000000970", "tok-gw-eve", &approve, message),
        EVE,
        "Eve",
    );
    interactions.send(eve).unwrap();
    let callbacks = wait_until("the refusal's callback", || async {
        let callbacks = api.interaction_callbacks().await;
        (!callbacks.is_empty()).then_some(callbacks)
    })
    .await;
    assert_eq!(callbacks[0].0, "1300000000000000970");
    assert_eq!(callbacks[0].1["type"], 4, "{callbacks:?}");
    assert_eq!(callbacks[0].1["data"]["flags"], 64, "{callbacks:?}");
    app.client.wait_idle().await;
    assert_eq!(model.count(), 1, "nothing ran");

    let ada = press_in_server("1300000000000000971", "tok-gw-ada", &approve, message);
    interactions.send(ada.clone()).unwrap();
    interactions.send(ada).unwrap();
    let callbacks = wait_until("the approval's callbacks", || async {
        let callbacks = api.interaction_callbacks().await;
        (callbacks.len() >= 3).then_some(callbacks)
    })
    .await;
    for (id, body) in &callbacks[1..] {
        assert_eq!(id, "1300000000000000971");
        assert_eq!(body["type"], 7, "{body}");
        assert_eq!(body["data"]["components"], json!([]), "{body}");
        assert!(
            body["data"]["content"]
                .as_str()
                .unwrap()
                .contains("Approved by Ada"),
            "{body}"
        );
    }
    final_answer(&api).await;
    app.client.wait_idle().await;
    assert_eq!(model.count(), 2, "run once");
    assert_eq!(model.tool_results().len(), 1);
    // The callbacks carry the interaction token in their path alone, never the bot token.
    for request in api.received_requests().await.unwrap() {
        if request.url.path().ends_with("/callback") {
            assert!(request.headers.get("authorization").is_none());
        }
    }
    app.shutdown().await;
}
