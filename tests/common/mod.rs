//! Shared end-to-end test support: a mock OpenAI-compatible model server and a running antler
//! (in-process through `antler::serve`, or the real binary) reached over real HTTP.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// The generous deadline for anything a test waits for.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The model name configured for every test app.
pub const MODEL_NAME: &str = "mock-model-e2e";

// ---------------------------------------------------------------------------------------------
// The mock model
// ---------------------------------------------------------------------------------------------

/// How the mock model answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Echoes the last user message: `echo: <text>` (streamed when the request asks for it).
    Echo,
    /// Sleeps, then echoes.
    Slow(Duration),
    /// Calls `current_time` with `{}`; answers with the tool result once the last message is one.
    ToolThenAnswer,
    /// Answers 429 with `Retry-After: 0` this many times (in total), then echoes.
    RateLimited { times: usize },
    /// Answers 500 forever.
    ServerError,
    /// Answers 401 forever.
    Unauthorized,
    /// Always the same two `current_time` calls (offset 0 and 60), their order swapped between
    /// responses.
    Loop,
}

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Arrival order, from 0.
    pub index: usize,
    /// When it arrived.
    pub at: Instant,
    /// The JSON body.
    pub body: Value,
    /// The conversation key: the first user message of the request.
    pub conversation: String,
    /// Requests in flight (this one included) when it arrived.
    pub in_flight: usize,
    /// Requests of the same conversation in flight (this one included) when it arrived.
    pub in_flight_same_conversation: usize,
}

impl Recorded {
    /// The request's messages.
    pub fn messages(&self) -> Vec<Value> {
        self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The content of the last user message.
    pub fn last_user_text(&self) -> String {
        last_user_text(&self.body)
    }

    /// Whether this request overlapped another one.
    pub fn concurrent(&self) -> bool {
        self.in_flight > 1
    }
}

#[derive(Default)]
struct MockState {
    behaviour: Mutex<Option<Behaviour>>,
    requests: Mutex<Vec<Recorded>>,
    in_flight: AtomicUsize,
    in_flight_by_conversation: Mutex<HashMap<String, usize>>,
    max_in_flight_by_conversation: Mutex<HashMap<String, usize>>,
    failures_served: AtomicUsize,
    loop_responses: AtomicUsize,
    /// `Some(n)`: requests from arrival index `n` on wait (after being recorded) until it
    /// turns `None`.
    gate: Option<watch::Sender<Option<usize>>>,
}

/// Decrements the in-flight counters when a request is done (or its handler is dropped).
struct InFlight {
    state: Arc<MockState>,
    conversation: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut map) = self.state.in_flight_by_conversation.lock() {
            if let Some(n) = map.get_mut(&self.conversation) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// A mock OpenAI-compatible chat-completions server on 127.0.0.1.
#[derive(Clone)]
pub struct MockModel {
    state: Arc<MockState>,
    addr: SocketAddr,
}

impl MockModel {
    /// Starts the server with `behaviour`.
    pub async fn start(behaviour: Behaviour) -> Self {
        let (gate, _) = watch::channel(None);
        let state = Arc::new(MockState {
            behaviour: Mutex::new(Some(behaviour)),
            gate: Some(gate),
            ..MockState::default()
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(Arc::clone(&state));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind mock");
        let addr = listener.local_addr().expect("mock address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { state, addr }
    }

    /// The API base URL to configure (`.../v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Changes how later requests are answered.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().expect("behaviour lock") = Some(behaviour);
    }

    /// Makes requests wait (after being recorded) until [`MockModel::release`].
    pub fn hold(&self) {
        self.hold_from(0);
    }

    /// Makes requests from the `n`th (0-based arrival index) on wait until released.
    pub fn hold_from(&self, n: usize) {
        if let Some(gate) = &self.state.gate {
            gate.send_replace(Some(n));
        }
    }

    /// Lets held and later requests through.
    pub fn release(&self) {
        if let Some(gate) = &self.state.gate {
            gate.send_replace(None);
        }
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().expect("requests lock").clone()
    }

    /// How many requests arrived.
    pub fn count(&self) -> usize {
        self.state.requests.lock().expect("requests lock").len()
    }

    /// The largest number of requests of one conversation that were in flight at once.
    pub fn max_in_flight(&self, conversation: &str) -> usize {
        self.state
            .max_in_flight_by_conversation
            .lock()
            .expect("max lock")
            .get(conversation)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_for_requests(&self, n: usize) -> Vec<Recorded> {
        wait_until(&format!("the mock model received {n} requests"), || async {
            let requests = self.requests();
            (requests.len() >= n).then_some(requests)
        })
        .await
    }
}

fn last_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn first_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

async fn completions(State(state): State<Arc<MockState>>, body: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let conversation = first_user_text(&body);
    let in_flight = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let same = {
        let mut map = state.in_flight_by_conversation.lock().expect("lock");
        let n = map.entry(conversation.clone()).or_insert(0);
        *n += 1;
        *n
    };
    {
        let mut max = state.max_in_flight_by_conversation.lock().expect("lock");
        let m = max.entry(conversation.clone()).or_insert(0);
        *m = (*m).max(same);
    }
    let _guard = InFlight {
        state: Arc::clone(&state),
        conversation: conversation.clone(),
    };
    let index = {
        let mut requests = state.requests.lock().expect("lock");
        let index = requests.len();
        requests.push(Recorded {
            index,
            at: Instant::now(),
            body: body.clone(),
            conversation,
            in_flight,
            in_flight_same_conversation: same,
        });
        index
    };
    if let Some(gate) = &state.gate {
        let mut rx = gate.subscribe();
        let _ = rx
            .wait_for(|held| held.is_none_or(|from| index < from))
            .await;
    }
    let behaviour = state
        .behaviour
        .lock()
        .expect("lock")
        .clone()
        .unwrap_or(Behaviour::Echo);
    let stream = body["stream"].as_bool().unwrap_or(false);
    match behaviour {
        Behaviour::Echo => echo(&body, stream),
        Behaviour::Slow(wait) => {
            tokio::time::sleep(wait).await;
            echo(&body, stream)
        }
        Behaviour::ToolThenAnswer => {
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .cloned()
                .unwrap_or(Value::Null);
            if last["role"] == "tool" {
                let result = last["content"].as_str().unwrap_or_default();
                answer(&format!("The time is {result}"), stream)
            } else {
                tool_calls(&[("call_time_1", "{}")], stream)
            }
        }
        Behaviour::RateLimited { times } => {
            if state.failures_served.fetch_add(1, Ordering::SeqCst) < times {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, "0")],
                    axum::Json(json!({"error": {"message": "slow down", "type": "rate_limit"}})),
                )
                    .into_response()
            } else {
                echo(&body, stream)
            }
        }
        Behaviour::ServerError => (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": {"message": "boom", "type": "server_error"}})),
        )
            .into_response(),
        Behaviour::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})),
        )
            .into_response(),
        Behaviour::Loop => {
            let n = state.loop_responses.fetch_add(1, Ordering::SeqCst);
            let a = (
                format!("call_{n}_a"),
                r#"{"utc_offset_minutes":0}"#.to_owned(),
            );
            let b = (
                format!("call_{n}_b"),
                r#"{"utc_offset_minutes":60}"#.to_owned(),
            );
            let calls = if n % 2 == 0 { [a, b] } else { [b, a] };
            let calls: Vec<(&str, &str)> = calls
                .iter()
                .map(|(id, args)| (id.as_str(), args.as_str()))
                .collect();
            tool_calls(&calls, stream)
        }
    }
}

