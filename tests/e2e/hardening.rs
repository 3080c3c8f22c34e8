//! The core under disconnects, hostile clients and failures: each test reproduces a symptom an
//! outside review found, through real HTTP.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{
    Behaviour, ChildRig, Client, DEADLINE, MockModel, TestApp, free_port, metric_value, sigterm,
    wait_until,
};

/// Sends raw bytes on a new connection and reads what comes back until the server closes the
/// connection or `limit` passes.
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8], limit: Duration) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(limit, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buffer[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn post_head(body_len: usize, extra: &str) -> String {
    format!(
        "POST /api/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {body_len}\r\n{extra}\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_from_clients_that_hang_up_are_still_queued_and_answered() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;
    let n = 120;
    for i in 0..n {
        let body = json!({
            "conversation": format!("hangup-{}", i % 4),
            "user": "u",
            "text": format!("message {i}"),
            "message_id": format!("m{i}"),
        })
        .to_string();
        let mut stream = TcpStream::connect(app.addr).await.unwrap();
        stream
            .write_all(format!("{}{body}", post_head(body.len(), "")).as_bytes())
            .await
            .unwrap();
        // Reset (not close) the connection 0–4 ms after sending, while antler is storing
        // and syncing: the handler future is dropped mid-accept.
        stream.set_zero_linger().unwrap();
        tokio::time::sleep(Duration::from_millis(i % 5)).await;
        drop(stream);
    }
    // Each client retries; whatever antler had stored is recognised and answered, without a
    // restart. A message stored but never queued would make its retry wait in vain.
    for i in 0..n {
        let retry = app
            .post(&json!({
                "conversation": format!("hangup-{}", i % 4),
                "user": "u",
                "text": format!("message {i}"),
                "message_id": format!("m{i}"),
                "wait": true,
            }))
            .await;
        assert_eq!(retry.status, StatusCode::OK, "m{i}: {}", retry.text);
        assert_eq!(retry.json["reply"], format!("echo: message {i}"));
    }
    app.wait_idle().await;
    assert_eq!(mock.count(), n as usize, "each message ran exactly once");
    for conversation in 0..4 {
        let thread_id = app
            .post(&json!({
                "conversation": format!("hangup-{conversation}"),
                "user": "u",
                "text": "again",
                "message_id": format!("m{conversation}"),
            }))
            .await
            .json["thread_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let thread = app.thread(&thread_id).await;
        let texts: Vec<&str> = thread["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), n as usize / 4, "{texts:?}");
        let mut unique = texts.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), texts.len(), "no message twice: {texts:?}");
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restarts_during_a_slow_turn_do_not_count_as_attempts() {
    let mock = MockModel::start(Behaviour::Echo).await;
    mock.hold();
    let rig = ChildRig::new(
        &mock,
        "shutdown_grace_secs = 1\n[agent]\nmax_turn_attempts = 1\n",
    );
    let mut first = rig.serve().await;
    let accepted = first
        .post(&json!({"conversation": "slow", "user": "u", "text": "take your time"}))
        .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);
    let thread_id = accepted.json["thread_id"].as_str().unwrap().to_owned();
    mock.wait_for_requests(1).await;
    // Three deploys while the model thinks: each SIGTERM interrupts the turn cleanly.
    let status = sigterm(&mut first.process).await;
    assert!(status.success(), "{status}:\n{}", first.log_text());
    for round in 2..=3 {
        let mut next = rig.serve().await;
        mock.wait_for_requests(round).await;
        assert!(sigterm(&mut next.process).await.success());
    }
    mock.release();
    let last = rig.serve().await;
    let thread = last.wait_for_messages(&thread_id, 2).await;
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages[1]["content"], "echo: take your time");
    assert!(
        messages.iter().all(|m| m.get("failed").is_none()),
        "not given up: {messages:#?}"
    );
    assert!(
        last.log_text().contains("interrupted by shutdown"),
        "{}",
        last.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_crashes_antler_twice_is_given_up_and_kept_in_the_thread() {
    let mock = MockModel::start(Behaviour::Echo).await;
    mock.hold();
    let rig = ChildRig::new(&mock, "[agent]\nmax_turn_attempts = 2\n");
    let mut first = rig.serve().await;
    let accepted = first
        .post(&json!({"conversation": "poison", "user": "u", "text": "crash me"}))
        .await;
    let thread_id = accepted.json["thread_id"].as_str().unwrap().to_owned();
    mock.wait_for_requests(1).await;
    first.kill().await;
    let mut second = rig.serve().await;
    mock.wait_for_requests(2).await;
    second.kill().await;

    mock.release();
    let third = rig.serve().await;
    let thread = third.wait_for_messages(&thread_id, 2).await;
    third.wait_idle().await;
    assert_eq!(mock.count(), 2, "not run a third time");
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{messages:#?}");
    assert_eq!(
        messages[0]["content"], "crash me",
        "the user's text is kept"
    );
    assert_eq!(messages[0]["failed"], true);
    let notice = messages[1]["content"].as_str().unwrap();
    assert!(
        notice.contains("gave up") && notice.contains("2 times"),
        "{notice}"
    );
    assert_eq!(messages[1]["failed"], true);
    // Counted just after the thread is written: waited for.
    let abandoned = wait_until("the abandoned turn is counted", || async {
        let metrics = third.get("/metrics").await.text;
        metric_value(&metrics, r#"antler_turns_total{outcome="abandoned"}"#).filter(|n| *n > 0.0)
    })
    .await;
    assert_eq!(abandoned, 1.0);

    // Sent again, it is answered, and the model does not see the failed exchange.
    let again = third.ask("poison", "crash me").await;
    assert_eq!(again.json["reply"], "echo: crash me");
    let last = mock.requests().pop().unwrap();
    let users = last
        .messages_without_context()
        .iter()
        .filter(|m| m["role"] == "user")
        .count();
    assert_eq!(users, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_cannot_starve_the_server_of_descriptors() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let rig = ChildRig::new(
        &mock,
        "max_connections = 16\nheader_read_timeout_secs = 1\n",
    );
    // 64 descriptors: far fewer than the sockets below.
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 64 && exec \"$0\" serve --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_antler"))
        .arg(&rig.config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(
            std::fs::File::create(&rig.log).unwrap(),
        ))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = Client::new(format!("http://127.0.0.1:{}", rig.port));
    wait_until("antler answers", || async {
        client.is_healthy().await.then_some(())
    })
    .await;
    let address: std::net::SocketAddr = format!("127.0.0.1:{}", rig.port).parse().unwrap();
    let mut idle = Vec::new();
    for n in 0..100 {
        let mut stream = TcpStream::connect(address).await.unwrap();
        if n % 2 == 0 {
            // Half a request head, never finished.
            stream
                .write_all(b"POST /api/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .await
                .unwrap();
        }
        idle.push(stream);
    }
    wait_until("/healthz answers beside 100 stalled sockets", || async {
        client.is_healthy().await.then_some(())
    })
    .await;
    // The stalled connections are closed by the server, not kept forever: each read ends in
    // end-of-file (or a reset) within the deadline.
    for stream in &mut idle {
        let closed = tokio::time::timeout(DEADLINE, async {
            let mut buffer = [0u8; 256];
            while let Ok(n) = stream.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "a stalled connection was never closed");
    }
    assert!(sigterm(&mut child).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_is_refused_with_408_and_nothing_stored() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[server]\nbody_read_timeout_secs = 1\n").await;
    let mut request = post_head(100, "").into_bytes();
    request.extend_from_slice(br#"{"conversation""#);
    let answer = raw_exchange(app.addr, &request, DEADLINE).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(app.get("/readyz").await.json["inbox"], 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_its_whole_oversized_body_first_still_gets_the_413() {
    // Python's urllib and many simple clients write the whole body before reading: a server
    // that closes with the body unread resets the connection and the 413 is lost (nginx's
    // lingering close reads and discards the rest first).
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;
    for attempt in 0..3 {
        let body = vec![b'x'; 3 * 1024 * 1024];
        let mut stream = TcpStream::connect(app.addr).await.unwrap();
        // Like urllib: the head, then the body while the server has already decided.
        stream
            .write_all(post_head(body.len(), "").as_bytes())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let wrote = tokio::time::timeout(DEADLINE, stream.write_all(&body))
            .await
            .expect("the body was taken");
        assert!(
            wrote.is_ok(),
            "attempt {attempt}: writing failed: {wrote:?}"
        );
        let mut answer = Vec::new();
        let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
            .await
            .expect("the server closed the connection");
        assert!(read.is_ok(), "attempt {attempt}: reading failed: {read:?}");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "attempt {attempt}: {answer}"
        );
        assert!(answer.contains("payload_too_large"), "{answer}");
    }
    assert_eq!(app.get("/readyz").await.json["inbox"], 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_request_is_refused_before_its_body_is_read() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[channels.api]\ntoken = \"the-admin-token-0123\"\n").await;
    // A 1 MB body is announced and never sent: the answer must come from the headers alone.
    let answer = raw_exchange(app.addr, post_head(1_000_000, "").as_bytes(), DEADLINE).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{answer}"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_on_other_sites_and_rebound_names_are_refused() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;
    let url = format!("{}/api/v1/messages", app.base);
    let body = json!({"conversation": "web", "user": "u", "text": "hi"}).to_string();
    let send = |request: reqwest::RequestBuilder| async move {
        let response = request.send().await.unwrap();
        let status = response.status();
        let json: Value = response.json().await.unwrap_or(Value::Null);
        (status, json)
    };
    // A cross-site form or fetch can send text/plain without a preflight.
    let (status, json) = send(
        app.http
            .post(&url)
            .header("content-type", "text/plain")
            .body(body.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(json["error"]["code"], "unsupported_media_type");
    // DNS rebinding: the page's own name resolves to 127.0.0.1.
    let json_post = || {
        app.http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
    };
    let (status, json) = send(json_post().header("host", "attacker.example")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allowed_hosts")
    );
    let rebound = app
        .http
        .get(format!("{}/api/v1/threads/x", app.base))
        .header("host", "attacker.example:8080");
    assert_eq!(send(rebound).await.0, StatusCode::FORBIDDEN);
    let (status, _) = send(json_post().header("origin", "https://attacker.example")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = send(json_post().header("sec-fetch-site", "cross-site")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(app.get("/readyz").await.json["inbox"], 0, "nothing stored");
    let (status, _) =
        send(json_post().header("host", format!("localhost:{}", app.addr.port()))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "our own names pass");
    app.shutdown().await;
}

const TOKENS: &str = r#"
[channels.api]
token = "admin-token-0123456789"
[[channels.api.tokens]]
token = "ana-token-0123456789"
user = "ana"
[[channels.api.tokens]]
token = "bob-token-0123456789"
user = "bob"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_token_reaches_only_its_users_conversations() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, TOKENS).await;
    let as_user = |token: &str| app.client.with_token(token);
    let (ana, bob, admin) = (
        as_user("ana-token-0123456789"),
        as_user("bob-token-0123456789"),
        as_user("admin-token-0123456789"),
    );
    let ask = |client: Client, text: &'static str| async move {
        let answer = client
            .post(&json!({"conversation": "ops", "text": text, "wait": true}))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
        answer.json
    };
    let a = ask(ana.clone(), "from ana").await;
    let b = ask(bob.clone(), "from bob").await;
    assert_eq!(a["conversation"], "api:ana/ops");
    assert_ne!(
        a["thread_id"], b["thread_id"],
        "the same name, two conversations"
    );
    let (thread_a, thread_b) = (
        format!("/api/v1/threads/{}", a["thread_id"].as_str().unwrap()),
        format!("/api/v1/threads/{}", b["thread_id"].as_str().unwrap()),
    );
    assert_eq!(ana.get(&thread_a).await.status, StatusCode::OK);
    assert_eq!(ana.get(&thread_b).await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        ana.get(&format!("{thread_b}/events")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(bob.get(&thread_a).await.status, StatusCode::NOT_FOUND);
    assert_eq!(admin.get(&thread_a).await.status, StatusCode::OK);
    assert_eq!(admin.get(&thread_b).await.status, StatusCode::OK);
    let thread = ana.get(&thread_a).await.json;
    assert_eq!(thread["messages"][0]["content"], "from ana");

    // A user's token always acts as that user.
    let spoof = ana
        .post(&json!({"conversation": "ops", "user": "bob", "text": "hi"}))
        .await;
    assert_eq!(spoof.status, StatusCode::BAD_REQUEST);
    // An admin names the user (or is the `operator`), and may address anyone's conversation.
    let unnamed = admin
        .post(&json!({"conversation": "x", "text": "hi", "wait": true}))
        .await;
    assert_eq!(unnamed.status, StatusCode::OK, "{}", unnamed.text);
    let into_ana = admin
        .post(&json!({"conversation": "ana/ops", "user": "ops-bot", "text": "note", "wait": true}))
        .await;
    assert_eq!(into_ana.json["thread_id"], a["thread_id"]);

    // Usage figures are for admins.
    assert_eq!(ana.get("/metrics").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(admin.get("/metrics").await.status, StatusCode::OK);
    let ready = ana.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK);
    assert!(ready.json.get("inbox").is_none(), "{}", ready.text);
    assert!(admin.get("/readyz").await.json.get("inbox").is_some());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_take_their_own_token_or_their_own_listener() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(
        &mock,
        "[server]\nmetrics_token = \"metrics-token-0123456789\"\n",
    )
    .await;
    assert_eq!(app.get("/metrics").await.status, StatusCode::UNAUTHORIZED);
    assert!(app.get("/readyz").await.json.get("inbox").is_none());
    let scraper = app.client.with_token("metrics-token-0123456789");
    let metrics = scraper.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(metrics.text.contains("antler_"), "{}", metrics.text);
    assert_eq!(scraper.get("/readyz").await.json["inbox"], 0);
    app.shutdown().await;

    let port = free_port();
    let app = TestApp::spawn(
        &mock,
        &format!("[server]\nops_listen = \"127.0.0.1:{port}\"\n"),
    )
    .await;
    assert_eq!(app.get("/metrics").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.get("/readyz").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.get("/healthz").await.status, StatusCode::OK);
    let ops = Client::new(format!("http://127.0.0.1:{port}"));
    assert_eq!(ops.get("/metrics").await.status, StatusCode::OK);
    assert_eq!(ops.get("/readyz").await.json["inbox"], 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_reason_reaches_the_chat_only_with_the_key_masked_before_any_cut() {
    // The key is glued to a word that crosses the 200-character cut of the provider's
    // message: cut first, a piece of the key would survive.
    let message = format!("{}sk-e2e-test-key is not allowed here", "x".repeat(190));
    let mock = MockModel::start(Behaviour::Fail {
        status: 400,
        message,
    })
    .await;
    let rig = ChildRig::new(&mock, "");
    let child = rig.serve().await;
    let answer = child.ask("masking", "hello").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(reply.contains("HTTP 400"), "{reply}");
    assert!(!reply.contains("sk-e2e"), "{reply}");
    // A refused request quotes the provider's reason: masked, then cut.
    assert!(
        reply.contains("The provider says: xxxx") && reply.contains("x*** is not…"),
        "{reply}"
    );
    let log = wait_until("the failure is logged", || async {
        let log = child.log_text();
        log.contains("turn failed").then_some(log)
    })
    .await;
    assert!(
        !log.contains("sk-e2e"),
        "no part of the key in the log:\n{log}"
    );
    assert!(
        log.contains("***"),
        "the key is masked where it was:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_model_is_explained_and_reported_without_failing_readiness() {
    let dead = format!("http://127.0.0.1:{}/v1", free_port());
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, &format!("[model]\nbase_url = \"{dead}\"\n")).await;
    let ready = wait_until("the probe is recorded", || async {
        let ready = app.get("/readyz").await;
        (ready.json["model"]["reachable"] == false).then_some(ready)
    })
    .await;
    assert_eq!(
        ready.status,
        StatusCode::OK,
        "a flaky model is no reason to be unready"
    );
    let answer = app.ask("dead-model", "hello").await;
    let reply = answer.json["reply"].as_str().unwrap();
    assert!(
        reply.contains("model.base_url") && reply.contains("ANTLER_MODEL_BASE_URL"),
        "{reply}"
    );
    assert!(
        !reply.contains("error sending request"),
        "no raw reqwest chain: {reply}"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_is_kept_marked_and_the_resend_reads_naturally() {
    let mock = MockModel::start(Behaviour::ServerError).await;
    let app = TestApp::spawn(&mock, "").await;
    let failed = app.ask("retry", "Why is the build red?").await;
    let reply = failed.json["reply"].as_str().unwrap();
    assert!(
        reply.contains("HTTP 500") && reply.contains("again"),
        "{reply}"
    );
    let thread_id = failed.json["thread_id"].as_str().unwrap().to_owned();
    let thread = app.thread(&thread_id).await;
    assert_eq!(thread["messages"][0]["failed"], true);
    assert_eq!(thread["messages"][1]["failed"], true);
    assert!(thread["title"].is_null());

    mock.set_behaviour(Behaviour::Echo);
    let answered = app.ask("retry", "Why is the build red?").await;
    assert_eq!(answered.json["reply"], "echo: Why is the build red?");
    let last = mock.requests().pop().unwrap();
    let users: Vec<Value> = last
        .messages_without_context()
        .into_iter()
        .filter(|m| m["role"] == "user")
        .collect();
    assert_eq!(users.len(), 1, "the failed exchange is not in the context");
    let thread = app.thread(&thread_id).await;
    assert_eq!(thread["messages"].as_array().unwrap().len(), 4);
    assert!(thread["messages"][2].get("failed").is_none());
    assert_eq!(thread["title"], "Why is the build red?");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_messages_get_503_while_shutting_down() {
    let mock = MockModel::start(Behaviour::Echo).await;
    mock.hold();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // The grace period runs from the stop until the model is released below; on a loaded
    // machine the checks in between can take seconds, so it is generous.
    let mut app = TestApp::start(&mock, &store, "[server]\nshutdown_grace_secs = 60").await;
    let accepted = app
        .post(&json!({"conversation": "drain", "user": "u", "text": "finish me"}))
        .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    mock.wait_for_requests(1).await;
    app.begin_shutdown();
    // The stop reaches the server asynchronously: a message posted before intake closes is
    // accepted (and kept, to be answered after the restart).
    let accepted_late = std::sync::atomic::AtomicUsize::new(0);
    let refused = wait_until("intake is closed", || async {
        let answer = app
            .post(&json!({"conversation": "late", "user": "u", "text": "too late"}))
            .await;
        if answer.status == StatusCode::ACCEPTED {
            accepted_late.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        (answer.status == StatusCode::SERVICE_UNAVAILABLE).then_some(answer)
    })
    .await;
    assert_eq!(refused.json["error"]["code"], "shutting_down");
    assert!(refused.headers.contains_key(reqwest::header::RETRY_AFTER));
    assert_eq!(
        app.get("/readyz").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    mock.release();
    app.shutdown().await;
    // The running turn finished within the grace period; the refused message was not stored.
    let app = TestApp::start(&mock, &store, "").await;
    let thread = app
        .thread(accepted.json["thread_id"].as_str().unwrap())
        .await;
    assert_eq!(thread["messages"][1]["content"], "echo: finish me");
    if accepted_late.into_inner() == 0 {
        assert_eq!(
            app.get("/readyz").await.json["inbox"],
            0,
            "no late message was accepted, yet the inbox holds one"
        );
    } else {
        // A message accepted before intake closed is answered after the restart.
        wait_until("the accepted late message is answered", || async {
            (app.get("/readyz").await.json["inbox"] == 0).then_some(())
        })
        .await;
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_names_its_thread_and_a_resent_stream_gets_the_existing_answer() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;
    let body = json!({"conversation": "sse", "user": "u", "text": "hi", "message_id": "s1", "stream": true});
    let stream = |body: Value| {
        let app = &app;
        async move {
            let response = app
                .http
                .post(format!("{}/api/v1/messages", app.base))
                .json(&body)
                .send()
                .await
                .unwrap();
            crate::support::read_sse(response).await
        }
    };
    let events = stream(body.clone()).await;
    assert_eq!(events[0].0, "accepted");
    let thread_id = events[0].1["thread_id"].as_str().unwrap().to_owned();
    assert_eq!(events[0].1["duplicate"], false);
    assert_eq!(events.last().unwrap().0, "final");
    app.wait_idle().await;
    let again = stream(body).await;
    assert_eq!(again[0].1["thread_id"], thread_id.as_str());
    assert_eq!(again[0].1["duplicate"], true);
    assert_eq!(
        again.len(),
        2,
        "accepted, then the existing final: {again:?}"
    );
    assert_eq!(again[1].1["text"], "echo: hi");
    assert_eq!(mock.count(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_bounded() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[server]\nmax_streams = 1\n").await;
    let thread_id = app.ask("streams", "hi").await.json["thread_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("{}/api/v1/threads/{thread_id}/events", app.base);
    let held = app.http.get(&path).send().await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let refused = app
        .get(&format!("/api/v1/threads/{thread_id}/events"))
        .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.json["error"]["code"], "too_many_streams");
    drop(held);
    wait_until("the stream's place is free again", || async {
        let wait = app
            .post(&json!({"conversation": "streams", "user": "u", "text": "again", "wait": true}))
            .await;
        (wait.status == StatusCode::OK).then_some(())
    })
    .await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedupe_keys_expire_and_their_generations_are_swept() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[store]\ndedupe_ttl_secs = 1\n").await;
    let body = json!({"conversation": "ttl", "user": "u", "text": "hi", "message_id": "same"});
    assert_eq!(app.post(&body).await.json["duplicate"], false);
    assert_eq!(app.post(&body).await.json["duplicate"], true);
    wait_until("the id is forgotten after its TTL", || async {
        (app.post(&body).await.json["duplicate"] == false).then_some(())
    })
    .await;
    wait_until("a dedupe generation was swept", || async {
        let metrics = app.get("/metrics").await.text;
        metrics
            .lines()
            .any(|l| l.starts_with("antler_store_swept_total") && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    app.shutdown().await;
}
