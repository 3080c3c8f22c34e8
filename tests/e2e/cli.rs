//! The binary as an operator meets it: logging that never blocks or kills the process, log
//! formats without injected lines or colour codes, errors printed once, `antler chat`,
//! `antler healthcheck`, `antler doctor` and `antler telegram` (against a mock Bot API).

use std::process::Stdio;

use crate::support::{
    Behaviour, ChildRig, Client, DEADLINE, MockModel, TestApp, free_port, run_binary, sigterm,
};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Starts `antler serve` on `rig` with `extra` arguments, `RUST_LOG=rust_log` and `stderr`.
fn spawn_serve(rig: &ChildRig, extra: &[&str], rust_log: &str, stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_antler"))
        .args(extra)
        .arg("serve")
        .arg("--config")
        .arg(&rig.config)
        .env("RUST_LOG", rust_log)
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn antler")
}

/// Waits until the child answers `/healthz` (panics if it exits first).
async fn wait_up(child: &mut Child, client: &Client) {
    let start = std::time::Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("antler exited early with {status}");
        }
        if client.is_healthy().await {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "antler did not answer /healthz within {DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn log_file(rig: &ChildRig) -> std::fs::File {
    std::fs::File::create(&rig.log).expect("log file")
}

fn client_for(rig: &ChildRig) -> Client {
    Client::new(format!("http://127.0.0.1:{}", rig.port))
}

/// Runs `antler chat` with `args`, feeding `input` on stdin: (exit code, stdout, stderr).
async fn chat(args: &[&str], input: &str) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_antler"))
        .arg("chat")
        .args(args)
        .env_remove("ANTLER_API_TOKEN")
        .env_remove("ANTLER_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn antler chat");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(input.as_bytes())
        .await
        .expect("write stdin");
    // Closing stdin is the end of input (Ctrl-D) after the lines above.
    drop(stdin);
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("antler chat ends")
        .expect("antler chat output");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A model that fails every request with an error message made to forge log lines and drive
/// a terminal.
async fn hostile_model() -> MockModel {
    MockModel::start(Behaviour::Fail {
        status: 500,
        message: "boom\nFAKE 2026-01-01T00:00:00Z  INFO forged line \u{1b}[2J\u{1b}[31m\r"
            .to_owned(),
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Logging never takes the process down
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn serve_shuts_down_cleanly_when_stderr_is_a_closed_pipe() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let rig = ChildRig::new(&mock, "");
    let mut child = spawn_serve(&rig, &[], "debug", Stdio::piped());
    // Closing the read end (what a dead `tee` does) makes every log write fail with EPIPE.
    drop(child.stderr.take());
    let client = client_for(&rig);
    wait_up(&mut child, &client).await;
    let answer = client.ask("closed-pipe", "hello").await;
    assert_eq!(answer.json["reply"], "echo: hello", "{}", answer.text);
    let status = sigterm(&mut child).await;
    assert!(status.success(), "antler exited with {status}");
}

#[tokio::test]
async fn serve_keeps_answering_and_shuts_down_when_nobody_reads_stderr() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let rig = ChildRig::new(&mock, "");
    // Trace level logs far more than a pipe holds (64 KiB on Linux) within a few requests.
    let mut child = spawn_serve(&rig, &[], "trace", Stdio::piped());
    let mut stderr = child.stderr.take().expect("stderr pipe");
    let client = client_for(&rig);
    wait_up(&mut child, &client).await;
    for i in 0..40 {
        let answer = client.ask("full-pipe", &format!("message {i}")).await;
        assert_eq!(
            answer.json["reply"],
            format!("echo: message {i}"),
            "{}",
            answer.text
        );
    }
    for _ in 0..200 {
        assert!(client.is_healthy().await, "/healthz answers");
    }
    let status = sigterm(&mut child).await;
    assert!(status.success(), "antler exited with {status}");
    // The pipe really was full: the last lines (`stopped`) never made it in.
    let mut logged = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stderr, &mut logged)
        .await
        .unwrap();
    let logged = String::from_utf8_lossy(&logged);
    assert!(!logged.is_empty(), "something was logged");
    assert!(
        !logged.contains("antler::app: stopped"),
        "the pipe never filled up; the test proves nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// Log formats
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let mock = hostile_model().await;
    let rig = ChildRig::new(&mock, "");
    let mut child = spawn_serve(
        &rig,
        &["--log-format", "json"],
        "info",
        log_file(&rig).into(),
    );
    let client = client_for(&rig);
    wait_up(&mut child, &client).await;
    client.ask("json-logs", "hello").await;
    let status = sigterm(&mut child).await;
    assert!(status.success(), "antler exited with {status}");

    let text = std::fs::read_to_string(&rig.log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() >= 3,
        "startup, the model failure, shutdown:\n{text}"
    );
    for line in &lines {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line:?}"));
        assert!(value.is_object(), "{line}");
        assert!(value["level"].is_string(), "{line}");
        assert!(value["fields"].is_object(), "{line}");
    }
    // The hostile provider message is in there, as data.
    assert!(
        lines.iter().any(|line| line.contains("FAKE 2026")),
        "the model failure was logged:\n{text}"
    );
}