const USAGE: &str = r#"{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}"#;

fn echo(body: &Value, stream: bool) -> Response {
    answer(&format!("echo: {}", last_user_text(body)), stream)
}

fn usage() -> Value {
    serde_json::from_str(USAGE).unwrap_or(Value::Null)
}

/// A text answer, as one JSON completion or as SSE chunks of a few characters.
fn answer(text: &str, stream: bool) -> Response {
    if !stream {
        return axum::Json(json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage(),
        }))
        .into_response();
    }
    let chars: Vec<char> = text.chars().collect();
    let mut events = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})];
    for piece in chars.chunks(4) {
        let piece: String = piece.iter().collect();
        events.push(json!({"choices": [{"index": 0, "delta": {"content": piece}}]}));
    }
    events.push(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage()}),
    );
    sse(&events)
}

/// An answer with tool calls `(id, arguments)` to `current_time`.
fn tool_calls(calls: &[(&str, &str)], stream: bool) -> Response {
    let wire: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (id, args))| {
            json!({"index": i, "id": id, "type": "function", "function": {"name": "current_time", "arguments": args}})
        })
        .collect();
    if !stream {
        return axum::Json(json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": wire}, "finish_reason": "tool_calls"}],
            "usage": usage(),
        }))
        .into_response();
    }
    let mut events = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})];
    for call in wire {
        events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}));
    }
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": usage()}));
    sse(&events)
}

