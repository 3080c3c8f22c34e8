//! `/plan` end to end through the API channel: plan mode is off by default, so the model is not
//! offered `write_todos`; `/plan` turns it on for that conversation only, the next request offers
//! the tool, the list the model writes shows in `/status`, and `/plan off` takes it away again.

use serde_json::Value;

use crate::support::{Behaviour, MockModel, TestApp};

/// Whether model request `n` (0-based) offered `write_todos`.
fn offers_write_todos(mock: &MockModel, n: usize) -> bool {
    mock.requests()[n].body["tools"]
        .as_array()
        .is_some_and(|tools| {
            tools
                .iter()
                .any(|t: &Value| t["function"]["name"] == "write_todos")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_turns_write_todos_on_for_one_conversation() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;

    app.ask("plan", "hello").await;
    assert_eq!(mock.count(), 1);
    assert!(!offers_write_todos(&mock, 0), "off by default");
    let status = app.ask("plan", "/status").await;
    assert!(
        status.json["reply"]
            .as_str()
            .unwrap()
            .contains("Plan mode: off"),
        "{}",
        status.text
    );

    let switched = app.ask("plan", "/plan").await;
    let reply = switched.json["reply"].as_str().unwrap();
    assert!(reply.contains("Plan mode is on"), "{reply}");
    assert_eq!(mock.count(), 1, "a command makes no model call");

    // The model writes a todo list (and is reminded of the open item, then answers).
    mock.set_behaviour(Behaviour::Todo);
    app.ask("plan", "restart the api").await;
    assert!(offers_write_todos(&mock, 1), "plan mode on: offered");
    let status = app.ask("plan", "/status").await;
    let text = status.json["reply"].as_str().unwrap();
    assert!(text.contains("Plan mode: on"), "{text}");
    assert!(text.contains("Todos:\n- [ ] restart api"), "{text}");

    // Another conversation is not in plan mode.
    mock.set_behaviour(Behaviour::Echo);
    let before = mock.count();
    app.ask("other", "hello").await;
    assert!(!offers_write_todos(&mock, before));

    let off = app.ask("plan", "/plan off").await;
    assert!(
        off.json["reply"]
            .as_str()
            .unwrap()
            .contains("Plan mode is off"),
        "{}",
        off.text
    );
    let before = mock.count();
    app.ask("plan", "and now?").await;
    assert!(!offers_write_todos(&mock, before), "off again");
    let help = app.ask("plan", "/help").await;
    assert!(help.json["reply"].as_str().unwrap().contains("/plan — "));
    app.shutdown().await;
}
