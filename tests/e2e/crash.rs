//! Crash safety with the real binary: an acknowledged message whose turn is in flight when the
//! process is SIGKILLed is answered exactly once after a restart.

use crate::support::{Behaviour, ChildRig, MockModel, metric_value, wait_until};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_turn_then_restart_answers_exactly_once() {
    let mock = MockModel::start(Behaviour::Echo).await;
    // The model never answers while the first process lives: the turn stays in flight.
    mock.hold();
    let rig = ChildRig::new(&mock, "");

    let mut first = rig.serve().await;
    let message = json!({"conversation": "crash", "user": "u", "text": "survive this", "message_id": "m-crash"});
    let accepted = first.post(&message).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);
    assert_eq!(accepted.json["duplicate"], false);
    let thread_id = accepted.json["thread_id"].as_str().unwrap().to_owned();
    mock.wait_for_requests(1).await;
    first.kill().await;

    mock.release();
    let second = rig.serve().await;
    let thread = second.wait_for_messages(&thread_id, 2).await;
    second.wait_idle().await;
    let thread_now = second.thread(&thread_id).await;
    assert_eq!(thread, thread_now, "nothing more happened after the answer");
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        2,
        "one user message and one answer: {messages:?}\n{}",
        second.log_text()
    );
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], "survive this");
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["content"], "echo: survive this");
    assert_eq!(thread["turns"], 1);
    assert_eq!(
        mock.count(),
        2,
        "the interrupted turn ran once more, and only once"
    );

    // A redelivery after the restart is recognised.
    let again = second.post(&message).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.text);
    assert_eq!(again.json["duplicate"], true);
    assert_eq!(again.json["thread_id"], thread_id.as_str());

    // The conversation goes on in the same thread; the crashed message is not run again.
    let next = second.ask("crash", "next one").await;
    assert_eq!(next.json["reply"], "echo: next one");
    assert_eq!(next.json["thread_id"], thread_id.as_str());
    assert_eq!(mock.count(), 3);
    let thread = second.thread(&thread_id).await;
    assert_eq!(thread["messages"].as_array().unwrap().len(), 4);

    let metrics = second.get("/metrics").await.text;
    assert!(
        metric_value(&metrics, r#"antler_turns_total{outcome="ok"}"#) >= Some(1.0),
        "{metrics}"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_a_checkpointed_tool_result_resumes_from_the_checkpoint() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    // The first model call (the tool call) goes through; the second one never answers while
    // the first process lives, so the kill lands after the checkpointed tool result.
    mock.hold_from(1);
    let rig = ChildRig::new(&mock, "");

    let mut first = rig.serve().await;
    let message = json!({"conversation": "crash-tool", "user": "u", "text": "what time is it?", "message_id": "m-tool"});
    let accepted = first.post(&message).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);
    let thread_id = accepted.json["thread_id"].as_str().unwrap().to_owned();
    mock.wait_for_requests(2).await;
    let checkpoint = first.wait_for_messages(&thread_id, 3).await;
    let roles: Vec<&str> = checkpoint["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool"],
        "checkpointed after the tool result"
    );
    first.kill().await;

    mock.release();
    let second = rig.serve().await;
    let thread = wait_until("the resumed turn finished", || async {
        let thread = second.thread(&thread_id).await;
        (thread["turns"] == 1).then_some(thread)
    })
    .await;
    second.wait_idle().await;
    let messages = thread["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "resumed from the checkpoint, the user message once: {messages:#?}"
    );
    assert!(
        messages[3]["content"]
            .as_str()
            .unwrap()
            .starts_with("The time is "),
        "{messages:#?}"
    );
    assert_eq!(mock.count(), 3, "only the interrupted model call ran again");
    let requests = mock.requests();
    let resumed = requests[2].messages_without_context();
    assert_eq!(
        resumed.iter().filter(|m| m["role"] == "user").count(),
        1,
        "{resumed:#?}"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_crashing_is_given_up_after_max_turn_attempts() {
    let mock = MockModel::start(Behaviour::Echo).await;
    mock.hold();
    let rig = ChildRig::new(&mock, "[agent]\nmax_turn_attempts = 1\n");

    let mut first = rig.serve().await;
    let accepted = first
        .post(&json!({"conversation": "poison", "user": "u", "text": "crash me"}))
        .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);
    mock.wait_for_requests(1).await;
    first.kill().await;

    mock.release();
    let second = rig.serve().await;
    second.wait_idle().await;
    let metrics = wait_until("the abandoned turn is counted", || async {
        let metrics = second.get("/metrics").await.text;
        (metric_value(&metrics, r#"antler_turns_total{outcome="abandoned"}"#) >= Some(1.0))
            .then_some(metrics)
    })
    .await;
    assert_eq!(
        metric_value(&metrics, r#"antler_turns_total{outcome="ok"}"#),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(mock.count(), 1, "not run again after the crash");
    let thread = second
        .thread(accepted.json["thread_id"].as_str().unwrap())
        .await;
    let notice = thread["messages"][1]["content"].as_str().unwrap();
    assert!(
        notice.contains("gave up") && notice.contains("once"),
        "the reply says why: {notice}"
    );

    // The conversation is not stuck.
    let next = second.ask("poison", "hello again").await;
    assert_eq!(next.json["reply"], "echo: hello again");
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_a_kill_in_order() {
    let mock = MockModel::start(Behaviour::Slow(std::time::Duration::from_millis(100))).await;
    let rig = ChildRig::new(&mock, "");

    let mut first = rig.serve().await;
    let conversations = ["k1", "k2", "k3"];
    let per_conversation = 4;
    let mut threads = std::collections::HashMap::new();
    for i in 0..per_conversation {
        for conversation in conversations {
            let text = format!("{conversation} message {i}");
            let accepted = first
                .post(&json!({"conversation": conversation, "user": "u", "text": text, "message_id": format!("{conversation}-{i}")}))
                .await;
            assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);
            threads.insert(
                conversation,
                accepted.json["thread_id"].as_str().unwrap().to_owned(),
            );
        }
    }
    mock.wait_for_requests(1).await;
    first.kill().await;

    mock.set_behaviour(Behaviour::Echo);
    let second = rig.serve().await;
    for conversation in conversations {
        let thread_id = &threads[conversation];
        second
            .wait_for_messages(thread_id, 2 * per_conversation)
            .await;
    }
    second.wait_idle().await;
    for conversation in conversations {
        let thread = second.thread(&threads[conversation]).await;
        let messages = thread["messages"].as_array().unwrap();
        assert_eq!(
            messages.len(),
            2 * per_conversation,
            "{conversation}: {messages:#?}"
        );
        for i in 0..per_conversation {
            let text = format!("{conversation} message {i}");
            assert_eq!(messages[2 * i]["role"], "user");
            assert_eq!(
                messages[2 * i]["content"],
                text.as_str(),
                "{conversation}: in order, once"
            );
            assert_eq!(messages[2 * i + 1]["role"], "assistant");
            assert_eq!(messages[2 * i + 1]["content"], format!("echo: {text}"));
        }
        assert_eq!(thread["turns"], per_conversation);
    }
    // Each message reached the model once after its last interruption: at most one request
    // per message was cut off by the kill.
    let requests = mock.requests();
    for conversation in conversations {
        for i in 0..per_conversation {
            let text = format!("{conversation} message {i}");
            let n = requests
                .iter()
                .filter(|r| r.last_user_text() == text)
                .count();
            assert!((1..=2).contains(&n), "{text}: {n} requests");
        }
    }
    drop(second);
}