fn sse(events: &[Value]) -> Response {
    let mut body = String::new();
    for event in events {
        body.push_str(&format!("data: {event}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

// ---------------------------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------------------------

/// Polls `check` until it gives a value, for at most [`DEADLINE`]; panics naming `what`.
pub async fn wait_until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if start.elapsed() > DEADLINE {
            panic!("timed out after {DEADLINE:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// Merges `overrides` into `base`, table by table.
fn merge(base: &mut toml::Table, overrides: toml::Table) {
    for (key, value) in overrides {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(more)) => merge(existing, more),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// The config text for a test: the mock model, the store in `store`, quick retries, merged
/// with `overrides` (TOML; its tables replace or extend the base ones key by key).
pub fn config_text(model_base_url: &str, store: &Path, overrides: &str) -> String {
    let base = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shutdown_grace_secs = 5

[store]
path = {store:?}

[model]
base_url = "{model_base_url}"
api_key = "sk-e2e-test-key"
model = "{MODEL_NAME}"
max_retries = 1
request_timeout_secs = 60

[delivery]
backoff_base_ms = 10
backoff_max_secs = 1
"#,
        store = store.display().to_string(),
    );
    let mut table: toml::Table = toml::from_str(&base).expect("base config");
    let more: toml::Table = toml::from_str(overrides).expect("override config");
    merge(&mut table, more);
    toml::to_string(&table).expect("config to text")
}

/// A parsed and validated config (no environment variables).
pub fn config(model_base_url: &str, store: &Path, overrides: &str) -> antler::config::Config {
    let text = config_text(model_base_url, store, overrides);
    antler::config::Config::from_toml_str(&text, &|_| None)
        .unwrap_or_else(|e| panic!("invalid test config: {e}\n{text}"))
}

// ---------------------------------------------------------------------------------------------
// The app under test
// ---------------------------------------------------------------------------------------------

/// An HTTP answer: status, headers and the body (JSON when it parses, else a string).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
    pub json: Value,
}

async fn answer_of(response: reqwest::Response) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("response body");
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        text,
        json,
    }
}

/// An HTTP client for an antler at `base`.
#[derive(Debug, Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl Client {
    pub fn new(base: String) -> Self {
        Self {
            base,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            token: None,
        }
    }

    /// Whether `/healthz` answers 200 (false while the server is not up yet).
    pub async fn is_healthy(&self) -> bool {
        self.http
            .get(format!("{}/healthz", self.base))
            .send()
            .await
            .is_ok_and(|r| r.status() == StatusCode::OK)
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// `POST /api/v1/messages` with a JSON body.
    pub async fn post(&self, body: &Value) -> Answer {
        let request = self
            .http
            .post(format!("{}/api/v1/messages", self.base))
            .json(body);
        answer_of(self.authorized(request).send().await.expect("POST")).await
    }

    /// `POST /api/v1/messages` with raw bytes as the body.
    pub async fn post_raw(&self, body: impl Into<reqwest::Body>) -> Answer {
        let request = self
            .http
            .post(format!("{}/api/v1/messages", self.base))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body);
        answer_of(self.authorized(request).send().await.expect("POST")).await
    }

    /// Posts `text` on `conversation` and waits for the answer (`"wait": true`).
    pub async fn ask(&self, conversation: &str, text: &str) -> Answer {
        let answer = self
            .post(&json!({"conversation": conversation, "user": "tester", "text": text, "wait": true}))
            .await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "wait:true answer: {}",
            answer.text
        );
        answer
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Answer {
        let request = self.http.get(format!("{}{path}", self.base));
        answer_of(self.authorized(request).send().await.expect("GET")).await
    }

    /// The thread as JSON (panics unless 200).
    pub async fn thread(&self, id: &str) -> Value {
        let answer = self.get(&format!("/api/v1/threads/{id}")).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "GET thread {id}: {}",
            answer.text
        );
        answer.json
    }

    /// Waits until the thread exists and holds at least `n` messages.
    pub async fn wait_for_messages(&self, id: &str, n: usize) -> Value {
        wait_until(&format!("thread {id} has {n} messages"), || async {
            let answer = self.get(&format!("/api/v1/threads/{id}")).await;
            let count = answer.json["messages"].as_array().map_or(0, Vec::len);
            (answer.status == StatusCode::OK && count >= n).then_some(answer.json)
        })
        .await
    }

    /// Waits until nothing is in the inbox or waiting for delivery.
    pub async fn wait_idle(&self) -> Value {
        wait_until("inbox and outbox are empty", || async {
            let answer = self.get("/readyz").await;
            (answer.json["inbox"] == 0 && answer.json["outbox_pending"] == 0).then_some(answer.json)
        })
        .await
    }
}

/// antler served in-process on 127.0.0.1 with a oneshot shutdown.
pub struct TestApp {
    pub client: Client,
    pub addr: SocketAddr,
    pub store: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), antler::AppError>>>,
    _dir: Option<tempfile::TempDir>,
}

