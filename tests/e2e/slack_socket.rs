//! Slack's Socket Mode end to end: antler opens `apps.connections.open` on the mock Web API,
//! connects to the `ws://127.0.0.1` URL it answers (a mock Socket Mode server speaking Slack's
//! protocol: `hello`, envelopes, acknowledgements, `disconnect`), and answers through the mock
//! Web API as it does for the webhooks.

use std::time::Duration;

use antler_testkit::slack::{
    APP_TOKEN, CHANNEL, MockSlack, MockSocket, THREAD, fixture, form_as_json, post_event,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, TestApp, wait_until};

/// Slack, "Using Socket Mode": an `events_api` envelope's payload is the Events API body, and
/// the app acknowledges `{"envelope_id"}`; one not acknowledged is sent again with
/// `retry_attempt` counting up. antler acknowledges only what it stored: at the ack the message
/// is in the inbox (the model is held), and survives a kill -9; the redelivery to the restarted
/// antler is acknowledged and not answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_is_acked_once_stored_and_answered_once_despite_a_redelivery() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockSlack::start().await;
    let socket = MockSocket::start().await;
    api.serve_socket(&socket).await;
    let rig = ChildRig::new(&model, &api.socket_config(APP_TOKEN, ""));
    let mut first = rig.serve().await;
    socket.wait_for_connections(1).await;

    let mention: Value = serde_json::from_str(&fixture("slack_app_mention_thread.json")).unwrap();
    socket.send_envelope("env-mention-1", "events_api", mention.clone(), 0);
    let acks = socket.wait_for_acks("env-mention-1", 1).await;
    assert_eq!(acks[0].get("payload"), None, "an event's ack is bare");
    let ready = first.client.get("/readyz").await;
    assert_eq!(
        ready.json["inbox"], 1,
        "stored before it was acknowledged: {}",
        ready.text
    );
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    let posted = api.wait_for_posts(1).await;
    assert_eq!(posted[0]["channel"], CHANNEL);
    assert_eq!(posted[0]["thread_ts"], THREAD);
    assert_eq!(posted[0]["text"], "echo: restart web-api &amp; report");

    // Slack saw the ack, but redelivers as if it had not (retry_attempt 1), to the new
    // connection: acknowledged, recognised, not answered again.
    socket.wait_for_connections(2).await;
    socket.send_envelope("env-mention-2", "events_api", mention, 1);
    let acks = socket.wait_for_acks("env-mention-2", 1).await;
    assert_eq!(acks.len(), 1);
    second.client.wait_idle().await;
    let posted = api.posted().await;
    assert_eq!(posted.len(), 1, "{posted:?}\n{}", second.log_text());
}

/// An envelope whose event cannot be stored (the backlog is full) is not acknowledged, as the
/// webhook answers 503: Slack delivers it again, and then it is answered. Envelopes are read
/// in order, so once the next one's ack has come the unstored one has been dealt with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_that_cannot_be_stored_is_not_acked_and_its_redelivery_is_answered() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockSlack::start().await;
    let socket = MockSocket::start().await;
    api.serve_socket(&socket).await;
    let config = format!(
        "[agent]\nbacklog = 1\nmax_concurrent_turns = 1\n{}",
        api.socket_config(APP_TOKEN, "")
    );
    let app = TestApp::spawn(&model, &config).await;
    socket.wait_for_connections(1).await;

    let mention: Value = serde_json::from_str(&fixture("slack_app_mention_thread.json")).unwrap();
    socket.send_envelope("env-a", "events_api", mention, 0);
    socket.wait_for_acks("env-a", 1).await;
    model.wait_for_requests(1).await;
    let dm: Value = serde_json::from_str(&fixture("slack_message_im.json")).unwrap();
    socket.send_envelope("env-b", "events_api", dm.clone(), 0);
    socket.send_envelope("env-c", "interactive", json!({"type": "block_actions"}), 0);
    socket.wait_for_acks("env-c", 1).await;
    let acked: Vec<Value> = socket.acks().into_iter().map(|(_, ack)| ack).collect();
    assert!(
        !acked.iter().any(|ack| ack["envelope_id"] == "env-b"),
        "not stored, not acknowledged: {acked:?}"
    );
    assert_eq!(app.get("/readyz").await.json["inbox"], 1);

    model.release();
    app.wait_idle().await;
    socket.send_envelope("env-b-retry", "events_api", dm, 1);
    socket.wait_for_acks("env-b-retry", 1).await;
    let posted = api.wait_for_posts(2).await;
    assert_eq!(posted[1]["channel"], "D0ADA00001");
    assert_eq!(posted[1]["text"], "echo: status payments-api");
    app.wait_idle().await;
    assert_eq!(api.posted().await.len(), 2);
    app.shutdown().await;
}

