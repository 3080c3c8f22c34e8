//! The HTTP API channel end to end: replies (plain, streamed, with a tool), dedupe, bad input,
//! attachments, authentication, operations endpoints and chat commands.

use crate::support::{Behaviour, MODEL_NAME, MockModel, TestApp, read_sse, read_sse_until};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

fn roles(thread: &Value) -> Vec<String> {
    thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_reply_with_wait() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[model]\nstream = false\n").await;

    let answer = app.ask("plain", "hello there").await;
    assert_eq!(answer.json["reply"], "echo: hello there");
    assert_eq!(answer.json["duplicate"], false);
    assert_eq!(answer.json["conversation"], "api:plain");
    let thread_id = answer.json["thread_id"].as_str().unwrap().to_owned();

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].body["model"], MODEL_NAME);
    assert_eq!(
        requests[0].body["stream"],
        Value::Null,
        "stream = false sends no stream flag"
    );
    assert_eq!(requests[0].messages()[0]["role"], "system");
    assert_eq!(requests[0].last_user_text(), "hello there");

    let thread = app.thread(&thread_id).await;
    assert_eq!(thread["id"], thread_id.as_str());
    assert_eq!(roles(&thread), ["user", "assistant"]);
    assert_eq!(thread["messages"][1]["content"], "echo: hello there");
    assert_eq!(thread["turns"], 1);
    assert!(thread["usage"]["prompt_tokens"].as_u64().unwrap() >= 10);
    assert_eq!(thread["title"], "hello there");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_reply_deltas_concatenate_to_the_final_text() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;

    let text = "please stream this rather long answer back to me";
    let response = app
        .http
        .post(format!("{}/api/v1/messages", app.base))
        .json(&json!({"conversation": "sse", "user": "u", "text": text, "message_id": "m-sse", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()[reqwest::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let events = read_sse(response).await;

    let deltas: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "delta")
        .map(|(_, data)| data)
        .collect();
    assert!(deltas.len() >= 2, "several deltas expected: {events:?}");
    assert!(deltas.iter().all(|d| d["in_reply_to"] == "m-sse"));
    let joined: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
    let (last_name, last) = events.last().unwrap();
    assert_eq!(
        last_name, "final",
        "the stream ends with the final event: {events:?}"
    );
    assert_eq!(last["in_reply_to"], "m-sse");
    assert_eq!(last["text"], format!("echo: {text}"));
    assert_eq!(joined, last["text"].as_str().unwrap());
    assert_eq!(
        events.iter().filter(|(n, _)| n == "final").count(),
        1,
        "one final event"
    );
    assert_eq!(mock.requests()[0].body["stream"], true);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_round_trip() {
    let mock = MockModel::start(Behaviour::ToolThenAnswer).await;
    let app = TestApp::spawn(&mock, "").await;

    let answer = app.ask("tools", "what time is it?").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.starts_with("The time is "), "{reply}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let tools = requests[0].body["tools"].as_array().unwrap();
    assert!(
        tools
            .iter()
            .any(|t| t["function"]["name"] == "current_time"),
        "current_time is offered: {tools:?}"
    );
    let second = requests[1].messages();
    let n = second.len();
    assert_eq!(second[n - 2]["role"], "assistant");
    assert_eq!(second[n - 2]["tool_calls"][0]["id"], "call_time_1");
    assert_eq!(second[n - 1]["role"], "tool");
    assert_eq!(second[n - 1]["tool_call_id"], "call_time_1");

    let thread = app.thread(answer.json["thread_id"].as_str().unwrap()).await;
    assert_eq!(roles(&thread), ["user", "assistant", "tool", "assistant"]);
    assert_eq!(thread["messages"][3]["content"], reply);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_answers_202_at_its_limit_and_the_turn_goes_on() {
    let mock = MockModel::start(Behaviour::Slow(Duration::from_secs(4))).await;
    let app = TestApp::spawn(&mock, "[server]\nwait_timeout_secs = 1\n").await;

    let body = json!({"conversation": "slow", "user": "u", "text": "take your time", "message_id": "w-1", "wait": true});
    let first = app.post(&body).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.text);
    assert_eq!(first.json["reply"], Value::Null, "{}", first.text);
    assert_eq!(first.json["message_id"], "w-1");
    let ready = app.get("/readyz").await;
    assert!(
        ready.json["oldest_pending_age_secs"].is_u64(),
        "the waiting item's age is shown: {}",
        ready.text
    );

    // The turn goes on; resending the message_id with `wait` gets the answer once it exists.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let answered = loop {
        let again = app.post(&body).await;
        if again.status == StatusCode::OK {
            break again;
        }
        assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.text);
        assert!(std::time::Instant::now() < deadline, "no answer");
    };
    assert_eq!(answered.json["duplicate"], true);
    assert_eq!(answered.json["reply"], "echo: take your time");
    assert_eq!(mock.count(), 1, "one turn");
    app.wait_idle().await;
    let ready = app.get("/readyz").await;
    assert_eq!(
        ready.json["oldest_pending_age_secs"],
        Value::Null,
        "{}",
        ready.text
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_message_id_twice_runs_one_turn() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;

    let body = json!({"conversation": "dup", "user": "u", "text": "only once", "message_id": "m-1", "wait": true});
    let first = app.post(&body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    assert_eq!(first.json["duplicate"], false);
    assert_eq!(first.json["reply"], "echo: only once");

    // Resent with `wait`, it is recognised and answered with the reply that already exists.
    let second = app.post(&body).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.text);
    assert_eq!(second.json["duplicate"], true);
    assert_eq!(second.json["thread_id"], first.json["thread_id"]);
    assert_eq!(second.json["message_id"], "m-1");
    assert_eq!(second.json["reply"], "echo: only once");

    app.wait_idle().await;
    assert_eq!(mock.count(), 1, "the model saw the message once");
    let thread = app.thread(first.json["thread_id"].as_str().unwrap()).await;
    assert_eq!(roles(&thread), ["user", "assistant"]);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_nothing_is_stored() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[server]\nbody_limit_bytes = 1024\n").await;

    let malformed = app.post_raw("{\"conversation\": \"c\", \"user\": ").await;
    assert_eq!(
        malformed.status,
        StatusCode::BAD_REQUEST,
        "{}",
        malformed.text
    );
    assert_eq!(malformed.json["error"]["code"], "bad_request");
    assert!(malformed.json["error"]["message"].is_string());

    let missing = app.post(&json!({"conversation": "c", "user": "u"})).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    let message = missing.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("text"),
        "names the missing field: {message}"
    );

    let unknown_field = app
        .post(&json!({"conversation": "c", "user": "u", "text": "t", "colour": "red"}))
        .await;
    assert_eq!(unknown_field.status, StatusCode::BAD_REQUEST);
    assert!(
        unknown_field.text.contains("colour"),
        "{}",
        unknown_field.text
    );

    let long_id = app
        .post(&json!({"conversation": "c".repeat(300), "user": "u", "text": "t"}))
        .await;
    assert_eq!(long_id.status, StatusCode::BAD_REQUEST);
    assert!(long_id.text.contains("conversation"), "{}", long_id.text);

    let empty = app
        .post(&json!({"conversation": "c", "user": "u", "text": "   "}))
        .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);

    let big = json!({"conversation": "c", "user": "u", "text": "x".repeat(2048)});
    let too_large = app.post_raw(big.to_string()).await;
    assert_eq!(
        too_large.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        too_large.text
    );
    assert_eq!(too_large.json["error"]["code"], "payload_too_large");

    let unknown = app.get("/api/v1/threads/no-such-thread").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json["error"]["code"], "not_found");
    let unknown_events = app.get("/api/v1/threads/no-such-thread/events").await;
    assert_eq!(unknown_events.status, StatusCode::NOT_FOUND);

    let ready = app.get("/readyz").await;
    assert_eq!(ready.json["inbox"], 0, "{}", ready.text);
    assert_eq!(ready.json["outbox_pending"], 0);
    assert_eq!(mock.count(), 0, "nothing reached the model");

    // A good message still goes through and is the only one stored.
    let ok = app.ask("c", "fine").await;
    let thread = app.thread(ok.json["thread_id"].as_str().unwrap()).await;
    assert_eq!(roles(&thread), ["user", "assistant"]);
    assert_eq!(mock.count(), 1);
    app.shutdown().await;
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_attachments_are_refused_and_nothing_is_stored() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[agent]\nmax_attachment_bytes = 100\n").await;
    let message = |id: &str, files: Value| json!({"conversation": "files", "user": "u", "text": "see attached", "message_id": id, "attachments": files});

    let not_base64 = app
        .post(&message(
            "m-b64",
            json!([{"name": "a.txt", "data_base64": "aGk"}]),
        ))
        .await;
    assert_eq!(
        not_base64.status,
        StatusCode::BAD_REQUEST,
        "{}",
        not_base64.text
    );
    assert_eq!(not_base64.json["error"]["code"], "bad_request");
    let text = not_base64.json["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("attachments[0].data_base64") && text.contains("base64"),
        "{text}"
    );

    let eleven: Vec<Value> = (0..11)
        .map(|i| json!({"name": format!("f{i}.txt"), "data_base64": b64(b"x")}))
        .collect();
    let too_many = app.post(&message("m-many", json!(eleven))).await;
    assert_eq!(
        too_many.status,
        StatusCode::BAD_REQUEST,
        "{}",
        too_many.text
    );
    let text = too_many.json["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("attachments") && text.contains("10"),
        "{text}"
    );

    let too_large = app
        .post(&message(
            "m-big",
            json!([{"name": "big.bin", "data_base64": b64(&[0; 101])}]),
        ))
        .await;
    assert_eq!(
        too_large.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        too_large.text
    );
    assert_eq!(too_large.json["error"]["code"], "payload_too_large");
    let text = too_large.json["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("attachments[0]") && text.contains("big.bin") && text.contains("100 bytes"),
        "{text}"
    );

    let nameless = app
        .post(&message(
            "m-name",
            json!([{"name": "../..", "data_base64": b64(b"x")}]),
        ))
        .await;
    assert_eq!(
        nameless.status,
        StatusCode::BAD_REQUEST,
        "{}",
        nameless.text
    );
    assert!(
        nameless.text.contains("attachments[0].name"),
        "{}",
        nameless.text
    );

    let ready = app.get("/readyz").await;
    assert_eq!(ready.json["inbox"], 0, "{}", ready.text);
    assert_eq!(ready.json["outbox_pending"], 0);
    assert_eq!(mock.count(), 0, "nothing reached the model");
    assert!(
        !app.store.join("threads").exists(),
        "no thread folder was made"
    );

    // The refused message ids were not remembered: sent again, fixed, each is new.
    let fixed = app
        .post(&message(
            "m-big",
            json!([{"name": "small.bin", "data_base64": b64(&[0; 100])}]),
        ))
        .await;
    assert_eq!(fixed.status, StatusCode::ACCEPTED, "{}", fixed.text);
    assert_eq!(fixed.json["duplicate"], false);
    app.wait_idle().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_may_be_only_a_file() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;

    let with_words = app
        .post(&json!({
            "conversation": "files", "user": "u", "text": "summarise this", "wait": true,
            "attachments": [{"name": "notes.txt", "media_type": "text/plain", "data_base64": b64(b"some notes")}],
        }))
        .await;
    assert_eq!(with_words.status, StatusCode::OK, "{}", with_words.text);
    // The file was stored in the thread's uploads at turn time, and the model was told
    // where, as it sees the folder (the echo repeats the user message the model got).
    let thread_id = with_words.json["thread_id"].as_str().unwrap();
    let stored = app
        .store
        .join("threads")
        .join(thread_id)
        .join("uploads/notes.txt");
    assert_eq!(std::fs::read(&stored).unwrap(), b"some notes");
    let reply = with_words.json["reply"].as_str().unwrap();
    assert!(
        reply.starts_with("echo: summarise this\n\n<uploaded_files>"),
        "{reply}"
    );
    assert!(
        reply.contains("- notes.txt (10 bytes): /mnt/user-data/uploads/notes.txt\n"),
        "{reply}"
    );
    assert!(!reply.contains(&app.store.display().to_string()), "{reply}");

    let only_a_file = app
        .post(&json!({
            "conversation": "files-only", "user": "u", "message_id": "m-file",
            "attachments": [{"name": "photo.png", "media_type": "image/png", "data_base64": b64(&[137, 80, 78, 71])}],
        }))
        .await;
    assert_eq!(
        only_a_file.status,
        StatusCode::ACCEPTED,
        "{}",
        only_a_file.text
    );
    assert_eq!(only_a_file.json["message_id"], "m-file");
    assert!(only_a_file.json["thread_id"].is_string());

    // Neither words nor files: refused as before.
    let nothing = app
        .post(&json!({"conversation": "files", "user": "u", "text": "", "attachments": []}))
        .await;
    assert_eq!(nothing.status, StatusCode::BAD_REQUEST, "{}", nothing.text);
    assert!(nothing.text.contains("text"), "{}", nothing.text);
    app.wait_idle().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_is_required_when_configured() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let mut app = TestApp::spawn(&mock, "[channels.api]\ntoken = \"s3cret-token\"\n").await;
    let body = json!({"conversation": "auth", "user": "u", "text": "hi"});

    let missing = app.post(&body).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(missing.json["error"]["code"], "unauthorized");

    app.client.token = Some("wrong-token".to_owned());
    let wrong = app.post(&body).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let wrong_get = app.get("/api/v1/threads/anything").await;
    assert_eq!(wrong_get.status, StatusCode::UNAUTHORIZED);

    app.client.token = Some("s3cret-token".to_owned());
    assert_eq!(
        app.get("/readyz").await.json["inbox"],
        0,
        "nothing was stored"
    );
    let right = app.post(&body).await;
    assert_eq!(right.status, StatusCode::ACCEPTED, "{}", right.text);
    let thread_id = right.json["thread_id"].as_str().unwrap().to_owned();
    let thread = app.wait_for_messages(&thread_id, 2).await;
    assert_eq!(thread["messages"][1]["content"], "echo: hi");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;

    let health = app.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK);

    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(ready.json["ready"], true, "{}", ready.text);
    assert_eq!(ready.json["store"], "ok");
    assert_eq!(ready.json["model_configured"], true);

    app.ask("metrics", "count me").await;
    app.wait_idle().await;
    let metrics = app.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    let content_type = metrics.headers[reqwest::header::CONTENT_TYPE]
        .to_str()
        .unwrap();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = &metrics.text;
    assert!(text.contains("antler_turns_total"), "{text}");
    assert!(text.contains("antler_webhooks_received_total"), "{text}");
    assert!(text.contains("antler_model_requests_total"), "{text}");
    assert!(text.contains("antler_inbox_oldest_age_seconds"), "{text}");
    let turns_ok = text
        .lines()
        .find(|l| l.starts_with("antler_turns_total") && l.contains("outcome=\"ok\""))
        .unwrap_or_else(|| panic!("no ok turns line in {text}"));
    let value: f64 = turns_ok.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= 1.0, "{turns_ok}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_commands() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;

    let help = app.ask("cmd", "/help").await;
    let help_text = help.json["reply"].as_str().unwrap();
    for command in ["/help", "/new", "/status"] {
        assert!(help_text.contains(command), "{help_text}");
    }
    assert_eq!(mock.count(), 0, "commands do not call the model");

    let first = app.ask("cmd", "first message").await;
    let old_thread = first.json["thread_id"].as_str().unwrap().to_owned();
    assert_eq!(first.json["reply"], "echo: first message");

    let status = app.ask("cmd", "/status").await;
    let status_text = status.json["reply"].as_str().unwrap();
    assert!(status_text.contains(MODEL_NAME), "{status_text}");
    assert!(status_text.contains(&old_thread), "{status_text}");

    let new = app.ask("cmd", "/new").await;
    let new_thread = new.json["thread_id"].as_str().unwrap().to_owned();
    assert_ne!(new_thread, old_thread);

    let next = app.ask("cmd", "second message").await;
    assert_eq!(next.json["thread_id"], new_thread.as_str());
    let fresh = app.thread(&new_thread).await;
    assert_eq!(roles(&fresh), ["user", "assistant"]);
    assert_eq!(fresh["messages"][0]["content"], "second message");
    assert_eq!(
        mock.requests()
            .last()
            .unwrap()
            .messages_without_context()
            .len(),
        2,
        "system + the new message only"
    );

    let old = app.thread(&old_thread).await;
    assert_eq!(roles(&old), ["user", "assistant"]);
    assert_eq!(old["messages"][0]["content"], "first message");

    let unknown = app.ask("cmd", "/frobnicate").await;
    assert!(
        unknown.json["reply"]
            .as_str()
            .unwrap()
            .contains("Unknown command")
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_events_stream_deltas_and_final_answers() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;

    let first = app.ask("events", "first").await;
    let thread_id = first.json["thread_id"].as_str().unwrap().to_owned();
    let response = app
        .http
        .get(format!("{}/api/v1/threads/{thread_id}/events", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The subscription is live once the response head arrived.
    let reader = tokio::spawn(read_sse_until(response, |events| {
        events.iter().any(|(name, _)| name == "final")
    }));
    let posted = app
        .post(&json!({"conversation": "events", "user": "u", "text": "second message", "message_id": "m-ev"}))
        .await;
    assert_eq!(posted.status, StatusCode::ACCEPTED);
    let events = reader.await.unwrap();
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "final");
    assert_eq!(last["in_reply_to"], "m-ev");
    assert_eq!(last["text"], "echo: second message");
    let joined: String = events
        .iter()
        .filter(|(name, _)| name == "delta")
        .map(|(_, data)| data["text"].as_str().unwrap())
        .collect();
    assert_eq!(joined, "echo: second message");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_is_not_allowed_is_told_once_and_nothing_runs() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[channels.api]\nallowed_users = [\"alice\"]\n").await;

    let ask = |user: &str, id: &str, text: &str| json!({"conversation": "shared", "user": user, "text": text, "message_id": id, "wait": true});
    let refused = app.post(&ask("bob", "b1", "hello")).await;
    assert_eq!(refused.status, StatusCode::OK, "{}", refused.text);
    assert_eq!(
        refused.json["reply"],
        "Sorry, you are not allowed to use this bot. Your user id is bob; an operator can add \
         it to channels.api.allowed_users."
    );

    // Within the hour: acknowledged, stored nowhere, not answered again.
    let again = app.post(&ask("bob", "b2", "hello?")).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.text);
    assert_eq!(again.json["dropped"], true);
    assert!(again.json.get("reply").is_none(), "{}", again.text);

    let alice = app.post(&ask("alice", "a1", "hi")).await;
    assert_eq!(alice.status, StatusCode::OK, "{}", alice.text);
    assert_eq!(alice.json["reply"], "echo: hi");

    app.wait_idle().await;
    assert_eq!(mock.count(), 1, "only alice's message reached the model");
    assert_eq!(mock.requests()[0].last_user_text(), "hi");
    // Bob's words never entered the shared thread.
    let thread = app.thread(alice.json["thread_id"].as_str().unwrap()).await;
    assert_eq!(roles(&thread), ["user", "assistant"]);
    app.shutdown().await;
}