impl TestApp {
    /// Serves with a store in a fresh temporary directory.
    pub async fn spawn(mock: &MockModel, overrides: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut app = Self::start(mock, &dir.path().join("store"), overrides).await;
        app._dir = Some(dir);
        app
    }

    /// Serves with the store at `store` (kept after shutdown, for restarts).
    pub async fn start(mock: &MockModel, store: &Path, overrides: &str) -> Self {
        let config = config(&mock.base_url(), store, overrides);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
        let addr = listener.local_addr().expect("app address");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(antler::serve(config, listener, async move {
            let _ = rx.await;
        }));
        let client = Client::new(format!("http://{addr}"));
        let start = Instant::now();
        loop {
            if task.is_finished() {
                match task.await {
                    Ok(Err(e)) => panic!("serve failed to start: {e}"),
                    other => panic!("serve ended before it answered: {other:?}"),
                }
            }
            if client.is_healthy().await {
                break;
            }
            if start.elapsed() > DEADLINE {
                panic!("antler did not answer /healthz within {DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            client,
            addr,
            store: store.to_path_buf(),
            shutdown: Some(tx),
            task: Some(task),
            _dir: None,
        }
    }

    /// Stops the app and waits for `serve` to return (it must return Ok).
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(DEADLINE, task)
                .await
                .expect("serve returns after shutdown")
                .expect("serve task");
            if let Err(e) = result {
                panic!("serve failed: {e}");
            }
        }
    }
}

impl std::ops::Deref for TestApp {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The real binary
// ---------------------------------------------------------------------------------------------

/// A free port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// A config file, store and log in a temporary directory, for `antler serve` child processes
/// that are started (and restarted) on the same port and store.
pub struct ChildRig {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub port: u16,
    pub log: PathBuf,
}

impl ChildRig {
    /// Writes a config for `mock` on a free port; `overrides` is appended TOML (no `[server]`).
    pub fn new(mock: &MockModel, overrides: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let config = dir.path().join("antler.toml");
        let text = config_text(
            &mock.base_url(),
            &dir.path().join("store"),
            &format!("[server]\nlisten = \"127.0.0.1:{port}\"\n{overrides}"),
        );
        std::fs::write(&config, text).expect("write config");
        let log = dir.path().join("antler.log");
        Self {
            dir,
            config,
            port,
            log,
        }
    }

    /// Starts `antler serve` on this rig and waits until it answers.
    pub async fn serve(&self) -> Child {
        Child::serve(&self.config, self.port, &self.log).await
    }
}

/// `antler serve` as a child process; killed with SIGKILL when dropped.
pub struct Child {
    pub process: tokio::process::Child,
    pub client: Client,
    pub log: PathBuf,
}

impl Child {
    /// Starts `antler serve --config <config>` listening on `port` and waits until it answers.
    pub async fn serve(config: &Path, port: u16, log: &Path) -> Self {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let process = tokio::process::Command::new(env!("CARGO_BIN_EXE_antler"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn antler");
        let client = Client::new(format!("http://127.0.0.1:{port}"));
        let mut child = Self {
            process,
            client,
            log: log.to_path_buf(),
        };
        let probe = child.client.clone();
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.process.try_wait() {
                panic!("antler exited early with {status}:\n{}", child.log_text());
            }
            if probe.is_healthy().await {
                break;
            }
            if start.elapsed() > DEADLINE {
                panic!("antler did not come up:\n{}", child.log_text());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        child
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(&mut self) {
        self.process.kill().await.expect("kill antler");
    }

    /// What the process logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl std::ops::Deref for Child {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

/// Runs the binary with `args` to completion: (exit code, stdout, stderr).
pub async fn run_binary(args: &[&str]) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_antler"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run antler");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Reads a text/event-stream response to its end: `(event name, data JSON)` pairs.
pub async fn read_sse(response: reqwest::Response) -> Vec<(String, Value)> {
    read_sse_until(response, |_| false).await
}

/// Reads a text/event-stream response until `done` says the events so far are enough (or
/// the stream ends).
pub async fn read_sse_until(
    response: reqwest::Response,
    done: impl Fn(&[(String, Value)]) -> bool,
) -> Vec<(String, Value)> {
    use futures_util::StreamExt;
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    let read = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.expect("SSE chunk");
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let mut name = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if !data.is_empty() {
                    events.push((
                        name,
                        serde_json::from_str(&data).unwrap_or(Value::String(data)),
                    ));
                    if done(&events) {
                        return;
                    }
                }
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("the SSE stream ends");
    events
}