#[tokio::test]
async fn human_logs_in_a_file_have_no_colour_codes_and_no_forged_lines() {
    let mock = hostile_model().await;
    let rig = ChildRig::new(&mock, "");
    let mut child = spawn_serve(&rig, &[], "info", log_file(&rig).into());
    let client = client_for(&rig);
    wait_up(&mut child, &client).await;
    client.ask("human-logs", "hello").await;
    let status = sigterm(&mut child).await;
    assert!(status.success(), "antler exited with {status}");

    let bytes = std::fs::read(&rig.log).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(!bytes.contains(&0x1b), "ESC in a redirected log:\n{text}");
    assert!(!bytes.contains(&b'\r'), "CR in the log:\n{text}");
    // The model client makes provider text one line; the escape sequences stay, escaped.
    assert!(
        text.contains("boom FAKE 2026-01-01T00:00:00Z INFO forged line \\x1b[2J\\x1b[31m"),
        "the provider message shows escaped:\n{text}"
    );
    for line in text.lines() {
        assert!(!line.starts_with("FAKE"), "a forged line: {line}");
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_failing_command_prints_its_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let (code, stdout, stderr) =
        run_binary(&["serve", "--config", missing.to_str().unwrap()]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("error: cannot read "), "{stderr:?}");
    assert!(stderr.contains("missing.toml"), "{stderr:?}");
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "the cause once: {stderr:?}"
    );

    // check-config keeps its own report and exit code.
    let (code, _, stderr) =
        run_binary(&["check-config", "--config", missing.to_str().unwrap()]).await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains(": invalid\n"), "{stderr:?}");
}

// ---------------------------------------------------------------------------------------------
// antler chat
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn chat_prints_a_banner_streams_the_answer_and_quits_locally() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;
    let url = format!("http://{}", app.addr);
    let (code, stdout, stderr) =
        chat(&["--url", &url, "--conversation", "c"], "hello\n/quit\n").await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("talking to {url}")), "{stdout}");
    assert!(stdout.contains("conversation \"c\""), "{stdout}");
    assert!(
        stdout.contains("/quit") && stdout.contains("Ctrl-D"),
        "{stdout}"
    );
    assert!(stdout.contains("echo: hello\n"), "{stdout}");
    assert_eq!(stderr, "", "no complaints");
    // `/quit` stayed local: the model saw only `hello`.
    assert_eq!(mock.count(), 1);
    assert_eq!(mock.requests()[0].last_user_text(), "hello");
    app.shutdown().await;
}

/// `antler chat` driven line by line: its stdin, and its stdout read as it comes.
struct LiveChat {
    child: Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
    shown: String,
}

impl LiveChat {
    fn start(url: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_antler"))
            .args(["chat", "--url", url, "--conversation", "live"])
            .env_remove("ANTLER_API_TOKEN")
            .env_remove("ANTLER_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn antler chat");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        Self {
            child,
            stdin,
            stdout,
            shown: String::new(),
        }
    }

    async fn type_line(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write stdin");
    }

    /// Reads stdout until what was shown after `from` contains `needle`.
    async fn until_shown(&mut self, from: usize, needle: &str) {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut buffer = [0u8; 1024];
        while !self.shown[from..].contains(needle) {
            let read = tokio::time::timeout_at(deadline, self.stdout.read(&mut buffer))
                .await
                .unwrap_or_else(|_| panic!("{needle:?} never shown; shown: {}", self.shown))
                .expect("read stdout");
            assert!(
                read > 0,
                "stdout ended before {needle:?}; shown: {}",
                self.shown
            );
            self.shown
                .push_str(&String::from_utf8_lossy(&buffer[..read]));
        }
    }

    fn interrupt(&self) {
        let pid = self.child.id().expect("running");
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success());
    }

    async fn exit_code(mut self) -> Option<i32> {
        tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("antler chat ends")
            .expect("wait")
            .code()
    }
}

/// An answer that takes longer than any test waits: one character a second.
const SLOW_QUESTION: &str = "count to sixty slowly please";

/// A chat whose answer to [`SLOW_QUESTION`] is streaming: the model (kept alive), the app and
/// the chat.
async fn chat_with_a_slow_answer_streaming() -> (MockModel, TestApp, LiveChat) {
    let mock = MockModel::start(Behaviour::Trickle {
        pieces: 40,
        every: std::time::Duration::from_secs(1),
    })
    .await;
    let app = TestApp::spawn(&mock, "").await;
    let mut chat = LiveChat::start(&format!("http://{}", app.addr));
    chat.until_shown(0, "> ").await;
    let asked = chat.shown.len();
    chat.type_line(SLOW_QUESTION).await;
    chat.until_shown(asked, "echo").await;
    (mock, app, chat)
}

