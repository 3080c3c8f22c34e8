//! Model endpoint failures end to end: rate limits are retried (also when they arrive inside
//! a stream), server errors end the turn with a message after the configured retries, bad
//! credentials are reported as such, a long healthy stream is not cut, and model reasoning
//! never reaches the answer.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{Behaviour, MockModel, REASONING_MARK, TestApp, read_sse};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_then_answered() {
    let mock = MockModel::start(Behaviour::RateLimited { times: 1 }).await;
    let app = TestApp::spawn(&mock, "").await;

    let answer = app.ask("r429", "are you there?").await;
    assert_eq!(answer.json["reply"], "echo: are you there?");
    assert_eq!(mock.count(), 2, "one 429, one success");
    let thread = app.thread(answer.json["thread_id"].as_str().unwrap()).await;
    assert_eq!(thread["messages"].as_array().unwrap().len(), 2);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_error_fails_the_turn_after_the_retries() {
    let mock = MockModel::start(Behaviour::ServerError).await;
    let app = TestApp::spawn(&mock, "[model]\nmax_retries = 1\n").await;

    let answer = app.ask("r500", "hello?").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.contains("failed"), "{reply}");
    assert!(reply.contains("500"), "{reply}");
    assert_eq!(mock.count(), 2, "1 attempt + max_retries (1)");

    // The failed turn is over: the next message on the conversation runs next, and the failed
    // one is not tried again before or after it.
    mock.set_behaviour(Behaviour::Echo);
    let next = app.ask("r500", "and now?").await;
    assert_eq!(next.json["reply"], "echo: and now?");
    app.wait_idle().await;
    let requests = mock.requests();
    assert_eq!(requests.len(), 3, "no retry of the failed turn");
    assert_eq!(requests[2].last_user_text(), "and now?");
    assert_eq!(app.get("/readyz").await.json["inbox"], 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_reply_mentions_credentials() {
    let mock = MockModel::start(Behaviour::Unauthorized).await;
    let app = TestApp::spawn(&mock, "").await;

    let answer = app.ask("r401", "hi").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.contains("credentials"), "{reply}");
    assert!(
        !reply.contains("sk-e2e-test-key"),
        "the key is never shown: {reply}"
    );
    assert_eq!(mock.count(), 1, "401 is not retried");
    assert_eq!(
        mock.requests()[0].body["model"],
        crate::support::MODEL_NAME,
        "the request was a normal chat completion"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_over_its_time_limit_is_stopped_with_a_message() {
    let mock = MockModel::start(Behaviour::Echo).await;
    mock.hold();
    let app = TestApp::spawn(&mock, "[agent]\nturn_timeout_secs = 1\n").await;

    let answer = app.ask("slow", "take your time").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.contains("longer than 1 seconds"), "{reply}");
    app.wait_idle().await;

    // The conversation is free again.
    mock.release();
    let next = app.ask("slow", "quick one").await;
    assert_eq!(next.json["reply"], "echo: quick one");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_healthy_stream_is_not_cut_by_any_timeout() {
    // About 8 s of deltas, one every 0.5 s, against 2 s limits: only a stream that goes
    // quiet may be cut, not one that takes long.
    let every = Duration::from_millis(500);
    let mock = MockModel::start(Behaviour::Trickle { pieces: 16, every }).await;
    let app = TestApp::spawn(
        &mock,
        "[model]\nfirst_byte_timeout_secs = 2\nidle_timeout_secs = 2\nrequest_timeout_secs = 2\n",
    )
    .await;

    let text = "a question that takes a while to answer";
    let started = Instant::now();
    let answer = app.ask("long", text).await;
    let took = started.elapsed();
    assert_eq!(answer.json["reply"], format!("echo: {text}"));
    assert!(took >= every * 16, "the stream lasted {took:?}");
    assert_eq!(mock.count(), 1, "no retry, no cut");
    assert_eq!(mock.requests()[0].body["stream"], true);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_inside_a_stream_is_retried() {
    // LiteLLM with keep-alive pings: HTTP 200, `: ping`, then an error chunk with code "429".
    let mock = MockModel::start(Behaviour::RateLimitedInStream { times: 1 }).await;
    let app = TestApp::spawn(&mock, "").await;

    let answer = app.ask("pinged", "still there?").await;
    assert_eq!(answer.json["reply"], "echo: still there?");
    assert_eq!(mock.count(), 2, "one error chunk, one answer");

    // Rate limited on every attempt: the user hears it is a rate limit, worth a retry later.
    mock.set_behaviour(Behaviour::RateLimitedInStream { times: usize::MAX });
    let answer = app.ask("pinged", "and now?").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.contains("limiting requests"), "{reply}");
    assert!(reply.contains("Send your message again"), "{reply}");
    assert!(
        reply.contains("Rate limit reached"),
        "the provider's reason: {reply}"
    );
    assert_eq!(
        mock.count(),
        4,
        "1 attempt + max_retries (1) for the second message"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_never_reaches_the_answer() {
    let mock = MockModel::start(Behaviour::Reasoning).await;
    let app = TestApp::spawn(&mock, "").await;

    // Waiting for the reply.
    let answer = app.ask("think", "what is 2+2?").await;
    assert_eq!(answer.json["reply"], "echo: what is 2+2?");
    assert!(!answer.text.contains(REASONING_MARK), "{}", answer.text);
    let thread = app.thread(answer.json["thread_id"].as_str().unwrap()).await;
    let contents: Vec<&str> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(contents, ["what is 2+2?", "echo: what is 2+2?"]);

    // Streaming the reply: no delta carries reasoning either.
    let response = app
        .http
        .post(format!("{}/api/v1/messages", app.base))
        .json(&json!({"conversation": "think-sse", "user": "u", "text": "and 3+3?", "message_id": "m-think", "stream": true}))
        .send()
        .await
        .unwrap();
    let events = read_sse(response).await;
    let deltas: String = events
        .iter()
        .filter(|(name, _)| name == "delta")
        .map(|(_, data)| data["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(deltas, "echo: and 3+3?");
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "final");
    assert_eq!(last["text"], "echo: and 3+3?");
    for (_, data) in &events {
        assert!(!data.to_string().contains(REASONING_MARK), "{data}");
    }
    assert!(mock.requests().iter().all(|r| r.body["stream"] == true));
    app.shutdown().await;
}
