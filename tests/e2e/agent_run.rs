//! One whole agent run through the API channel: a scripted model, as an operator's assistant,
//! plans with `write_todos`, writes, reads, edits and lists files, presents the result, closes
//! its plan and answers. Each tool's result must reach the next model request, the answer the
//! client, and the thread must hold every call with its result.

use serde_json::{Value, json};

use crate::support::{Behaviour, MockModel, Step, TestApp};

const TOKEN: &str = "agent-run-admin-token";

/// The script and, for each step that calls a tool, what its result must contain.
fn script() -> Vec<(Step, Option<&'static str>)> {
    let notes = "/mnt/user-data/outputs/notes.txt";
    vec![
        (
            Step::call(
                "write_todos",
                json!({"todos": [
                    {"content": "write the notes", "status": "in_progress"},
                    {"content": "fix the typo", "status": "pending"}
                ]}),
            ),
            Some("- [~] write the notes\n- [ ] fix the typo"),
        ),
        (
            Step::call(
                "write_file",
                json!({"path": notes, "content": "alpha\nbeta\n"}),
            ),
            Some("Wrote 11 bytes to /mnt/user-data/outputs/notes.txt"),
        ),
        (
            Step::call("read_file", json!({"path": notes})),
            Some("beta"),
        ),
        (
            Step::call(
                "str_replace",
                json!({"path": notes, "old": "beta", "new": "gamma"}),
            ),
            Some("Replaced 1 occurrence in /mnt/user-data/outputs/notes.txt"),
        ),
        (
            Step::call("read_file", json!({"path": notes})),
            Some("gamma"),
        ),
        (
            Step::call("ls", json!({"path": "/mnt/user-data/outputs"})),
            Some("notes.txt"),
        ),
        (
            Step::call("present_files", json!({"paths": [notes]})),
            Some("delivered to the user"),
        ),
        (
            Step::call(
                "write_todos",
                json!({"todos": [
                    {"content": "write the notes", "status": "completed"},
                    {"content": "fix the typo", "status": "completed"}
                ]}),
            ),
            Some("- [x] write the notes\n- [x] fix the typo"),
        ),
        (Step::text("The notes are written and fixed."), None),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_model_uses_several_tools_in_one_run() {
    let script = script();
    let steps: Vec<Step> = script.iter().map(|(step, _)| step.clone()).collect();
    let mock = MockModel::start(Behaviour::Script(steps)).await;
    let config =
        format!("[channels.api]\ntoken = \"{TOKEN}\"\n[agent.middleware.todo]\nenabled = true\n");
    let mut app = TestApp::spawn(&mock, &config).await;
    app.client.token = Some(TOKEN.to_owned());

    let answer = app.ask("ops", "write notes, then fix the typo").await;
    assert_eq!(
        answer.json["reply"], "The notes are written and fixed.",
        "{}",
        answer.text
    );
    assert_eq!(answer.json["attachments"][0]["name"], "notes.txt");

    let requests = mock.requests();
    assert_eq!(requests.len(), script.len(), "one request per step");
    for (n, (_, expected)) in script.iter().enumerate() {
        let Some(expected) = expected else { continue };
        // Request n+1 ends with the result of call n.
        let messages = requests[n + 1].messages();
        let last = messages.last().unwrap();
        assert_eq!(last["role"], "tool", "request {}: {last}", n + 1);
        assert_eq!(last["tool_call_id"], format!("call_{n}"));
        let content = last["content"].as_str().unwrap();
        assert!(
            content.contains(expected),
            "step {n}: `{expected}` not in {content}"
        );
        assert!(!content.starts_with("Error"), "step {n}: {content}");
    }

    // The thread: the user's message, each call with its result, the answer; nothing left
    // unanswered and nothing failed.
    let thread_id = answer.json["thread_id"].as_str().unwrap();
    let thread = app.thread(thread_id).await;
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        1 + 2 * (script.len() - 1) + 1,
        "{messages:?}"
    );
    assert_eq!(messages[0]["role"], "user");
    let calls: Vec<&Value> = messages
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), script.len() - 1);
    for call in &calls {
        let id = call["id"].as_str().unwrap();
        let answered = messages
            .iter()
            .filter(|m| m["role"] == "tool" && m["tool_call_id"] == id)
            .count();
        assert_eq!(answered, 1, "call {id} answered once");
    }
    assert!(messages.iter().all(|m| m.get("failed").is_none()));
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"], "The notes are written and fixed.");
    assert_eq!(last["attachments"][0]["name"], "notes.txt");
    // The file is as the run left it.
    let file = app
        .get(&format!("/api/v1/threads/{thread_id}/files/notes.txt"))
        .await;
    assert_eq!(file.text, "alpha\ngamma\n");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_final_answer_is_asked_for_again_once_then_reported() {
    // After a tool call the model answers nothing; reminded, it answers.
    let mock = MockModel::start(Behaviour::Script(vec![
        Step::call("current_time", json!({})),
        Step::text(""),
        Step::text("It is tea time."),
    ]))
    .await;
    let app = TestApp::spawn(&mock, "").await;
    let answer = app.ask("empty", "what time is it?").await;
    assert_eq!(answer.json["reply"], "It is tea time.", "{}", answer.text);
    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    let reminder = requests[2].messages().last().cloned().unwrap();
    assert_eq!(reminder["role"], "user");
    assert!(
        reminder["content"]
            .as_str()
            .unwrap()
            .starts_with("<system-reminder>"),
        "{reminder}"
    );

    // Empty twice: one retry only, and the user is told, not sent an empty reply.
    mock.set_behaviour(Behaviour::Script(vec![Step::text(" "), Step::text("")]));
    let answer = app.ask("empty-twice", "and now?").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(
        reply.starts_with("⚠️ The model finished without writing an answer."),
        "{reply}"
    );
    assert_eq!(mock.requests().len(), 5);
}