impl LiveChat {
    /// Waits until the answer shows it was stopped and the prompt is back; none of the
    /// answer's remaining text came.
    async fn until_stopped(&mut self) {
        let at = self.shown.len();
        self.until_shown(at, "[stopped]").await;
        self.until_shown(at, "> ").await;
        assert!(!self.shown.contains(SLOW_QUESTION), "{}", self.shown);
    }
}

#[tokio::test]
async fn chat_stop_typed_during_an_answer_stops_it_at_once() {
    let (_mock, app, mut chat) = chat_with_a_slow_answer_streaming().await;
    chat.type_line("/stop").await;
    chat.until_stopped().await;
    chat.type_line("/quit").await;
    assert_eq!(chat.exit_code().await, Some(0));
    // antler got the `/stop`: the turn ended stopped (its note is in the thread).
    let idle = app.wait_idle().await;
    assert_eq!(idle["inbox"], 0, "{idle}");
    app.shutdown().await;
}

#[tokio::test]
async fn chat_ctrl_c_stops_the_answer_and_a_second_one_quits() {
    let (_mock, app, mut chat) = chat_with_a_slow_answer_streaming().await;
    chat.interrupt();
    chat.until_stopped().await;
    // The chat is still there; a second Ctrl-C, at the prompt, quits.
    chat.interrupt();
    assert_eq!(chat.exit_code().await, Some(0));
    app.shutdown().await;
}

#[tokio::test]
async fn chat_without_the_token_says_how_to_fix_it_and_keeps_going() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "[channels.api]\ntoken = \"s3cret-token\"\n").await;
    let url = format!("http://{}", app.addr);
    let (code, stdout, stderr) = chat(&["--url", &url], "hello\nagain\n/exit\n").await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("antler answered 401").count(),
        2,
        "both lines were tried: {stderr}"
    );
    assert!(
        stderr.contains("pass --token or set ANTLER_API_TOKEN"),
        "{stderr}"
    );
    assert_eq!(mock.count(), 0);

    // With the token the same chat works.
    let (code, stdout, stderr) = chat(&["--url", &url, "--token", "s3cret-token"], "hello\n").await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("echo: hello"), "{stdout}");
    app.shutdown().await;
}

#[tokio::test]
async fn chat_reports_an_unreachable_server_and_ends_the_line_on_end_of_input() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let (code, stdout, stderr) = chat(&["--url", &url], "hello\nagain\n").await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        stderr
            .matches(&format!("cannot reach antler at {url}"))
            .count(),
        2,
        "kept going after the first failure: {stderr}"
    );
    // End of input arrives at the prompt; the newline after it gives the shell its own line.
    assert!(stdout.ends_with("> \n"), "{stdout:?}");
}

