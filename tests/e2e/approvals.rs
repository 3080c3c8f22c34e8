//! Approvals end to end on the API channel (issue 26): a listed tool call pauses the turn with
//! a message showing it; only an approver's `/approve` runs it, exactly once however often it
//! is sent; `/deny` gives the model the reason and its answer follows; a restart between the
//! question and the decision loses nothing; an unanswered approval expires as denied; the
//! admin API lists and decides.
//!
//! The mock model calls `current_time` (call id `call_time_1`, the same in every turn) until a
//! tool result is last, then answers "The time is <result>".

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    Behaviour, MockModel, TestApp, read_sse_until, searchable_tempdir, wait_until,
};

const TOKEN: &str = "approvals-e2e-admin-token";

fn overrides(timeout_secs: u64) -> String {
    format!(
        "[channels.api]\ntoken = \"{TOKEN}\"\n\n[approvals]\ntools = [\"current_time\"]\n\
         approvers = [\"api:boss\"]\ntimeout_secs = {timeout_secs}\n"
    )
}

async fn start(mock: &MockModel, store: &std::path::Path, timeout_secs: u64) -> TestApp {
    let mut app = TestApp::start(mock, store, &overrides(timeout_secs)).await;
    app.client.token = Some(TOKEN.to_owned());
    app
}

