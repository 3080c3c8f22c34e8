//! Shared end-to-end test support: the mock model (`antler_testkit::mock_model`), configs, and a running
//! antler (in-process through `antler::serve`, or the real binary) reached over real HTTP.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub mod postgres;
pub mod source_metrics;

pub use antler_testkit::{DEADLINE, mock_model, wait_until};
pub use mock_model::{
    Behaviour, MEMORY_PROMPT, MODEL_NAME, MockModel, REASONING_MARK, SUBAGENT_PROMPT, Step,
    unwrap_user_text,
};

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

# A model-written title is one more model request per new thread; the tests that count
# requests are about turns. The title's own test turns it on.
[agent.middleware.title]
use_model = false

# The memory updater is one more model request per turn (at the latest when antler stops);
# memory's own tests turn it on.
[memory]
enabled = false
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
    /// The same client, sending `token` as its bearer token.
    pub fn with_token(&self, token: &str) -> Self {
        Self {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

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

    /// Whether antler itself answers: alive, and past what it answers while it waits for its
    /// store (a `/readyz` that names what it waits for). A connection the waiting server
    /// closes as it hands the listener over is "not yet".
    pub async fn is_serving(&self) -> bool {
        if !self.is_healthy().await {
            return false;
        }
        let request = self.http.get(format!("{}/readyz", self.base));
        match self.authorized(request).send().await {
            Ok(response) => answer_of(response).await.json["state"].is_null(),
            Err(_) => false,
        }
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

    /// `POST path` with an empty JSON object (the API takes no other content type).
    pub async fn post_to(&self, path: &str) -> Answer {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&json!({}));
        answer_of(self.authorized(request).send().await.expect("POST")).await
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

/// antler's binary at a path every user may reach: as built when every folder above it is
/// searchable by others, else (a checkout in a private folder, as root) a hard link to it (a
/// copy across file systems) in a searchable folder. Another user started by the tests, and
/// bubblewrap started as the sandbox's user, must be able to run it.
pub fn runnable_by_others() -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let built = PathBuf::from(env!("CARGO_BIN_EXE_antler"));
        let searchable = built.ancestors().skip(1).all(|dir| {
            std::fs::metadata(dir).is_ok_and(|meta| meta.permissions().mode() & 0o001 != 0)
        });
        if searchable || !rustix::process::geteuid().is_root() {
            return built;
        }
        // One folder per checkout, its binary replaced on each run: a hard link keeps the old
        // build's inode alive, so a folder per run would leave a binary behind every time.
        let tag = {
            use std::hash::{Hash as _, Hasher as _};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            built.hash(&mut hasher);
            hasher.finish()
        };
        let dir = std::env::temp_dir().join(format!("antler-e2e-bin-{tag:016x}"));
        let _ = std::fs::create_dir(&dir);
        let meta = std::fs::symlink_metadata(&dir).expect("the binary's folder");
        assert!(
            meta.is_dir() && std::os::unix::fs::MetadataExt::uid(&meta) == 0,
            "{} is not a folder of root's own",
            dir.display()
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .expect("chmod the binary's folder");
        let staged = dir.join(format!("antler.{}", std::process::id()));
        let _ = std::fs::remove_file(&staged);
        if std::fs::hard_link(&built, &staged).is_err() {
            std::fs::copy(&built, &staged).expect("copy antler where others can run it");
        }
        let linked = dir.join("antler");
        std::fs::rename(&staged, &linked).expect("put antler where others can run it");
        linked
    })
    .clone()
}

/// A temporary folder others may pass through (not list): a root antler runs shell commands
/// as an unprivileged user, who must reach the thread folders under it.
pub fn searchable_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
        .expect("chmod tempdir");
    dir
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
        let dir = searchable_tempdir();
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
            if client.is_serving().await {
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

    /// Starts the shutdown (as SIGTERM would) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
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
        let dir = searchable_tempdir();
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
        Self::serve_with_env(config, port, log, &[]).await
    }

    /// [`Child::serve`] with more environment variables.
    pub async fn serve_with_env(
        config: &Path,
        port: u16,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        Self::serve_as(config, port, log, env, None).await
    }

    /// [`Child::serve_with_env`] as the user `uid` (and group of the same number), when set.
    pub async fn serve_as(
        config: &Path,
        port: u16,
        log: &Path,
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Self {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let mut command = tokio::process::Command::new(runnable_by_others());
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        let process = command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
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

    /// Sends SIGHUP and waits until antler logged that it read its configuration again.
    pub async fn reload(&self) {
        let pid = self.process.id().expect("the child is running").to_string();
        let hup = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .expect("run kill");
        assert!(hup.success(), "kill -HUP {pid}");
        antler_testkit::wait_until("the reload is logged", || async {
            self.log_text()
                .contains("configuration reloaded")
                .then_some(())
        })
        .await;
    }
}

impl std::ops::Deref for Child {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

/// Sends SIGTERM to a child process and waits (up to the deadline) for it to exit.
pub async fn sigterm(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    let pid = child.id().expect("the child is running");
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -TERM {pid}");
    tokio::time::timeout(DEADLINE, child.wait())
        .await
        .unwrap_or_else(|_| panic!("antler did not exit within {DEADLINE:?} of SIGTERM"))
        .expect("wait for antler")
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

/// The value of one series in Prometheus text, named with its labels as rendered
/// (`antler_turns_total{outcome="ok"}`); `None` when it is not there.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().expect("a metric value"))
}