#[tokio::test]
async fn chat_neutralises_escape_sequences_in_answers() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;
    let url = format!("http://{}", app.addr);
    let (code, stdout, stderr) =
        chat(&["--url", &url], "paint \u{1b}[2J\u{1b}]0;title\u{7} it\n").await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains(['\u{1b}', '\u{7}']),
        "raw control characters: {stdout:?}"
    );
    assert!(
        stdout.contains("echo: paint \\x1b[2J\\x1b]0;title\\x07 it"),
        "{stdout:?}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn chat_stops_reading_an_event_that_never_ends() {
    use futures_util::StreamExt;

    // A server whose every answer is one SSE event that never ends. Held whole, it would grow
    // `antler chat` without bound and the prompt would never come back.
    let filler = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    let server = axum::Router::new().route(
        "/api/v1/messages",
        axum::routing::post(move || {
            let opening = bytes::Bytes::from_static(b"event: delta\ndata: ");
            let body = futures_util::stream::iter([opening])
                .chain(futures_util::stream::repeat(filler.clone()))
                .map(Ok::<_, std::io::Error>);
            async move {
                (
                    [("content-type", "text/event-stream")],
                    axum::body::Body::from_stream(body),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, server).await });

    let (code, stdout, stderr) = chat(&["--url", &url], "hello\nagain\n").await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        stderr
            .matches(&format!(
                "the answer from {url} sent an event over 16 MiB; stopped reading it"
            ))
            .count(),
        2,
        "kept going after the first answer: {stderr}"
    );
    assert!(stdout.ends_with("> \n"), "{stdout:?}");
}

// ---------------------------------------------------------------------------------------------
// antler healthcheck
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn healthcheck_exits_0_on_a_running_app_and_1_on_a_closed_port() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let app = TestApp::spawn(&mock, "").await;
    let url = format!("http://{}", app.addr);
    let (code, _, stderr) = run_binary(&["healthcheck", "--url", &url]).await;
    assert_eq!(code, Some(0), "{stderr}");
    app.shutdown().await;

    let url = format!("http://127.0.0.1:{}", free_port());
    let (code, _, stderr) = run_binary(&["healthcheck", "--url", &url]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(
        stderr.starts_with(&format!("error: no answer from {url}/healthz: ")),
        "{stderr:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// antler doctor
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_what_is_fine_and_how_to_fix_what_is_not() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let port = free_port();
    let good = write(
        "good.toml",
        crate::support::config_text(
            &mock.base_url(),
            &store,
            &format!("[server]\nlisten = \"127.0.0.1:{port}\"\n"),
        ),
    );
    let (code, stdout, _) = run_binary(&["doctor", "--config", &good]).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("ok    config"), "{stdout}");
    assert!(
        stdout.contains("serves `mock-model-e2e`"),
        "the model answered and lists ours: {stdout}"
    );
    assert!(stdout.contains("does not exist yet"), "{stdout}");

    // With antler running on that store, the store is in use, and that is fine.
    let app = TestApp::start(&mock, &store, "").await;
    let (code, stdout, _) = run_binary(&["doctor", "--config", &good]).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("in use by a running antler"), "{stdout}");
    app.shutdown().await;

    let dead = format!("http://127.0.0.1:{}/v1", free_port());
    let broken = write(
        "dead-model.toml",
        crate::support::config_text(&dead, &store, ""),
    );
    let (code, stdout, _) = run_binary(&["doctor", "--config", &broken]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  model"), "{stdout}");
    assert!(
        stdout.contains("fix: start the model server, or set model.base_url"),
        "{stdout}"
    );

    let invalid = write("invalid.toml", "[server]\nlisten = 5\n".to_owned());
    let (code, stdout, _) = run_binary(&["doctor", "--config", &invalid]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  config") && stdout.contains("server.listen"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_antler_on_the_same_store_says_who_holds_it() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let rig = ChildRig::new(&mock, "");
    let _first = rig.serve().await;
    let other = rig.dir.path().join("other.toml");
    std::fs::write(
        &other,
        crate::support::config_text(
            &mock.base_url(),
            &rig.dir.path().join("store"),
            &format!("[server]\nlisten = \"127.0.0.1:{}\"\n", free_port()),
        ),
    )
    .unwrap();
    let (code, _, stderr) = run_binary(&["serve", "--config", other.to_str().unwrap()]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("another antler is using the store at"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("another antler").count(),
        1,
        "said once: {stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// antler telegram (against a mock Bot API; teloxide capitalises method names)
// ---------------------------------------------------------------------------------------------

const TG_TOKEN: &str = "7000000001:CLI-token_value";
const TG_SECRET: &str = "cli-hook_secret";

/// A Bot API whose command menu is remembered between calls, as Telegram's is.
async fn bot_api_with_menu() -> wiremock::MockServer {
    use std::sync::{Arc, Mutex};
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    let server = MockServer::start().await;
    let ok = |result: Value| {
        ResponseTemplate::new(200).set_body_json(serde_json::json!({"ok": true, "result": result}))
    };
    let menu = Arc::new(Mutex::new(serde_json::json!([])));
    let stored = Arc::clone(&menu);
    Mock::given(method("POST"))
        .and(path(format!("/bot{TG_TOKEN}/SetMyCommands")))
        .respond_with(move |request: &Request| {
            let body: Value = serde_json::from_slice(&request.body).unwrap();
            *stored.lock().unwrap() = body["commands"].clone();
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"ok": true, "result": true}))
        })
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(format!("/bot{TG_TOKEN}/GetMyCommands")))
        .respond_with(move |_: &Request| {
            let commands = menu.lock().unwrap().clone();
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"ok": true, "result": commands}))
        })
        .mount(&server)
        .await;
    for name in ["SetWebhook", "DeleteWebhook"] {
        Mock::given(method("POST"))
            .and(path(format!("/bot{TG_TOKEN}/{name}")))
            .respond_with(ok(Value::Bool(true)))
            .mount(&server)
            .await;
    }
    Mock::given(method("POST"))
        .and(path(format!("/bot{TG_TOKEN}/GetWebhookInfo")))
        .respond_with(ok(serde_json::json!({
            "url": "https://old.example.com/hook",
            "has_custom_certificate": false,
            "pending_update_count": 5,
            "last_error_date": 1_780_000_000,
            "last_error_message": "Wrong response from the webhook: 502 Bad Gateway",
            "max_connections": 40,
            "allowed_updates": ["message"],
        })))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(format!("/bot{TG_TOKEN}/GetMe")))
        .respond_with(ok(serde_json::json!({
            "id": 7000000001u64, "is_bot": true, "first_name": "OpsBot",
            "username": "opsbot_bot", "can_join_groups": true,
            "can_read_all_group_messages": false, "supports_inline_queries": false,
            "has_main_web_app": false
        })))
        .mount(&server)
        .await;
    server
}

/// Writes a config with Telegram enabled against `api_url` plus `server` keys; returns its path.
fn telegram_config(dir: &std::path::Path, model: &str, api_url: &str, server: &str) -> String {
    let path = dir.join("antler.toml");
    let text = crate::support::config_text(
        model,
        &dir.join("store"),
        &format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\n{server}\n[channels.telegram]\nenabled = true\n\
             bot_token = \"{TG_TOKEN}\"\nwebhook_secret = \"{TG_SECRET}\"\napi_url = \"{api_url}\"\n",
            free_port()
        ),
    );
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The requests the Bot API got for `method_name`.
async fn calls(api: &wiremock::MockServer, method_name: &str) -> Vec<wiremock::Request> {
    let suffix = format!("/{method_name}");
    api.received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.url.path().ends_with(&suffix))
        .collect()
}

