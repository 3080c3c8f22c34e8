//! Model endpoint failures end to end: rate limits are retried, server errors end the turn
//! with a message after the configured retries, bad credentials are reported as such.

use crate::support::{Behaviour, MockModel, TestApp};

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