/// A `slash_commands` envelope carries the command's form fields as JSON and accepts a
/// response payload: the ack carries what the webhook answers (the ephemeral "Working on it"),
/// and the answer goes to the command's `response_url`. In Socket Mode the Slack webhooks are
/// not served (there is no signing secret to verify them with). Shutdown closes the
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_command_is_acked_with_its_reply_and_answered_through_its_response_url() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let socket = MockSocket::start().await;
    api.serve_socket(&socket).await;
    let app = TestApp::spawn(&model, &api.socket_config(APP_TOKEN, "")).await;
    socket.wait_for_connections(1).await;

    let command = form_as_json(&api.slash_command("status payments-api"));
    assert_eq!(command["text"], "status payments-api");
    assert_eq!(command["response_url"], api.response_url().as_str());
    socket.send_envelope("env-slash-1", "slash_commands", command, 0);
    let acks = socket.wait_for_acks("env-slash-1", 1).await;
    assert_eq!(acks[0]["payload"]["response_type"], "ephemeral");
    assert_eq!(acks[0]["payload"]["text"], antler_slack::WORKING);
    let responses = wait_until("the answer through the response_url", || async {
        let responses = api.responses().await;
        (!responses.is_empty()).then_some(responses)
    })
    .await;
    assert_eq!(responses[0]["text"], "echo: status payments-api");
    assert_eq!(responses[0]["response_type"], "ephemeral");
    app.wait_idle().await;
    assert_eq!(api.responses().await.len(), 1);
    assert!(api.posted().await.is_empty(), "no chat.postMessage");

    let unsigned = fixture("slack_app_mention_thread.json");
    assert_eq!(
        post_event(&app.base, &unsigned).await,
        StatusCode::NOT_FOUND,
        "no webhook in Socket Mode"
    );
    assert_eq!(socket.closed(), 0);
    app.shutdown().await;
    wait_until("the connection is closed", || async {
        (socket.closed() == 1).then_some(())
    })
    .await;
    assert_eq!(socket.connections(), 1, "one connection per app");
}

/// `{"type": "disconnect", "reason": "refresh_requested"}` ("Using Socket Mode": Slack asks for
/// a new connection before it ends one): antler calls `apps.connections.open` again and
/// answers what comes on the new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_opens_a_new_connection_where_events_are_answered() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let socket = MockSocket::start().await;
    let opened = api.serve_socket(&socket).await;
    let app = TestApp::spawn(&model, &api.socket_config(APP_TOKEN, "")).await;
    socket.wait_for_connections(1).await;

    socket.disconnect("refresh_requested");
    socket.wait_for_connections(2).await;
    assert_eq!(
        opened.lock().unwrap().len(),
        2,
        "a new URL for each connection"
    );
    let mention: Value = serde_json::from_str(&fixture("slack_app_mention_thread.json")).unwrap();
    socket.send_envelope("env-after-refresh", "events_api", mention, 0);
    let acks = socket.wait_for_acks("env-after-refresh", 1).await;
    assert_eq!(acks.len(), 1);
    let on_second = socket
        .acks()
        .into_iter()
        .any(|(connection, ack)| connection == 2 && ack["envelope_id"] == "env-after-refresh");
    assert!(on_second, "acknowledged on the new connection");
    let posted = api.wait_for_posts(1).await;
    assert_eq!(posted[0]["text"], "echo: restart web-api &amp; report");
    app.wait_idle().await;
    assert_eq!(api.posted().await.len(), 1);
    app.shutdown().await;
}

/// An app token Slack refuses (`invalid_auth`) is logged, without the token, and tried again
/// with growing waits (antler's retry policy: 0.5-1 s, then 1-2 s, …); antler keeps serving,
/// and `/readyz` shows Slack unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_app_token_is_logged_and_retried_with_backoff() {
    const WRONG: &str = "xapp-1-A0OPSBOT001-1-REVOKED-token";
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let socket = MockSocket::start().await;
    let opened = api.serve_socket(&socket).await;
    let rig = ChildRig::new(&model, &api.socket_config(WRONG, ""));
    let child = rig.serve().await;
    let times = wait_until("three apps.connections.open calls", || async {
        let times = opened.lock().unwrap().clone();
        (times.len() >= 3).then_some(times)
    })
    .await;
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= Duration::from_millis(450), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(950), "{gaps:?}");
    assert_eq!(socket.connections(), 0);
    assert!(child.client.is_healthy().await, "still serving");
    let log = child.log_text();
    assert!(log.contains("invalid_auth"), "{log}");
    assert!(!log.contains("REVOKED"), "the token is not logged: {log}");
    // `/readyz` shows Slack refused, and why, without the token; antler stays ready.
    let readyz = child.client.get("/readyz").await.json;
    let slack = &readyz["channels"]["slack"];
    assert_eq!(
        (&readyz["ready"], &slack["ok"]),
        (&json!(true), &json!(false)),
        "{readyz}"
    );
    assert!(
        slack["refused"]
            .as_str()
            .is_some_and(|why| why.contains("invalid_auth")),
        "{slack}"
    );
    assert!(!readyz.to_string().contains("REVOKED"), "{readyz}");
}
