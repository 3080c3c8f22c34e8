//! The runtime's seams through the API channel: a middleware's tool that asks the user a
//! question and resumes on the answer, `/stop`, tool progress on the stream, the title by a
//! helper model call.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{TestApp, read_sse, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clarifying_question_is_asked_and_the_answer_resumes_the_run() {
    let mock = MockModel::start(Behaviour::Clarify).await;
    let app = TestApp::spawn(&mock, "").await;

    let asked = app.ask("deploy", "deploy the new build").await;
    let question = asked.json["reply"].as_str().unwrap();
    assert_eq!(question, "🔀 Which cluster?\n\n1. prod\n2. staging");
    // The middleware's tool was offered to the model.
    let first = &mock.requests()[0];
    let tools: Vec<&str> = first.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(tools.contains(&"ask_clarification"), "{tools:?}");

    // "2" picks the second option; the model gets it after its question and the result.
    let answered = app.ask("deploy", "2").await;
    assert_eq!(answered.json["reply"], "echo: staging");
    let last = mock.requests().pop().unwrap();
    let messages = last.messages_without_context();
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert!(
        messages[3]["content"]
            .as_str()
            .unwrap()
            .contains("Which cluster?")
    );

    // The thread shows both turns, none failed, and no question is left open.
    let thread_id = answered.json["thread_id"].as_str().unwrap();
    let thread = app.thread(thread_id).await;
    assert_eq!(thread["turns"], 2, "{thread}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_ending_in_a_question_gets_a_title() {
    let mock = MockModel::start(Behaviour::Clarify).await;
    let app = TestApp::spawn(&mock, "").await;
    let asked = app.ask("deploy", "deploy the new build").await;
    assert_eq!(
        asked.json["reply"],
        "🔀 Which cluster?\n\n1. prod\n2. staging"
    );
    let thread_id = asked.json["thread_id"].as_str().unwrap();
    let thread = app.thread(thread_id).await;
    // The tests' config has `use_model = false`: the question is the title.
    assert_eq!(thread["title"], "deploy the new build", "{thread}");
    // Answering the question keeps it.
    app.ask("deploy", "2").await;
    assert_eq!(app.thread(thread_id).await["title"], "deploy the new build");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_the_running_turn_at_once() {
    // The model would take a minute; /stop must not wait for it.
    let mock = MockModel::start(Behaviour::Slow(Duration::from_secs(60))).await;
    let app = TestApp::spawn(&mock, "").await;

    let slow = app
        .post(&json!({"conversation": "long", "user": "tester", "text": "write an essay", "message_id": "m-essay"}))
        .await;
    assert_eq!(slow.status, StatusCode::ACCEPTED, "{}", slow.text);
    mock.wait_for_requests(1).await;

    let started = std::time::Instant::now();
    let stop = app.ask("long", "/stop").await;
    assert_eq!(
        stop.json["reply"],
        "⏹ Stopped the answer that was being written."
    );
    // Generous: far below the model's minute, whatever the machine.
    assert!(started.elapsed() < Duration::from_secs(30));

    let thread_id = slow.json["thread_id"].as_str().unwrap().to_owned();
    let thread = wait_until("the stopped turn's reply", || async {
        let thread = app.thread(&thread_id).await;
        let done = thread["messages"].as_array().is_some_and(|m| {
            m.iter().any(|m| {
                m["content"]
                    .as_str()
                    .is_some_and(|c| c.contains("[stopped]"))
            })
        });
        done.then_some(thread)
    })
    .await;
    let failed = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["failed"] == true);
    assert!(!failed, "a stopped turn stays in the context: {thread}");

    // Nothing running: /stop says so.
    let again = app.ask("long", "/stop").await;
    assert_eq!(
        again.json["reply"],
        "Nothing was running in this conversation."
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_progress_is_streamed_beside_the_text() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let app = TestApp::spawn(&mock, "").await;
    let response = app
        .http
        .post(format!("{}/api/v1/messages", app.base))
        .json(&json!({"conversation": "tools", "user": "u", "text": "time?", "message_id": "m-tool", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let events = read_sse(response).await;
    let tool_states: Vec<(&str, &str)> = events
        .iter()
        .filter(|(name, _)| name == "tool")
        .map(|(_, data)| {
            (
                data["tool"].as_str().unwrap(),
                data["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tool_states,
        [("current_time", "started"), ("current_time", "finished")]
    );
    let tool_event = events.iter().find(|(name, _)| name == "tool").unwrap();
    assert_eq!(tool_event.1["in_reply_to"], "m-tool");
    assert_eq!(tool_event.1["call_id"], "call_time_1");
    let last = events.last().unwrap();
    assert_eq!(last.0, "final");
    assert!(
        last.1["text"].as_str().unwrap().starts_with("The time is "),
        "{last:?}"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_titles_a_new_thread_with_a_helper_call() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[agent.middleware.title]\nuse_model = true\n").await;
    let answer = app.ask("titled", "why is the build red").await;
    assert_eq!(answer.json["reply"], "echo: why is the build red");
    let requests = mock.wait_for_requests(2).await;
    let helper = &requests[1];
    assert_eq!(
        helper.body["tools"],
        Value::Null,
        "a helper call offers no tools"
    );
    assert!(
        helper
            .last_user_text()
            .starts_with("Generate a concise title (max 6 words)"),
        "{}",
        helper.last_user_text()
    );
    // The title is written after the reply: wait for it.
    let thread_id = answer.json["thread_id"].as_str().unwrap();
    let thread = wait_until("the model's title is written", || async {
        let thread = app.thread(thread_id).await;
        (thread["title"] != "why is the build red").then_some(thread)
    })
    .await;
    // The echo model "titles" with its echo: six words at most, cut with an ellipsis.
    assert_eq!(thread["title"], "echo: Generate a concise title (max…");
    assert!(thread["usage"]["total_tokens"].as_u64().unwrap() > 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reply_does_not_wait_for_the_title_call() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[agent.middleware.title]\nuse_model = true\n").await;
    // The model answers the turn at once and holds the title call (the second request).
    mock.hold_from(1);
    let answer = app.ask("titled", "why is the build red").await;
    assert_eq!(answer.json["reply"], "echo: why is the build red");
    let requests = mock.wait_for_requests(2).await;
    assert!(
        requests[1]
            .last_user_text()
            .starts_with("Generate a concise title (max 6 words)"),
        "{}",
        requests[1].last_user_text()
    );
    // The turn is finished, with the question as the title while the call is held.
    let thread_id = answer.json["thread_id"].as_str().unwrap();
    let before = app.thread(thread_id).await;
    assert_eq!(before["title"], "why is the build red", "{before}");
    assert_eq!(before["turns"], 1, "{before}");
    let tokens_before = before["usage"]["total_tokens"].as_u64().unwrap();

    mock.release();
    let after = wait_until("the model's title is written", || async {
        let thread = app.thread(thread_id).await;
        (thread["title"] != "why is the build red").then_some(thread)
    })
    .await;
    assert_eq!(after["title"], "echo: Generate a concise title (max…");
    // The title call's tokens count towards the thread.
    assert!(
        after["usage"]["total_tokens"].as_u64().unwrap() > tokens_before,
        "{after}"
    );
    assert_eq!(after["messages"], before["messages"]);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_todos_send_the_model_back_a_capped_number_of_times() {
    let mock = MockModel::start(Behaviour::Todo).await;
    let app = TestApp::spawn(&mock, "[agent.middleware.todo]\nenabled = true\n").await;
    let answer = app.ask("plan", "plan the deploy").await;
    // write_todos, the answer, then two reminders answered: the cap ends the run.
    let requests = mock.requests();
    assert_eq!(
        requests.len(),
        4,
        "{:?}",
        requests
            .iter()
            .map(|r| r.last_user_text())
            .collect::<Vec<_>>()
    );
    for reminded in &requests[2..] {
        assert!(
            reminded
                .last_user_text()
                .contains("these todos are not completed:\n- restart api"),
            "{}",
            reminded.last_user_text()
        );
    }
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.starts_with("echo: plan the deploy\n\n"), "{reply}");
    // The list is kept with the thread.
    let thread_id = answer.json["thread_id"].as_str().unwrap();
    let thread = app.thread(thread_id).await;
    assert_eq!(thread["turns"], 1);
    app.shutdown().await;
}