/// The fields of a `multipart/form-data` request (teloxide sends setWebhook that way).
fn form_fields(request: &wiremock::Request) -> std::collections::HashMap<String, String> {
    let content_type = request.headers["content-type"].to_str().unwrap().to_owned();
    let boundary = content_type.split("boundary=").nth(1).expect("multipart");
    String::from_utf8_lossy(&request.body)
        .split(&format!("--{boundary}"))
        .filter_map(|part| {
            let (head, value) = part.split_once("\r\n\r\n")?;
            let name = head.split("name=\"").nth(1)?.split('"').next()?;
            Some((name.to_owned(), value.trim_end_matches("\r\n").to_owned()))
        })
        .collect()
}

fn assert_no_secrets(text: &str) {
    assert!(!text.contains(TG_TOKEN), "the bot token leaked: {text}");
    assert!(
        !text.contains("CLI-token"),
        "part of the bot token leaked: {text}"
    );
    assert!(
        !text.contains(TG_SECRET),
        "the webhook secret leaked: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_set_webhook_points_at_the_public_url_and_sets_the_menu_only_when_it_differs() {
    let api = bot_api_with_menu().await;
    let dir = tempfile::tempdir().unwrap();
    let config = telegram_config(
        dir.path(),
        "http://127.0.0.1:9/v1",
        &api.uri(),
        "public_url = \"https://bot.example.com/\"",
    );

    let (code, stdout, stderr) = run_binary(&[
        "telegram",
        "set-webhook",
        "--config",
        &config,
        "--drop-pending-updates",
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("webhook: https://bot.example.com/webhooks/telegram\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("allowed updates: message, callback_query\n"),
        "{stdout}"
    );
    assert!(stdout.contains("pending updates: dropped\n"), "{stdout}");
    assert!(
        stdout.contains(
            "commands: set (/help, /new, /status, /stop, /plan, /memory, /tasks, /skills, \
             /schedules, /schedule, /approvals, /approve, /deny)"
        ),
        "{stdout}"
    );
    assert_no_secrets(&stdout);
    assert_no_secrets(&stderr);
    let set = calls(&api, "SetWebhook").await;
    assert_eq!(set.len(), 1);
    let fields = form_fields(&set[0]);
    assert_eq!(
        fields["url"], "https://bot.example.com/webhooks/telegram",
        "{fields:?}"
    );
    assert_eq!(fields["secret_token"], TG_SECRET);
    assert_eq!(fields["allowed_updates"], r#"["message","callback_query"]"#);
    assert_eq!(fields["drop_pending_updates"], "true");
    let menus = calls(&api, "SetMyCommands").await;
    assert_eq!(menus.len(), 1);
    let menu: Value = serde_json::from_slice(&menus[0].body).unwrap();
    let names: Vec<&str> = menu["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["command"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "help",
            "new",
            "status",
            "stop",
            "plan",
            "memory",
            "tasks",
            "skills",
            "schedules",
            "schedule",
            "approvals",
            "approve",
            "deny"
        ]
    );

    // The second run finds Telegram's menu equal to antler's and leaves it.
    let (code, stdout, stderr) =
        run_binary(&["telegram", "set-webhook", "--config", &config]).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("commands: unchanged"), "{stdout}");
    assert!(!stdout.contains("pending updates"), "{stdout}");
    assert_eq!(
        calls(&api, "SetMyCommands").await.len(),
        1,
        "no second SetMyCommands"
    );
    assert_eq!(calls(&api, "GetMyCommands").await.len(), 2);
    let set = calls(&api, "SetWebhook").await;
    assert_eq!(set.len(), 2);
    assert_eq!(form_fields(&set[1])["drop_pending_updates"], "false");

    let (code, stdout, stderr) =
        run_binary(&["telegram", "webhook-info", "--config", &config]).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("url: https://old.example.com/hook\n"),
        "{stdout}"
    );
    assert!(stdout.contains("pending updates: 5\n"), "{stdout}");
    assert!(
        stdout.contains("last error: 2026-05-28T20:26:40Z: Wrong response from the webhook"),
        "{stdout}"
    );
    assert!(stdout.contains("max connections: 40\n"), "{stdout}");
    assert!(
        stdout.contains("expected url: https://bot.example.com/webhooks/telegram"),
        "{stdout}"
    );
    assert_no_secrets(&stdout);

    let (code, stdout, stderr) = run_binary(&[
        "telegram",
        "delete-webhook",
        "--config",
        &config,
        "--drop-pending-updates",
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("webhook: deleted\npending updates: dropped"),
        "{stdout}"
    );
    let deleted = calls(&api, "DeleteWebhook").await;
    let body: Value = serde_json::from_slice(&deleted[0].body).unwrap();
    assert_eq!(body["drop_pending_updates"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_set_webhook_refuses_without_an_https_public_url_and_masks_refusals() {
    let api = bot_api_with_menu().await;
    let dir = tempfile::tempdir().unwrap();
    let config = telegram_config(dir.path(), "http://127.0.0.1:9/v1", &api.uri(), "");
    let (code, stdout, stderr) =
        run_binary(&["telegram", "set-webhook", "--config", &config]).await;
    assert_eq!(code, Some(64), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("error: server.public_url: not set"),
        "{stderr}"
    );
    let config = telegram_config(
        dir.path(),
        "http://127.0.0.1:9/v1",
        &api.uri(),
        "public_url = \"http://bot.example.com\"",
    );
    let (code, _, stderr) = run_binary(&["telegram", "set-webhook", "--config", &config]).await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("server.public_url: must be an https:// URL"),
        "{stderr}"
    );
    assert!(
        calls(&api, "SetWebhook").await.is_empty(),
        "nothing was sent"
    );

    // A Bot API that is not there: the error names no token.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let config = telegram_config(
        dir.path(),
        "http://127.0.0.1:9/v1",
        &dead,
        "public_url = \"https://bot.example.com\"",
    );
    let (code, stdout, stderr) =
        run_binary(&["telegram", "set-webhook", "--config", &config]).await;
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the platform's API call failed"),
        "{stderr}"
    );
    assert_no_secrets(&stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_telegram_token_and_webhook() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let api = bot_api_with_menu().await;
    let dir = tempfile::tempdir().unwrap();
    let config = telegram_config(
        dir.path(),
        &mock.base_url(),
        &api.uri(),
        "public_url = \"https://bot.example.com\"",
    );
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    // Webhook trouble is a warning: antler can still serve.
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("ok    telegram the token works: the bot is @opsbot_bot"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "warn  webhook  Telegram delivers to https://old.example.com/hook, not \
             https://bot.example.com/webhooks/telegram"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("the last delivery failed (2026-05-28T20:26:40Z): Wrong response"),
        "{stdout}"
    );
    // Set before approval buttons existed: `allowed_updates` names messages only.
    assert!(
        stdout.contains(
            "warn  webhook  Telegram delivers no callback_query updates: the approval buttons \
             do nothing"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("fix: run `antler telegram set-webhook`"),
        "{stdout}"
    );
    assert_no_secrets(&stdout);

    // A refused token fails, naming the key.
    let refusing = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(wiremock::ResponseTemplate::new(401).set_body_json(
            serde_json::json!({"ok": false, "error_code": 401, "description": "Unauthorized"}),
        ))
        .mount(&refusing)
        .await;
    let config = telegram_config(dir.path(), &mock.base_url(), &refusing.uri(), "");
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  telegram") && stdout.contains("channels.telegram.bot_token"),
        "{stdout}"
    );
    assert_no_secrets(&stdout);

    // An unreachable Bot API names api_url.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let config = telegram_config(dir.path(), &mock.base_url(), &dead, "");
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("is unreachable") && stdout.contains("channels.telegram.api_url"),
        "{stdout}"
    );
    assert_no_secrets(&stdout);
}

/// In polling mode a webhook is an error, not a hint: `getUpdates` and a webhook exclude each
/// other and `serve` refuses to start while one is set. `doctor` fails with the same reason,
/// the setup commands never suggest `set-webhook`, and `set-webhook` refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_polling_mode_doctor_fails_on_a_webhook_and_never_suggests_setting_one() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let api = bot_api_with_menu().await;
    let dir = tempfile::tempdir().unwrap();
    let config = telegram_config(dir.path(), &mock.base_url(), &api.uri(), "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[channels.telegram]\n",
        "[channels.telegram]\nmode = \"polling\"\n",
    );
    std::fs::write(&config, text).unwrap();

    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "FAIL  webhook  channels.telegram.mode is \"polling\" but Telegram delivers to the \
             webhook https://old.example.com/hook"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("fix: run `antler telegram delete-webhook` first"),
        "{stdout}"
    );
    assert!(!stdout.contains("set-webhook"), "{stdout}");

    let (code, stdout, _) = run_binary(&["telegram", "webhook-info", "--config", &config]).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("`antler telegram delete-webhook` removes it"),
        "{stdout}"
    );
    assert!(!stdout.contains("set-webhook"), "{stdout}");

    let (code, stdout, stderr) =
        run_binary(&["telegram", "set-webhook", "--config", &config]).await;
    assert_ne!(code, Some(0), "{stdout}");
    assert!(stderr.contains("channels.telegram.mode"), "{stderr}");
    assert!(
        calls(&api, "SetWebhook").await.is_empty(),
        "nothing was set"
    );
}