/// `user` says `text` in conversation `ops` and waits for the answer.
async fn say(app: &TestApp, user: &str, text: &str) -> Value {
    let answer = app
        .post(&json!({"conversation": "ops", "user": user, "text": text, "wait": true}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    answer.json
}

/// The approval id in the message that asked, after "/approve ".
fn approval_id(reply: &str) -> String {
    let (_, rest) = reply
        .split_once("/approve ")
        .unwrap_or_else(|| panic!("no /approve in {reply}"));
    rest.chars().take(8).collect()
}

/// The thread's messages with role `tool`.
fn tool_results(thread: &Value) -> Vec<String> {
    thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The last message's text once the thread ends with an assistant answer after `results`
/// tool results.
async fn answer_after(app: &TestApp, thread_id: &str, results: usize) -> (Value, String) {
    wait_until("the resumed turn's answer", || async {
        let thread = app.thread(thread_id).await;
        let messages = thread["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last()?;
        (tool_results(&thread).len() == results
            && last["role"] == "assistant"
            && last["tool_calls"].is_null())
        .then(|| {
            let text = last["content"].as_str().unwrap_or_default().to_owned();
            (thread, text)
        })
    })
    .await
}

/// Asks for the time and checks the turn paused with the call shown; the approval id and the
/// thread id.
async fn ask_and_pause(app: &TestApp, mock: &MockModel) -> (String, String) {
    let reply = say(app, "tester", "what time is it?").await;
    let text = reply["reply"].as_str().unwrap().to_owned();
    assert!(text.contains("Approval needed: current\\_time"), "{text}");
    assert!(text.contains("asked by api:tester"), "{text}");
    assert!(text.contains("/deny "), "{text}");
    let id = approval_id(&text);
    let thread_id = reply["thread_id"].as_str().unwrap().to_owned();
    let thread = app.thread(&thread_id).await;
    assert!(tool_results(&thread).is_empty(), "nothing ran: {thread}");
    assert_eq!(mock.requests().len(), 1);
    (id, thread_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_approver_runs_the_call_and_only_once() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let dir = searchable_tempdir();
    let app = start(&mock, &dir.path().join("store"), 900).await;
    let (id, thread_id) = ask_and_pause(&app, &mock).await;

    // Someone else: refused, nothing changes.
    let refused = say(&app, "tester", &format!("/approve {id}")).await;
    assert!(
        refused["reply"]
            .as_str()
            .unwrap()
            .contains("only approvers can decide"),
        "{refused}"
    );
    app.wait_idle().await;
    assert!(tool_results(&app.thread(&thread_id).await).is_empty());
    assert_eq!(mock.requests().len(), 1);

    // The approver: it runs, and the answer follows in the conversation.
    let approved = say(&app, "boss", &format!("/approve {id}")).await;
    assert!(
        approved["reply"]
            .as_str()
            .unwrap()
            .starts_with("✅ Approved"),
        "{approved}"
    );
    let (thread, answer) = answer_after(&app, &thread_id, 1).await;
    assert!(answer.starts_with("The time is "), "{answer}");
    assert!(!tool_results(&thread)[0].starts_with("Denied"), "{thread}");

    // Approving again, twice at once: nothing changes, nothing runs again.
    let (approve, deny) = (format!("/approve {id}"), format!("/deny {id} too late"));
    let (again, twice) = tokio::join!(say(&app, "boss", &approve), say(&app, "boss", &deny));
    for reply in [again, twice] {
        assert!(
            reply["reply"]
                .as_str()
                .unwrap()
                .contains("was approved by api:boss already; nothing changed"),
            "{reply}"
        );
    }
    app.wait_idle().await;
    let thread = app.thread(&thread_id).await;
    assert_eq!(tool_results(&thread).len(), 1, "{thread}");
    assert_eq!(mock.requests().len(), 2);

    // The same call id in the next turn is a new call: asked again.
    let next = say(&app, "tester", "and now?").await;
    assert!(
        next["reply"].as_str().unwrap().contains("Approval needed"),
        "{next}"
    );
    assert_ne!(approval_id(next["reply"].as_str().unwrap()), id);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_reaches_the_model_with_its_reason_and_the_answer_follows() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let dir = searchable_tempdir();
    let app = start(&mock, &dir.path().join("store"), 900).await;
    let (id, thread_id) = ask_and_pause(&app, &mock).await;

    let denied = say(&app, "boss", &format!("/deny {id} not during the freeze")).await;
    assert!(
        denied["reply"].as_str().unwrap().starts_with("❌ Denied"),
        "{denied}"
    );
    let (thread, answer) = answer_after(&app, &thread_id, 1).await;
    assert_eq!(
        tool_results(&thread),
        ["Denied by api:boss: not during the freeze"]
    );
    assert_eq!(
        answer,
        "The time is Denied by api:boss: not during the freeze"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_the_question_and_the_decision_loses_nothing() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let dir = searchable_tempdir();
    let store = dir.path().join("store");
    let app = start(&mock, &store, 900).await;
    let (id, thread_id) = ask_and_pause(&app, &mock).await;
    app.shutdown().await;

    let app = start(&mock, &store, 900).await;
    let listed = say(&app, "tester", "/approvals").await;
    assert!(
        listed["reply"].as_str().unwrap().contains(&id),
        "still pending after the restart: {listed}"
    );
    say(&app, "boss", &format!("/approve {id}")).await;
    let (thread, answer) = answer_after(&app, &thread_id, 1).await;
    assert!(answer.starts_with("The time is "), "{answer}");
    assert_eq!(tool_results(&thread).len(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_approval_expires_as_denied_and_the_chat_is_told() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let dir = searchable_tempdir();
    let app = start(&mock, &dir.path().join("store"), 3).await;
    let (id, thread_id) = ask_and_pause(&app, &mock).await;
    // Listening to the conversation's thread well before its 3 s are up.
    let events = app
        .http
        .get(format!("{}/api/v1/threads/{thread_id}/events", app.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK);

    // Nobody decides: the gateway denies it when its time is up, and says so in the chat.
    let events = read_sse_until(events, |events| {
        events.iter().any(|(name, _)| name == "final")
    })
    .await;
    let (_, last) = events.iter().rfind(|(name, _)| name == "final").unwrap();
    let told = last["text"].as_str().unwrap();
    assert!(
        told.starts_with(&format!(
            "⌛ current\\_time ({id}) expired: nobody decided in time"
        )),
        "{told}"
    );
    assert!(told.contains("The time is Denied by antler"), "{told}");
    let (thread, answer) = answer_after(&app, &thread_id, 1).await;
    assert!(
        tool_results(&thread)[0].contains("the approval expired"),
        "{thread}"
    );
    assert!(
        answer.starts_with("The time is Denied by antler"),
        "{answer}"
    );
    app.wait_idle().await;
    let late = say(&app, "boss", &format!("/approve {id}")).await;
    assert!(
        late["reply"]
            .as_str()
            .unwrap()
            .contains("was expired by antler already"),
        "{late}"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_lists_and_decides_approvals() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let dir = searchable_tempdir();
    let app = start(&mock, &dir.path().join("store"), 900).await;
    let (id, thread_id) = ask_and_pause(&app, &mock).await;

    let listed = app.get("/api/v1/approvals").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    let approvals = listed.json["approvals"].as_array().unwrap();
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0]["id"], id.as_str());
    assert_eq!(approvals[0]["tool"], "current_time");
    assert_eq!(approvals[0]["requester"], "api:tester");
    assert_eq!(approvals[0]["state"], "pending");

    // Without the admin token: refused.
    let anonymous = app
        .http
        .get(format!("{}/api/v1/approvals", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

    let decide = |body: Value| {
        let request = app
            .http
            .post(format!("{}/api/v1/approvals/{id}", app.base))
            .bearer_auth(TOKEN)
            .json(&body);
        async move { request.send().await.unwrap() }
    };
    let first = decide(json!({"decision": "approve"})).await;
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["decided"], true);
    assert_eq!(first["approval"]["state"], "approved");
    let second: Value = decide(json!({"decision": "deny", "reason": "no"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(second["decided"], false);
    assert_eq!(second["approval"]["state"], "approved");
    assert_eq!(
        decide(json!({"decision": "maybe"})).await.status(),
        StatusCode::BAD_REQUEST
    );

    let (thread, answer) = answer_after(&app, &thread_id, 1).await;
    assert!(answer.starts_with("The time is "), "{answer}");
    assert_eq!(tool_results(&thread).len(), 1);
    let missing = app
        .http
        .post(format!("{}/api/v1/approvals/zzzzzzzz", app.base))
        .bearer_auth(TOKEN)
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(
        app.get("/api/v1/approvals").await.json["approvals"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_message_withdraws_the_waiting_call() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let dir = searchable_tempdir();
    let app = start(&mock, &dir.path().join("store"), 900).await;
    let (id, thread_id) = ask_and_pause(&app, &mock).await;

    // The requester moves on: the waiting call is answered as not run, the message runs
    // (and the model, asking for the time again, waits for a new approval).
    let next = say(&app, "tester", "never mind, something else").await;
    let text = next["reply"].as_str().unwrap();
    assert_ne!(approval_id(text), id, "{text}");
    let thread = app.thread(&thread_id).await;
    assert_eq!(
        tool_results(&thread),
        ["Not run: a new message arrived before anyone approved `current_time`."]
    );
    // A late decision changes nothing and runs nothing.
    let late = say(&app, "boss", &format!("/approve {id}")).await;
    assert!(
        late["reply"]
            .as_str()
            .unwrap()
            .contains("was withdrawn by a new message already"),
        "{late}"
    );
    app.wait_idle().await;
    assert_eq!(tool_results(&app.thread(&thread_id).await).len(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_self_approval_the_requester_cannot_approve_their_own_call() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let dir = searchable_tempdir();
    let overrides = format!(
        "[channels.api]\ntoken = \"{TOKEN}\"\n\n[approvals]\ntools = [\"current_*\"]\n\
         approvers = [\"api:boss\", \"api:tester\"]\nself_approval = false\n"
    );
    let mut app = TestApp::start(&mock, &dir.path().join("store"), &overrides).await;
    app.client.token = Some(TOKEN.to_owned());
    let (id, thread_id) = ask_and_pause(&app, &mock).await;

    let own = say(&app, "tester", &format!("/approve {id}")).await;
    assert!(
        own["reply"]
            .as_str()
            .unwrap()
            .contains("another approver must approve it"),
        "{own}"
    );
    app.wait_idle().await;
    assert!(tool_results(&app.thread(&thread_id).await).is_empty());
    // Another approver may.
    say(&app, "boss", &format!("/approve {id}")).await;
    let (_, answer) = answer_after(&app, &thread_id, 1).await;
    assert!(answer.starts_with("The time is "), "{answer}");
    app.shutdown().await;
}
