//! Thread history survives a graceful restart on the same store.

use crate::support::{Behaviour, MockModel, TestApp, unwrap_user_text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_a_restart_and_the_thread_continues() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");

    let app = TestApp::start(&mock, &store, "").await;
    let first = app.ask("keep", "remember me").await;
    let thread_id = first.json["thread_id"].as_str().unwrap().to_owned();
    app.wait_idle().await;
    app.shutdown().await;

    let app = TestApp::start(&mock, &store, "").await;
    let thread = app.thread(&thread_id).await;
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["content"], "remember me");
    assert_eq!(messages[1]["content"], "echo: remember me");

    let second = app.ask("keep", "still there?").await;
    assert_eq!(
        second.json["thread_id"],
        thread_id.as_str(),
        "same thread after restart"
    );
    assert_eq!(second.json["reply"], "echo: still there?");
    let thread = app.thread(&thread_id).await;
    assert_eq!(thread["messages"].as_array().unwrap().len(), 4);
    assert_eq!(thread["turns"], 2);
    // The model saw the history from before the restart.
    let last = mock.requests().last().unwrap().messages_without_context();
    assert_eq!(last.len(), 4, "system + 2 old + the new message: {last:?}");
    // (input_sanitization wraps users' text in the request only: the history above is as
    // written, and the old message is still recognised as the user's after the restart.)
    assert_eq!(
        last[1]["content"],
        "<user_message>\nremember me\n</user_message>"
    );
    assert_eq!(
        unwrap_user_text(last[1]["content"].as_str().unwrap()),
        "remember me"
    );
    app.shutdown().await;

    // A third start still reads the store (the second shutdown released it too).
    let app = TestApp::start(&mock, &store, "").await;
    assert_eq!(app.thread(&thread_id).await["turns"], 2);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_title_call_cut_short_by_a_shutdown_leaves_the_question_as_the_title() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let titled = "[agent.middleware.title]\nuse_model = true\n";

    let app = TestApp::start(&mock, &store, titled).await;
    // The turn is answered; its title call (the second request) is held past the shutdown.
    mock.hold_from(1);
    let first = app.ask("short", "why is the build red").await;
    assert_eq!(first.json["reply"], "echo: why is the build red");
    let thread_id = first.json["thread_id"].as_str().unwrap().to_owned();
    mock.wait_for_requests(2).await;
    app.shutdown().await;
    mock.release();

    let app = TestApp::start(&mock, &store, titled).await;
    let thread = app.thread(&thread_id).await;
    assert_eq!(thread["title"], "why is the build red", "{thread}");
    assert_eq!(thread["turns"], 1, "{thread}");
    assert_eq!(thread["messages"].as_array().unwrap().len(), 2, "{thread}");
    // The finished turn does not run again, nor does its title call.
    app.wait_idle().await;
    assert_eq!(mock.count(), 2);
    app.shutdown().await;
}