/// A store that cannot be made (its parent is a file here; for another user, a folder it may
/// not write) is named with the user and the fix, by `serve` and, before it, by `doctor`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncreatable_store_is_named_with_the_user_and_the_fix() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data"), "a file, not a folder").unwrap();
    let store = dir.path().join("data").join("store");
    let config = dir.path().join("antler.toml");
    std::fs::write(
        &config,
        crate::support::config_text(
            &mock.base_url(),
            &store,
            &format!("[server]\nlisten = \"127.0.0.1:{}\"\n", free_port()),
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(1), "{stdout}");
    let uid = rustix::process::geteuid().as_raw();
    assert!(
        stdout.contains(&format!(
            "FAIL  store    {} does not exist and cannot be created as uid {uid}",
            store.display()
        )) && stdout.contains("is not a folder"),
        "{stdout}"
    );
    assert!(
        stdout.contains("set store.path (ANTLER_DATA_DIR)"),
        "{stdout}"
    );

    let (code, _, stderr) = run_binary(&["serve", "--config", &config]).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot prepare the store directory {} as uid {uid}",
            store.display()
        )) && stderr.contains("set store.path (ANTLER_DATA_DIR)"),
        "{stderr}"
    );
}

const SLACK_TOKEN: &str = "xoxb-1-CLI-slack-token";
const SLACK_SECRET: &str = "cli-signing-secret-0";

