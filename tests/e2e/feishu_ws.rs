//! Feishu's long connection end to end (`channels.feishu.mode = "websocket"`): events arrive
//! as protobuf frames on a WebSocket antler opens (the mock in
//! `antler_testkit::feishu_socket`, found through the mock Open Platform's
//! `/callback/ws/endpoint`), run through the same normalization, inbox and turns as the
//! webhook's, and are answered on the mock's message API; each event's frame is answered
//! (acked) with code 200 once the event is stored.

use antler_testkit::feishu::{GROUP_MESSAGE, MockFeishu, P2P_MESSAGE, fixture, p2p, shown};
use antler_testkit::feishu_socket::{DEVICE_ID, Frame, SERVICE_ID, client_config};
use serde_json::json;

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, TestApp, free_port, run_binary};

/// The answer's status (`{"code": …}` in its payload).
fn code(answer: &Frame) -> i64 {
    answer.json()["code"].as_i64().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_mention_is_answered_acked_once_stored_and_a_redelivery_answered_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockFeishu::start().await;
    // The pongs shorten the ping interval to 1 s: a second ping proves the client pings on
    // the interval and takes the server's new ClientConfig.
    let mut pong_config = client_config();
    pong_config["PingInterval"] = json!(1);
    let socket = api.serve_socket(client_config()).await;
    socket.set_pong_config(pong_config);
    let app = TestApp::spawn(&model, &api.socket_config("")).await;

    socket
        .send_event("frame-1", &fixture("feishu_im_group_mention.json"))
        .await;
    let replies = api.wait_for_replies(1).await;
    assert_eq!(
        replies[0].0,
        format!("/open-apis/im/v1/messages/{GROUP_MESSAGE}/reply")
    );
    assert_eq!(shown(&replies[0].1), "echo: restart web-api");
    let answers = socket.wait_for_answers(1).await;
    let answer = &answers[0];
    assert_eq!(code(answer), 200, "{:?}", answer.json());
    assert_eq!(answer.header("message_id"), Some("frame-1"));
    assert_eq!(answer.header("type"), Some("event"));
    assert!(
        answer
            .header("biz_rt")
            .is_some_and(|ms| ms.parse::<u64>().is_ok()),
        "the answer says how long the event took: {:?}",
        answer.headers
    );
    assert_eq!(answer.method, 1);
    assert_eq!(answer.service, SERVICE_ID);

    // Feishu delivers the same message again (a new frame, a new event id): acked, not
    // answered twice.
    let mut again = fixture("feishu_im_group_mention.json");
    again["header"]["event_id"] = json!("ev-redelivered");
    socket.send_event("frame-2", &again).await;
    let answers = socket.wait_for_answers(2).await;
    assert_eq!(answers[1].header("message_id"), Some("frame-2"));
    assert_eq!(code(&answers[1]), 200);
    app.wait_idle().await;
    assert_eq!(api.replies().await.len(), 1, "one reply for one message");

    let pings = socket.wait_for_pings(2).await;
    assert!(
        pings
            .iter()
            .all(|p| p.method == 0 && p.service == SERVICE_ID && p.header("type") == Some("ping"))
    );
    assert_eq!(api.endpoint_calls().await, 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_is_acked_only_once_its_event_is_stored() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockFeishu::start().await;
    let socket = api.serve_socket(client_config()).await;
    let overrides = format!(
        "[agent]\nbacklog = 1\nmax_concurrent_turns = 1\n{}",
        api.socket_config("")
    );
    let app = TestApp::spawn(&model, &overrides).await;
    let first = p2p("om_first", "text", &json!({"text": "first"}));
    socket.send_event("frame-1", &first).await;
    assert_eq!(code(&socket.wait_for_answers(1).await[0]), 200);
    model.wait_for_requests(1).await;

    // The backlog is full: the second event cannot be stored, so its frame is not acked with
    // 200 but answered 500, and Feishu delivers it again (the webhook answers 503 here).
    let mut second = p2p("om_second", "text", &json!({"text": "second"}));
    second["event"]["message"]["chat_id"] = json!("oc_another_chat");
    socket.send_event("frame-2", &second).await;
    let answers = socket.wait_for_answers(2).await;
    assert_eq!(answers[1].header("message_id"), Some("frame-2"));
    assert_eq!(code(&answers[1]), 500);
    assert_eq!(app.get("/readyz").await.json["inbox"], 1, "not stored");

    model.release();
    app.wait_idle().await;
    // Delivered again with room: stored, acked, answered.
    socket.send_event("frame-3", &second).await;
    let answers = socket.wait_for_answers(3).await;
    assert_eq!(code(&answers[2]), 200);
    api.wait_for_replies(2).await;
    app.wait_idle().await;
    let replied: Vec<String> = api
        .replies()
        .await
        .into_iter()
        .map(|(path, _)| path)
        .collect();
    assert_eq!(
        replied,
        [
            "/open-apis/im/v1/messages/om_first/reply",
            "/open-apis/im/v1/messages/om_second/reply"
        ]
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_split_in_two_parts_is_reassembled() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockFeishu::start().await;
    let socket = api.serve_socket(client_config()).await;
    let app = TestApp::spawn(&model, &api.socket_config("")).await;
    let event = p2p(
        P2P_MESSAGE,
        "text",
        &json!({"text": "a message long enough to come in two parts"}),
    );
    socket.send_split("frame-split", &event, 2).await;
    let replies = api.wait_for_replies(1).await;
    assert_eq!(
        shown(&replies[0].1),
        "echo: a message long enough to come in two parts"
    );
    app.wait_idle().await;
    let answers = socket.wait_for_answers(1).await;
    assert_eq!(
        answers.len(),
        1,
        "one answer, for the part that completed it"
    );
    // The parts were sent last first: seq 0 completed the payload.
    assert_eq!(answers[0].header("seq"), Some("0"));
    assert_eq!(code(&answers[0]), 200);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_server_closes_the_socket_the_client_reconnects_and_is_answered_there() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockFeishu::start().await;
    let socket = api.serve_socket(client_config()).await;
    let app = TestApp::spawn(&model, &api.socket_config("")).await;
    socket.wait_for_connections(1).await;
    socket.close_connection();
    socket.wait_for_connections(2).await;
    assert_eq!(
        api.endpoint_calls().await,
        2,
        "each connection asks the endpoint for its URL"
    );
    let event = p2p(
        "om_after_reconnect",
        "text",
        &json!({"text": "still there?"}),
    );
    socket.send_event("frame-after", &event).await;
    let replies = api.wait_for_replies(1).await;
    assert_eq!(
        replies[0].0,
        "/open-apis/im/v1/messages/om_after_reconnect/reply"
    );
    assert_eq!(code(&socket.wait_for_answers(1).await[0]), 200);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acked_event_survives_kill_9_and_is_answered_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    // The model does not answer while the first process lives: the turn stays in flight.
    model.hold();
    let api = MockFeishu::start().await;
    let socket = api.serve_socket(client_config()).await;
    let rig = ChildRig::new(&model, &api.socket_config(""));
    let mut first = rig.serve().await;
    let event = p2p("om_survivor", "text", &json!({"text": "survive this"}));
    socket.send_event("frame-1", &event).await;
    let answers = socket.wait_for_answers(1).await;
    assert_eq!(code(&answers[0]), 200);
    // Acked, so stored: a SIGKILL now must not lose it.
    first.kill().await;
    assert!(api.replies().await.is_empty(), "{}", first.log_text());

    model.release();
    let second = rig.serve().await;
    socket.wait_for_connections(2).await;
    // Feishu delivers it again on the new connection: acked, and still one answer.
    socket.send_event("frame-2", &event).await;
    let answers = socket.wait_for_answers(2).await;
    assert_eq!(code(&answers[1]), 200);
    let replies = api.wait_for_replies(1).await;
    assert_eq!(replies[0].0, "/open-apis/im/v1/messages/om_survivor/reply");
    assert_eq!(shown(&replies[0].1), "echo: survive this");
    second.wait_idle().await;
    assert_eq!(api.replies().await.len(), 1, "{}", second.log_text());
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_long_connections_endpoint_without_connecting() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockFeishu::start().await;
    let socket = api.serve_socket(client_config()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("antler.toml");
    let text = crate::support::config_text(
        &model.base_url(),
        &dir.path().join("store"),
        &format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\n{}",
            free_port(),
            api.socket_config("")
        ),
    );
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    let (code, stdout, _) = run_binary(&["doctor", "--config", &path]).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("ok    feishu") && stdout.contains("long connection's endpoint answers"),
        "{stdout}"
    );
    assert_eq!(api.endpoint_calls().await, 1);
    assert_eq!(socket.connections(), 0, "doctor does not connect");

    api.refuse_socket_endpoint(1_000_040_350, "exceed connection limit")
        .await;
    let (code, stdout, _) = run_binary(&["doctor", "--config", &path]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  feishu") && stdout.contains("too many connections"),
        "{stdout}"
    );
    assert!(
        !stdout.contains(DEVICE_ID) && !stdout.contains("feishu-APP-secret"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_before_the_bot_knows_itself_is_answered_500_then_taken_when_redelivered() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockFeishu::start().await;
    api.set_bot_info_down(true);
    let socket = api.serve_socket(client_config()).await;
    let app = TestApp::spawn(&model, &api.socket_config("")).await;
    let mention = fixture("feishu_im_group_mention.json");
    socket.send_event("frame-1", &mention).await;
    let answers = socket.wait_for_answers(1).await;
    assert_eq!(
        code(&answers[0]),
        500,
        "not taken: Feishu delivers it again"
    );
    assert_eq!(app.get("/readyz").await.json["inbox"], 0);

    api.set_bot_info_down(false);
    // Feishu's redeliveries, until antler has learned its open id (asked again in the
    // background, with backoff).
    let mut n = 1;
    loop {
        let asked = api.calls("GET", "/bot/v3/info").await.len();
        n += 1;
        assert!(n < 10, "the identity was never learned");
        socket.send_event(&format!("frame-{n}"), &mention).await;
        if code(&socket.wait_for_answers(n).await[n - 1]) == 200 {
            break;
        }
        crate::support::wait_until("bot/v3/info asked again", || async {
            (api.calls("GET", "/bot/v3/info").await.len() > asked).then_some(())
        })
        .await;
    }
    let replies = api.wait_for_replies(1).await;
    assert_eq!(shown(&replies[0].1), "echo: restart web-api");
    app.wait_idle().await;
    assert_eq!(api.replies().await.len(), 1);
    app.shutdown().await;
}
