//! One conversation, one order; bounded backlog.

use crate::support::{Behaviour, MockModel, TestApp, wait_until};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_messages_are_answered_in_order_one_turn_at_a_time() {
    let mock = MockModel::start(Behaviour::Echo).await;
    // The first turn is held at the model, so the other two are queued behind it.
    mock.hold();
    let app = TestApp::spawn(&mock, "").await;

    let texts = ["one", "two", "three"];
    let mut thread_ids = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let answer = app
            .post(&json!({"conversation": "order", "user": "u", "text": text, "message_id": format!("m{i}")}))
            .await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
        thread_ids.push(answer.json["thread_id"].as_str().unwrap().to_owned());
    }
    assert!(
        thread_ids.iter().all(|t| *t == thread_ids[0]),
        "one thread: {thread_ids:?}"
    );
    mock.wait_for_requests(1).await;
    assert_eq!(
        mock.count(),
        1,
        "while the first turn runs, the others wait their turn"
    );
    mock.release();

    let thread = app.wait_for_messages(&thread_ids[0], 6).await;
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 6, "{messages:?}");
    for (i, text) in texts.iter().enumerate() {
        let user = &messages[2 * i];
        let assistant = &messages[2 * i + 1];
        assert_eq!(user["role"], "user");
        assert_eq!(user["content"], *text, "user messages in posting order");
        assert_eq!(assistant["role"], "assistant");
        assert_eq!(assistant["content"], format!("echo: {text}"));
    }
    assert_eq!(thread["turns"], 3);

    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    let order: Vec<String> = requests.iter().map(|r| r.last_user_text()).collect();
    assert_eq!(order, texts);
    // Each turn sees the whole history before it: 1 + 2i + 1 messages.
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(
            request.messages_without_context().len(),
            2 + 2 * i,
            "request {i}"
        );
    }
    assert_eq!(
        mock.max_in_flight("one"),
        1,
        "turns of one conversation never overlap"
    );
    assert!(requests.iter().all(|r| r.in_flight_same_conversation == 1));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_run_concurrently() {
    let mock = MockModel::start(Behaviour::Echo).await;
    mock.hold();
    let app = TestApp::spawn(&mock, "[agent]\nmax_concurrent_turns = 4\n").await;

    for conversation in ["a", "b"] {
        let answer = app
            .post(&json!({"conversation": conversation, "user": "u", "text": format!("hi from {conversation}")}))
            .await;
        assert_eq!(answer.status, StatusCode::ACCEPTED);
    }
    // Both turns reach the model while neither has been answered.
    let requests = mock.wait_for_requests(2).await;
    assert!(
        requests[1].concurrent(),
        "different conversations run at the same time"
    );
    mock.release();
    app.wait_idle().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_backlog_answers_503_with_retry_after() {
    let mock = MockModel::start(Behaviour::Echo).await;
    mock.hold();
    let app = TestApp::spawn(&mock, "[agent]\nbacklog = 2\nmax_concurrent_turns = 1\n").await;

    for conversation in ["b1", "b2"] {
        let answer = app
            .post(&json!({"conversation": conversation, "user": "u", "text": "work"}))
            .await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
    }
    mock.wait_for_requests(1).await;

    let refused = app
        .post(&json!({"conversation": "b3", "user": "u", "text": "too much", "message_id": "m-b3"}))
        .await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text
    );
    let retry_after: u64 = refused.headers[reqwest::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    assert_eq!(refused.json["error"]["code"], "overloaded");
    assert!(refused.json["error"]["message"].is_string());
    let ready = app.get("/readyz").await;
    assert_eq!(ready.json["inbox"], 2, "the refused message was not stored");

    mock.release();
    app.wait_idle().await;
    assert_eq!(mock.count(), 2);

    // Room again: the same message is now accepted (it was not remembered as a duplicate).
    let accepted = wait_until("a new message is accepted", || async {
        let answer = app
            .post(&json!({"conversation": "b3", "user": "u", "text": "too much", "message_id": "m-b3"}))
            .await;
        (answer.status == StatusCode::ACCEPTED).then_some(answer)
    })
    .await;
    assert_eq!(accepted.json["duplicate"], false);
    let thread = app
        .wait_for_messages(accepted.json["thread_id"].as_str().unwrap(), 2)
        .await;
    assert_eq!(thread["messages"][1]["content"], "echo: too much");
    app.shutdown().await;
}