fn slack_config(dir: &std::path::Path, model: &str, api_url: &str, extra: &str) -> String {
    let path = dir.join("antler.toml");
    let text = crate::support::config_text(
        model,
        &dir.join("store"),
        &format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\npublic_url = \"https://bot.example.com/\"\n\
             [channels.slack]\nenabled = true\nbot_token = \"{SLACK_TOKEN}\"\n\
             signing_secret = \"{SLACK_SECRET}\"\napi_url = \"{api_url}\"\n{extra}",
            free_port()
        ),
    );
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_manifest_names_antlers_urls_events_and_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let config = slack_config(
        dir.path(),
        "http://127.0.0.1:9",
        "http://127.0.0.1:9/api",
        "command = \"/ops\"\n",
    );
    let (code, stdout, stderr) = run_binary(&["slack", "manifest", "--config", &config]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let manifest: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let settings = &manifest["settings"]["event_subscriptions"];
    assert_eq!(
        settings["request_url"],
        "https://bot.example.com/webhooks/slack/events"
    );
    let events = settings["bot_events"].to_string();
    for event in ["app_mention", "message.im", "message.channels"] {
        assert!(events.contains(event), "{events}");
    }
    assert_eq!(
        manifest["settings"]["interactivity"],
        serde_json::json!({
            "is_enabled": true,
            "request_url": "https://bot.example.com/webhooks/slack/interactions"
        }),
        "approval buttons' presses come to the interactions route"
    );
    let command = &manifest["features"]["slash_commands"][0];
    assert_eq!(command["command"], "/ops");
    assert_eq!(
        command["url"],
        "https://bot.example.com/webhooks/slack/commands"
    );
    let scopes = manifest["oauth_config"]["scopes"]["bot"].to_string();
    for scope in [
        "app_mentions:read",
        "chat:write",
        "im:history",
        "files:read",
    ] {
        assert!(scopes.contains(scope), "{scopes}");
    }
    assert!(!stdout.contains(SLACK_TOKEN) && !stdout.contains(SLACK_SECRET));

    // Without an https public URL there is nothing to put in it.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("https://bot.example.com/", "http://bot.example.com");
    std::fs::write(&config, text).unwrap();
    let (code, _, stderr) = run_binary(&["slack", "manifest", "--config", &config]).await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("server.public_url"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_slack_token_and_its_workspace() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let api = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::path("/api/auth.test"))
        .respond_with(
            wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "ok": true, "url": "https://acme-ops.slack.com/", "team": "Acme Ops",
                "user": "opsbot", "team_id": "T0OPS00001", "user_id": "U0BOT00001",
                "bot_id": "B0BOT00001"
            })),
        )
        .mount(&api)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let api_url = format!("{}/api", api.uri());
    let config = slack_config(dir.path(), &mock.base_url(), &api_url, "");
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("ok    slack") && stdout.contains("U0BOT00001 in Acme Ops (T0OPS00001)"),
        "{stdout}"
    );
    let config = slack_config(
        dir.path(),
        &mock.base_url(),
        &api_url,
        "team_id = \"T0OTHER0001\"\n",
    );
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  slack") && stdout.contains("channels.slack.team_id is T0OTHER0001"),
        "{stdout}"
    );
    assert!(!stdout.contains(SLACK_TOKEN), "{stdout}");
}

