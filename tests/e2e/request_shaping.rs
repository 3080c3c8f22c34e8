//! How middlewares shape the model request, seen at the mock model:
//! - images to vision models: an image sent with a message through the API channel reaches
//!   the model request as an `image_url` content part (a `data:` URL) when
//!   `[model] vision = true`, and not at all otherwise; the thread never stores the bytes;
//! - summarization: a long history is compacted by a helper model call into one summary
//!   message, while the stored thread keeps every message; when that call fails the request
//!   goes unsummarised, nothing stands in for the history, and the next model call tries again.

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::TestApp;
use crate::support::mock_model::{Behaviour, MockModel, SUMMARY_PROMPT, unwrap_user_text};

/// A PNG signature and the start of its header: enough for antler to know it is a PNG.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Sends "what is in this picture?" with `dot.png` and returns the model's last request's
/// last user message, and the thread.
async fn send_picture(vision: bool) -> (Value, Value) {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, &format!("[model]\nvision = {vision}\n")).await;
    let answer = app
        .post(&json!({
            "conversation": "pictures", "user": "u", "text": "what is in this picture?",
            "wait": true,
            "attachments": [{"name": "dot.png", "media_type": "image/png", "data_base64": b64(PNG)}],
        }))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let reply = answer.json["reply"].as_str().unwrap_or_default().to_owned();
    assert!(
        reply.starts_with("echo: what is in this picture?"),
        "the text still reaches the model: {reply}"
    );
    let requests = mock.requests();
    let last = requests.last().expect("a model request");
    let user = last
        .messages()
        .into_iter()
        .rev()
        .find(|m| m["role"] == "user")
        .expect("a user message");
    let thread_id = answer.json["thread_id"].as_str().unwrap().to_owned();
    let thread = app.thread(&thread_id).await;
    app.wait_idle().await;
    app.shutdown().await;
    (user, thread)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_reaches_a_vision_model_as_a_data_url_part() {
    let (user, thread) = send_picture(true).await;
    let parts = user["content"]
        .as_array()
        .unwrap_or_else(|| panic!("content parts expected: {user}"));
    assert_eq!(parts[0]["type"], "text", "{user}");
    let text = parts[0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("<user_message>\n"),
        "input_sanitization wraps it: {text}"
    );
    let text = unwrap_user_text(text);
    assert!(text.starts_with("what is in this picture?"), "{text}");
    assert!(text.contains("/mnt/user-data/uploads/dot.png"), "{text}");
    assert_eq!(
        parts[1],
        json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(PNG))}})
    );
    assert_eq!(parts.len(), 2);
    // The stored thread keeps the text, not the image.
    assert!(!thread.to_string().contains("data:image/png"), "{thread}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_vision_gets_only_the_uploads_list() {
    let (user, _thread) = send_picture(false).await;
    let text = user["content"]
        .as_str()
        .unwrap_or_else(|| panic!("plain text content expected: {user}"));
    assert!(text.contains("/mnt/user-data/uploads/dot.png"), "{text}");
    assert!(!user.to_string().contains("image_url"), "{user}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_history_is_summarized_by_a_helper_call_and_the_thread_keeps_everything() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(
        &mock,
        "[agent.middleware.summarization]\ntrigger_tokens = 1000\nkeep_messages = 2\n",
    )
    .await;
    let long = |tag: &str| format!("{tag}:{}", " word".repeat(600));
    let first = app.ask("long", &long("first")).await;
    assert_eq!(mock.count(), 1, "under the threshold: no helper call");
    let second = app.ask("long", &long("second")).await;
    assert!(
        second.json["reply"]
            .as_str()
            .unwrap_or_default()
            .starts_with("echo: second:"),
        "{}",
        second.text
    );

    let requests = mock.requests();
    assert_eq!(
        requests.len(),
        3,
        "one turn, then a summary call and a turn"
    );
    let summary_call = &requests[1];
    let prompt = summary_call.last_user_text();
    assert!(prompt.contains("Context Extraction Assistant"), "{prompt}");
    assert!(prompt.contains("[user]: first:"), "{prompt}");
    assert!(summary_call.body.get("tools").is_none_or(Value::is_null));
    // The turn's request: system prompt, the summary, then the kept messages.
    let messages = requests[2].messages_without_context();
    assert_eq!(messages[0]["role"], "system");
    let summary = messages[1]["content"].as_str().unwrap_or_default();
    assert!(summary.starts_with("<conversation_summary>"), "{summary}");
    assert!(
        summary.contains("Context Extraction Assistant"),
        "the echo is the summary"
    );
    assert_eq!(
        messages.len(),
        4,
        "summary + the first answer + the question"
    );
    let question = unwrap_user_text(messages[3]["content"].as_str().unwrap());
    assert!(question.starts_with("second:"), "{question}");

    // The thread itself keeps all four messages.
    let thread_id = first.json["thread_id"].as_str().unwrap();
    let thread = app.wait_for_messages(thread_id, 4).await;
    assert_eq!(thread["messages"].as_array().map(Vec::len), Some(4));
    app.wait_idle().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_summary_call_leaves_the_history_unsummarised_and_is_tried_again() {
    let mock = MockModel::start(Behaviour::FailSummaries).await;
    let app = TestApp::spawn(
        &mock,
        "[agent.middleware.summarization]\ntrigger_tokens = 1000\nkeep_messages = 2\n",
    )
    .await;
    let long = |tag: &str| format!("{tag}:{}", " word".repeat(600));
    let is_summary_call =
        |r: &crate::support::mock_model::Recorded| r.last_user_text().contains(SUMMARY_PROMPT);
    let first = app.ask("long", &long("first")).await;
    let thread_id = first.json["thread_id"].as_str().unwrap().to_owned();

    // Over the threshold, the summary call fails: the turn's request holds the whole history.
    for (turn, tag) in [(2, "second"), (3, "third")] {
        let answer = app.ask("long", &long(tag)).await;
        let reply = answer.json["reply"].as_str().unwrap_or_default();
        assert!(
            reply.starts_with(&format!("echo: {tag}:")),
            "{}",
            answer.text
        );
        let requests = mock.requests();
        assert_eq!(
            requests.iter().filter(|r| is_summary_call(r)).count(),
            turn - 1,
            "every model call over the threshold tries again"
        );
        let Some(last) = requests.last() else {
            panic!("no requests")
        };
        assert!(!is_summary_call(last));
        let messages = last.messages_without_context();
        // The system prompt, every earlier question and answer, this question.
        assert_eq!(messages.len(), 1 + 2 * (turn - 1) + 1, "{messages:#?}");
        let first_question = unwrap_user_text(messages[1]["content"].as_str().unwrap());
        assert!(first_question.starts_with("first:"), "{first_question}");
        for message in &messages {
            let text = message["content"].as_str().unwrap_or_default();
            assert!(!text.contains("<conversation_summary>"), "{text}");
            assert!(!text.contains("could not be summarized"), "{text}");
        }
    }
    let thread = app.wait_for_messages(&thread_id, 6).await;
    assert!(
        !thread.to_string().contains("could not be summarized"),
        "{thread}"
    );

    // Once the provider answers again, the history is summarized.
    mock.set_behaviour(Behaviour::Echo);
    app.ask("long", &long("fourth")).await;
    let requests = mock.requests();
    let Some(last) = requests.last() else {
        panic!("no requests")
    };
    let summary = last.messages()[1]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(summary.starts_with("<conversation_summary>"), "{summary}");
    app.wait_idle().await;
    app.shutdown().await;
}