/// Socket Mode: the manifest turns it on and names no request URL (no `server.public_url`
/// needed), and doctor checks the app token with `apps.connections.open` without connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_socket_mode_manifest_and_doctor_check_the_app_token() {
    use antler_testkit::slack::{APP_TOKEN, MockSlack, MockSocket};
    let mock = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let socket = MockSocket::start().await;
    let opened = api.serve_socket(&socket).await;
    let dir = tempfile::tempdir().unwrap();
    let write = |app_token: &str| {
        let path = dir.path().join("antler.toml");
        let text = crate::support::config_text(
            &mock.base_url(),
            &dir.path().join("store"),
            &format!(
                "[server]\nlisten = \"127.0.0.1:{}\"\n{}",
                free_port(),
                api.socket_config(app_token, "")
            ),
        );
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let config = write(APP_TOKEN);
    let (code, stdout, stderr) = run_binary(&["slack", "manifest", "--config", &config]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let manifest: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(manifest["settings"]["socket_mode_enabled"], true);
    assert_eq!(
        manifest["settings"]["event_subscriptions"].get("request_url"),
        None
    );
    assert_eq!(manifest["features"]["slash_commands"][0].get("url"), None);
    assert_eq!(
        manifest["settings"]["interactivity"],
        serde_json::json!({"is_enabled": true})
    );

    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("ok    slack socket"), "{stdout}");
    assert_eq!(opened.lock().unwrap().len(), 1);
    assert_eq!(socket.connections(), 0, "doctor does not connect");

    let config = write("xapp-1-A0OPSBOT001-1-REVOKED-token");
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  slack socket") && stdout.contains("invalid_auth"),
        "{stdout}"
    );
    assert!(stdout.contains("connections:write"), "the fix: {stdout}");
    assert!(!stdout.contains("REVOKED"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_feishu_app_credentials() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let api = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::path(
        "/open-apis/auth/v3/tenant_access_token/internal",
    ))
    .and(wiremock::matchers::body_partial_json(
        serde_json::json!({"app_id": "cli_doctor01", "app_secret": "FEISHU-doctor-secret"}),
    ))
    .respond_with(
        wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "code": 0, "msg": "ok", "tenant_access_token": "t-DOCTOR-token", "expire": 7200
        })),
    )
    .mount(&api)
    .await;
    wiremock::Mock::given(wiremock::matchers::path(
        "/open-apis/auth/v3/tenant_access_token/internal",
    ))
    .respond_with(
        wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "code": 10014, "msg": "app secret invalid"
        })),
    )
    .with_priority(10)
    .mount(&api)
    .await;
    wiremock::Mock::given(wiremock::matchers::path("/open-apis/bot/v3/info"))
        .respond_with(
            wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "code": 0, "msg": "ok", "bot": {"app_name": "OpsBot", "open_id": "ou_bot"}
            })),
        )
        .mount(&api)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let config = |secret: &str| {
        let path = dir.path().join("antler.toml");
        let text = crate::support::config_text(
            &mock.base_url(),
            &dir.path().join("store"),
            &format!(
                "[server]\nlisten = \"127.0.0.1:{}\"\n[channels.feishu]\nenabled = true\n\
                 app_id = \"cli_doctor01\"\napp_secret = \"{secret}\"\n\
                 verification_token = \"v\"\napi_url = \"{}\"\n",
                free_port(),
                api.uri()
            ),
        );
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (code, stdout, _) =
        run_binary(&["doctor", "--config", &config("FEISHU-doctor-secret")]).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("ok    feishu") && stdout.contains("the bot is OpsBot"),
        "{stdout}"
    );
    let (code, stdout, _) = run_binary(&["doctor", "--config", &config("FEISHU-wrong")]).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  feishu"), "{stdout}");
    assert!(
        !stdout.contains("FEISHU-") && !stdout.contains("t-DOCTOR"),
        "a secret leaked: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_and_doctor_name_the_shell_sandbox_and_warn_about_an_unconfined_shell() {
    let mock = MockModel::start(Behaviour::Echo).await;
    let dir = crate::support::searchable_tempdir();
    let store = dir.path().join("store");
    let write = |name: &str, overrides: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            crate::support::config_text(&mock.base_url(), &store, overrides),
        )
        .unwrap();
        path.display().to_string()
    };
    let auto = write("auto.toml", "");
    let (code, stdout, stderr) = run_binary(&["check-config", "--config", &auto]).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("shell: sandbox auto, network off, limits 64 processes"),
        "{stdout}"
    );
    // The backend in effect, proven by a probe, or why there is none.
    assert!(
        stdout.contains("shell sandbox: bwrap (uid")
            || stdout.contains("shell sandbox: landlock (uid")
            || stdout.contains("warning: shell sandbox: none works"),
        "{stdout}"
    );
    assert!(!stdout.contains("sandbox = \"none\""), "{stdout}");

    let unconfined = write(
        "none.toml",
        "[agent.tools.bash]\nsandbox = \"none\"\n[agent.middleware.guardrail]\nenabled = false\n\
         [agent.middleware.sandbox_audit]\nenabled = false\n",
    );
    let (code, stdout, _) = run_binary(&["check-config", "--config", &unconfined]).await;
    assert_eq!(code, Some(0), "{stdout}");
    for warning in [
        "warning: agent.tools.bash.sandbox = \"none\"",
        "warning: agent.middleware.guardrail is off",
        "warning: agent.middleware.sandbox_audit is off",
    ] {
        assert!(stdout.contains(warning), "{warning}: {stdout}");
    }
    let (_, stdout, _) = run_binary(&["doctor", "--config", &unconfined]).await;
    assert!(
        stdout.contains("warn  shell    none (no isolation of the file system"),
        "{stdout}"
    );
    assert!(stdout.contains("guardrail is off"), "{stdout}");
}
