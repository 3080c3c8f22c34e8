//! End-to-end pipeline benchmark: the real `antler serve` binary against the end-to-end tests'
//! mock model (`antler_testkit::mock_model`: echoes, streamed in small chunks).
//!
//! `cargo bench --bench pipeline -- [--quick] [--runs R] [--messages N] [--concurrency C]
//! [--threads T] [--queued Q] [--queued-concurrency QC] [--thread-turns L] [--startups S]
//! [--sequential K] [--takeovers KT] [--only PHASE,...] [--timeout-secs X]`
//!
//! Defaults: R=3, N=5000, C=64, T=1000, Q=60000, QC=256, L=20, S=5, K=200, KT=5, X=600 (per
//! load phase). `--quick` is a smoke run: N=500, Q=5000, R=1, S=1. `--only` takes a
//! comma-separated subset of `startup,sequential,acks,turns,queued,growth,telegram,memory,
//! subagents,sandbox,pg-acks,pg-turns,takeover` (the ceiling always runs; `pg-acks` and
//! `pg-turns` bring in `acks` and `turns`, whose sled figures they are compared with).
//!
//! In one process: the mock model, a bare axum handler (the HTTP ceiling) and a mock Telegram
//! Bot API, all on 127.0.0.1:0, and the load generator (one shared reqwest client, HTTP/1.1
//! keep-alive, C concurrent tasks; a second one, alike but sending Telegram's secret header,
//! for the webhooks). Every antler is a fresh child process with a fresh store on disk, a
//! backlog larger than anything it is sent, and `max_concurrent_turns = 64`. Each of the R runs
//! measures, in order:
//!
//! - **ceiling**: N posts of the API's body shape to a bare axum handler answering 202, with
//!   the same client and concurrency C;
//! - **sequential**: the shapes of issue 27's table, one client, every turn on a new
//!   conversation (so each is its thread's first turn). A fresh antler against an echoing
//!   mock: spawn → its first `wait: true` turn answered (spawn → `/readyz` 200, plus that
//!   turn's round trip; the RSS read between them is not counted), RSS idle (`/readyz` 200,
//!   no turn yet) and after that first turn; then K sequential plain turns: p50 latency,
//!   antler's CPU per turn (utime + stime of `/proc/<pid>/stat` over the K turns and their
//!   delivery receipts, ÷ K) and model calls per turn (the mock's count), and peak RSS after
//!   them. Then a second antler against a mock in `Behaviour::ToolThenAnswer` (it calls
//!   `current_time`, then answers with its result): one warm-up tool turn, then K sequential
//!   tool turns with the same figures;
//! - **acks**: N plain posts (no `wait`: answered 202 once durable), one per conversation,
//!   while the mock model is held so that turns do not compete for CPU: the ack rate, its
//!   p50/p99 latency, antler's CPU per ack and the group-committed syncs per ack
//!   (`antler_store_flushes_total` of `/metrics`); then the model is released and the drain
//!   of those N turns is timed (until `/readyz` shows an empty inbox);
//! - **turns**: N posts with `"wait": true` over T conversations (answered once the reply is
//!   delivered): turns/s, p50/p90/p99, antler's CPU per turn (utime + stime of
//!   `/proc/<pid>/stat`), then its RSS with T threads stored (`/proc/<pid>/status`);
//! - **queued**: Q messages, one per conversation, posted with concurrency QC while the model
//!   is held; RSS then ("before the drain"), and again once the inbox and the outbox are empty;
//! - **growth**: L sequential `wait: true` turns on one conversation, recording after each the
//!   store's size on disk (`store_bytes` of `/readyz`: sled's log file length, which grows by
//!   what is appended) and the bytes antler caused to be written to storage (`write_bytes` of
//!   `/proc/<pid>/io`, whole 4 KiB pages); growth per turn over turns 1–5 and over the last five;
//! - **memory**: L sequential `wait: true` turns of one user, each on a new thread, against a
//!   recorded mock whose answer to the memory updater holds one new fact per turn; once with
//!   `[memory]` off and once on with `debounce_seconds = 0`, each turn's updater call awaited
//!   before the next. Turn p50 and antler's CPU per turn off/on, the updater prompt's o200k
//!   tokens (median, last), the injected block's tokens after L facts, the delay from a
//!   turn's answer to its updater call. The other phases run with memory off;
//! - **telegram**: antler with `[channels.telegram]` in webhook mode, its `api_url` the mock
//!   Bot API (teloxide-core's `POST /bot<token>/<Method>`: `GetMe`, `SendMessage`,
//!   `SendChatAction`, `EditMessageText`, each answered `{"ok": true, "result": ...}`; the mock
//!   counts the calls per method, and every `SendMessage` is one answered turn, the echoes
//!   being short). N signed webhooks (`POST /webhooks/telegram` with
//!   `X-Telegram-Bot-Api-Secret-Token`, a private text message each, one chat per message,
//!   answered 200 once durable) with concurrency C while the mock model is held: the webhook
//!   ack rate, its p50/p99 latency and antler's CPU per ack; then the model is released and
//!   the drain is timed until the mock has counted N `SendMessage` (answered turns/s). Then a
//!   fresh antler, the model free: N webhooks over T chats with concurrency C, timed from the
//!   first post to the N-th `SendMessage` (answered turns/s under load). Both antlers are
//!   drained (inbox and outbox empty) before they stop, and must have sent exactly N messages
//!   each; warnings and errors in their logs are printed on stderr.
//!
//! - **pg-acks**, **pg-turns** (with `ANTLER_BENCH_DATABASE_URL`, e.g.
//!   `postgres://root@127.0.0.1:5432/test`; without it they say they are skipped): the
//!   `acks` and `turns` phases, same N, C and T, on `[store] backend = "postgres"`, each in a
//!   fresh schema (the URL's `search_path`, dropped afterwards) with one `[store] path` folder
//!   its replicas share: once with 1 replica, once with 2 (`lease_secs = 3`). With 2, request
//!   i goes to replica i mod 2 and a 503 (a replica standing by, today's active/standby) is
//!   retried at once on the other, as a load balancer would; the 503s are counted and the
//!   latency runs from the first attempt. Reported beside the sled figures of the same run:
//!   rates, pg ×1 ÷ sled and pg ×2 ÷ pg ×1 (within a run, then the median), latencies, CPU
//!   per message of all replicas and of the local PostgreSQL's processes (`comm` postgres;
//!   other clients of the server count too). The drain waits until every replica whose
//!   `/readyz` reports the store shows an empty inbox and outbox;
//! - **takeover** (same variable): two replicas on one schema, `lease_secs = 3`, each with
//!   `[channels.telegram]` in webhook mode and a mock Bot API of its own, so the bench sees
//!   which replica answered. KT rounds: a chat's first message is posted to the replicas in
//!   turn (503: the other) and answered by replica X (with active/standby the active one;
//!   with active/active whichever holds the chat); X is SIGKILLed; the chat's next message
//!   is posted to the survivor, retried every 20 ms while it answers 503 (as a platform
//!   retries, but without honouring `Retry-After`); the takeover is the time from the kill
//!   to that answer's `SendMessage` at the mock. X is restarted (a new replica name, as a
//!   new pod would have) before the next round. p50, p99 and max over every kill of every
//!   run; each second message must be answered exactly once, and first answers sent again
//!   after the kill (at-least-once delivery's window) are counted.
//!
//! With `ANTLER_BENCH_BIN` set, that binary is measured instead of this build's (a baseline
//! commit's, for before/after figures). With `ANTLER_BENCH_WRAP` set (e.g. `heaptrack -o /tmp/antler`), each antler runs under that
//! command; the bench stops the wrapper, so check for antlers left running afterwards. Startup is spawn → first 200 of `/readyz` (median of S spawns). Every figure is the median
//! of the R runs; ratios are taken within a run, against that run's ceiling. Each phase prints
//! its antler's pid on stderr (for `perf`; the release profile strips symbols, so profile a
//! `cargo build --profile profiling` binary: `ANTLER_BENCH_BIN=target/profiling/antler`).
//! Prints a table and one JSON line. The table's target column holds issue 27's targets (with
//! met / NOT met) where a row measures one, and its baseline column the issue's figure at its
//! start (`ISSUE27`; where the issue measured another shape, the metric's text says so); the
//! JSON line has the same under `issue27`. With `ANTLER_BENCH_BASELINE` naming another
//! antler binary (e.g. the release build of issue 27's start), every run first measures that
//! binary's issue-27 phases (sequential, acks, turns, queued, growth, as chosen by `--only`),
//! then this one's, interleaved; the baseline column then shows the baseline's figure measured
//! in the same runs, beside the issue's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

use antler_testkit::mock_model::{self, Behaviour, MODEL_NAME, MockModel};

/// MB as in the targets (10^6 bytes), in MiB.
const MB_IN_MIB: f64 = 1e6 / 1_048_576.0;

#[derive(Clone)]
struct Args {
    messages: usize,
    concurrency: usize,
    threads: usize,
    runs: usize,
    startups: usize,
    queued: usize,
    queued_concurrency: usize,
    thread_turns: usize,
    /// Sequential turns of each kind in the `sequential` phase.
    sequential: usize,
    timeout: Duration,
    /// The phases to run (`--only`); all by default.
    only: Vec<String>,
    /// Kills of the `takeover` phase per run.
    takeovers: usize,
}

/// The phases `--only` may name.
const PHASES: [&str; 13] = [
    "startup",
    "sequential",
    "acks",
    "turns",
    "queued",
    "growth",
    "telegram",
    "memory",
    "subagents",
    "sandbox",
    "pg-acks",
    "pg-turns",
    "takeover",
];

impl Args {
    fn parse() -> Self {
        let mut a = Self {
            messages: 5000,
            concurrency: 64,
            threads: 1000,
            runs: 3,
            startups: 5,
            queued: 60_000,
            queued_concurrency: 256,
            thread_turns: 20,
            sequential: 200,
            timeout: Duration::from_secs(600),
            only: PHASES.iter().map(|p| (*p).to_owned()).collect(),
            takeovers: 5,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || -> usize {
                let v = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
                v.parse()
                    .unwrap_or_else(|_| panic!("{flag}: not a number: {v}"))
            };
            match flag.as_str() {
                "--messages" => a.messages = value().max(1),
                "--concurrency" => a.concurrency = value().max(1),
                "--threads" => a.threads = value().max(1),
                "--runs" => a.runs = value().max(1),
                "--startups" => a.startups = value().max(1),
                "--queued" => a.queued = value().max(1),
                "--queued-concurrency" => a.queued_concurrency = value().max(1),
                // Growth is compared over the first and the last five turns.
                "--thread-turns" => a.thread_turns = value().max(10),
                "--sequential" => a.sequential = value().max(1),
                "--timeout-secs" => a.timeout = Duration::from_secs(value() as u64),
                "--takeovers" => a.takeovers = value().max(1),
                "--only" => {
                    let list = it.next().expect("--only needs a list of phases");
                    a.only = list.split(',').map(str::to_owned).collect();
                    for phase in &a.only {
                        assert!(
                            PHASES.contains(&phase.as_str()),
                            "--only: unknown phase {phase}; phases: {PHASES:?}"
                        );
                    }
                }
                "--quick" => {
                    a.messages = 500;
                    a.runs = 1;
                    a.startups = 1;
                    a.queued = 5000;
                }
                "--bench" => {} // passed by `cargo bench`
                other => panic!("unknown argument {other}"),
            }
        }
        // The PostgreSQL figures are read beside sled's of the same run.
        for (pg, sled) in [("pg-acks", "acks"), ("pg-turns", "turns")] {
            if a.runs(pg) && !a.runs(sled) {
                a.only.push(sled.to_owned());
            }
        }
        a
    }

    fn runs(&self, phase: &str) -> bool {
        self.only.iter().any(|p| p == phase)
    }
}

// ---- the ceiling ----

async fn spawn_server(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A bare handler answering like antler's acknowledgement: 202 and a body of the same shape.
async fn bare_ack(_body: Bytes) -> axum::response::Response {
    let body = json!({
        "thread_id": "0197a2b3c4d5e6f708192a3b4c5d6e7f",
        "conversation": "api:bench/c00000",
        "message_id": "r0-m00000",
        "duplicate": false,
    });
    (StatusCode::ACCEPTED, axum::Json(body)).into_response()
}

// ---- the mock Telegram Bot API ----

/// The bot token antler is given; teloxide-core posts to `/bot<token>/<Method>`.
const TG_TOKEN: &str = "7000000001:BENCH-token";
/// The `X-Telegram-Bot-Api-Secret-Token` every webhook carries.
const TG_SECRET: &str = "bench_secret-1";

/// The calls the mock Bot API has answered, by method.
#[derive(Debug, Default)]
struct BotApi {
    get_me: AtomicUsize,
    /// One per answered turn.
    send_message: AtomicUsize,
    edit_message_text: AtomicUsize,
    send_chat_action: AtomicUsize,
    /// Any other method, or a path without the bench's token.
    other: AtomicUsize,
    /// The last message id handed out.
    message_id: AtomicUsize,
    /// Every `SendMessage` by chat: when it arrived and its text (the `takeover` phase).
    sent_to: std::sync::Mutex<std::collections::HashMap<i64, Vec<(Instant, String)>>>,
}

/// The Bot API calls made between two [`BotApi::counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
struct BotCalls {
    get_me: usize,
    send_message: usize,
    edit_message_text: usize,
    send_chat_action: usize,
    other: usize,
}

impl BotCalls {
    fn since(self, before: Self) -> Self {
        Self {
            get_me: self.get_me - before.get_me,
            send_message: self.send_message - before.send_message,
            edit_message_text: self.edit_message_text - before.edit_message_text,
            send_chat_action: self.send_chat_action - before.send_chat_action,
            other: self.other - before.other,
        }
    }
}

impl BotApi {
    /// Serves the mock on 127.0.0.1:0; returns it and its base URL (antler's `api_url`).
    async fn start() -> (Arc<Self>, String) {
        let api = Arc::new(Self::default());
        let app = Router::new()
            .fallback(bot_api_answer)
            .with_state(api.clone());
        (api, spawn_server(app).await)
    }

    fn sent(&self) -> usize {
        self.send_message.load(Ordering::SeqCst)
    }

    /// The `SendMessage` calls to `chat` so far: arrival and text.
    fn sent_to(&self, chat: i64) -> Vec<(Instant, String)> {
        self.sent_to
            .lock()
            .unwrap()
            .get(&chat)
            .cloned()
            .unwrap_or_default()
    }

    fn counts(&self) -> BotCalls {
        BotCalls {
            get_me: self.get_me.load(Ordering::SeqCst),
            send_message: self.sent(),
            edit_message_text: self.edit_message_text.load(Ordering::SeqCst),
            send_chat_action: self.send_chat_action.load(Ordering::SeqCst),
            other: self.other.load(Ordering::SeqCst),
        }
    }

    /// Waits until `SendMessage` has been called `n` times in all.
    async fn wait_sent(&self, n: usize, antler: &Antler, timeout: Duration) {
        let started = Instant::now();
        while self.sent() < n {
            assert!(
                started.elapsed() < timeout,
                "the mock Bot API got {} of {n} SendMessage within {timeout:?}; {:?}\n{}",
                self.sent(),
                self.counts(),
                antler.log()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Answers every Bot API method `{"ok": true, "result": ...}`: the bot for `GetMe`, a message
/// in the requested chat for `SendMessage` and `EditMessageText`, `true` for anything else.
async fn bot_api_answer(
    State(api): State<Arc<BotApi>>,
    uri: Uri,
    body: Bytes,
) -> axum::Json<Value> {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let message = || {
        let id = api.message_id.fetch_add(1, Ordering::SeqCst) + 1;
        json!({"message_id": id, "date": 1_700_000_000, "text": "x",
               "chat": {"id": request["chat_id"], "type": "private", "first_name": "U"}})
    };
    let method = uri
        .path()
        .strip_prefix("/bot")
        .and_then(|p| p.strip_prefix(TG_TOKEN))
        .and_then(|p| p.strip_prefix('/'));
    let result = match method {
        Some("GetMe") => {
            api.get_me.fetch_add(1, Ordering::SeqCst);
            json!({"id": 7_000_000_001u64, "is_bot": true, "first_name": "Bench",
                   "username": "bench_bot", "can_join_groups": true,
                   "can_read_all_group_messages": false, "supports_inline_queries": false,
                   "has_main_web_app": false})
        }
        Some("SendMessage") => {
            let m = message();
            if let Some(chat) = request["chat_id"].as_i64() {
                let text = request["text"].as_str().unwrap_or_default().to_owned();
                api.sent_to
                    .lock()
                    .unwrap()
                    .entry(chat)
                    .or_default()
                    .push((Instant::now(), text));
            }
            api.send_message.fetch_add(1, Ordering::SeqCst);
            m
        }
        Some("EditMessageText") => {
            api.edit_message_text.fetch_add(1, Ordering::SeqCst);
            message()
        }
        Some("SendChatAction") => {
            api.send_chat_action.fetch_add(1, Ordering::SeqCst);
            json!(true)
        }
        _ => {
            api.other.fetch_add(1, Ordering::SeqCst);
            json!(true)
        }
    };
    axum::Json(json!({"ok": true, "result": result}))
}

// ---- load generator ----

struct Load {
    wall: Duration,
    /// Sorted per-request latencies (a retried request: from its first attempt).
    latencies: Vec<Duration>,
    /// 503s met and retried on the next replica (several URLs only).
    retried: usize,
}

impl Load {
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }
    fn pct(&self, p: f64) -> f64 {
        let i = ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[i - 1].as_secs_f64() * 1e3
    }
}

/// Sends `n` POSTs from `c` tasks; every answer must have `status` and satisfy `check`.
#[allow(clippy::too_many_arguments)]
async fn load(
    client: &reqwest::Client,
    url: &str,
    n: usize,
    c: usize,
    timeout: Duration,
    status: u16,
    body: impl Fn(usize) -> Value + Send + Sync + 'static,
    check: impl Fn(usize, &Value) -> bool + Send + Sync + 'static,
) -> Load {
    load_on(
        client,
        &[url.to_owned()],
        n,
        c,
        timeout,
        status,
        body,
        check,
    )
    .await
}

/// [`load`] spread over replicas: request `i` goes to `urls[i % len]`, and a 503 (a replica
/// standing by, or one that does not take the message now) is retried on the next replica,
/// as a load balancer would, pausing only once every replica has said 503 in turn. With one
/// URL a 503 fails the load like any other unexpected status.
#[allow(clippy::too_many_arguments)]
async fn load_on(
    client: &reqwest::Client,
    urls: &[String],
    n: usize,
    c: usize,
    timeout: Duration,
    status: u16,
    body: impl Fn(usize) -> Value + Send + Sync + 'static,
    check: impl Fn(usize, &Value) -> bool + Send + Sync + 'static,
) -> Load {
    let next = Arc::new(AtomicUsize::new(0));
    let retried = Arc::new(AtomicUsize::new(0));
    let urls: Arc<Vec<String>> = Arc::new(urls.to_vec());
    let body = Arc::new(body);
    let check = Arc::new(check);
    let started = Instant::now();
    let tasks: Vec<_> = (0..c.min(n))
        .map(|_| {
            let (client, urls, next, retried, body, check) = (
                client.clone(),
                urls.clone(),
                next.clone(),
                retried.clone(),
                body.clone(),
                check.clone(),
            );
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(n / c + 1);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return lat;
                    }
                    let payload = body(i);
                    let t = Instant::now();
                    let mut at = i % urls.len();
                    let (got, bytes) = loop {
                        let response = client
                            .post(&urls[at])
                            .json(&payload)
                            .send()
                            .await
                            .expect("request failed");
                        let got = response.status();
                        let bytes = response.bytes().await.expect("bad response body");
                        if got != 503 || urls.len() == 1 {
                            break (got, bytes);
                        }
                        retried.fetch_add(1, Ordering::Relaxed);
                        at = (at + 1) % urls.len();
                        if at == i % urls.len() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    };
                    // A webhook's acknowledgement has no body.
                    let answer: Value = if bytes.is_empty() {
                        Value::Null
                    } else {
                        serde_json::from_slice(&bytes).expect("bad response body")
                    };
                    assert!(
                        got == status && check(i, &answer),
                        "request {i}: {got} {answer}"
                    );
                    lat.push(t.elapsed());
                }
            })
        })
        .collect();
    let all = tokio::time::timeout(timeout, futures_util::future::try_join_all(tasks))
        .await
        .unwrap_or_else(|_| panic!("load did not finish within {timeout:?}; aborting"))
        .expect("a load task failed");
    let wall = started.elapsed();
    let mut latencies: Vec<Duration> = all.into_iter().flatten().collect();
    latencies.sort_unstable();
    Load {
        wall,
        latencies,
        retried: retried.load(Ordering::Relaxed),
    }
}

// ---- the antler child ----

/// The running `antler serve`; killed (SIGKILL) on drop unless stopped gracefully first.
struct Antler {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Antler {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The antler under test: this build's, or `ANTLER_BENCH_BIN` (another build, e.g. a
/// baseline commit's, measured by the same bench).
fn antler_binary() -> String {
    if let Some(path) = BASELINE_PASS.lock().unwrap().clone() {
        return path;
    }
    let path = std::env::var("ANTLER_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_antler").to_owned());
    assert!(Path::new(&path).exists(), "antler binary missing at {path}");
    path
}

/// While the baseline's phases run: its binary (`ANTLER_BENCH_BASELINE`), measured instead of
/// [`antler_binary`]'s.
static BASELINE_PASS: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The baseline binary measured beside this one in every run (`ANTLER_BENCH_BASELINE`), if any.
fn baseline_binary() -> Option<String> {
    let path = std::env::var("ANTLER_BENCH_BASELINE").ok()?;
    let path = path.trim().to_owned();
    if path.is_empty() {
        return None;
    }
    assert!(
        Path::new(&path).exists(),
        "baseline binary missing at {path}"
    );
    Some(path)
}

/// Spawns antler with a fresh store and room for `backlog` waiting messages, and with the
/// Telegram channel (webhook mode, `dm_policy = "open"`: anyone may talk) when `telegram_api` names a Bot API;
/// returns it and the time until `/readyz` answered 200.
async fn start_antler(
    model_base_url: &str,
    backlog: usize,
    deadline: Duration,
    telegram_api: Option<&str>,
) -> (Antler, Duration) {
    start_antler_with(model_base_url, backlog, deadline, telegram_api, "", "").await
}

/// [`start_antler`] with `memory` as the `[memory]` table; empty: memory off, so the other
/// phases measure the pipeline without the updater's model calls (the `memory` phase
/// measures those).
async fn start_antler_with(
    model_base_url: &str,
    backlog: usize,
    deadline: Duration,
    telegram_api: Option<&str>,
    memory: &str,
    extra: &str,
) -> (Antler, Duration) {
    spawn_antler(
        model_base_url,
        backlog,
        deadline,
        telegram_api,
        memory,
        extra,
        None,
    )
    .await
}

/// A replica of antler on PostgreSQL: the database (a schema of its own), the `[store] path`
/// every replica of it shares, and this replica's name.
struct PgReplica<'a> {
    url: &'a str,
    folder: &'a Path,
    name: String,
}

/// Spawns antler: on a fresh sled store of its own, or as `replica` on PostgreSQL, which has
/// started once `/readyz` is 200 or says `standing_by` (a second replica while main is
/// active/standby).
async fn spawn_antler(
    model_base_url: &str,
    backlog: usize,
    deadline: Duration,
    telegram_api: Option<&str>,
    memory: &str,
    extra: &str,
    replica: Option<&PgReplica<'_>>,
) -> (Antler, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = match replica {
        None => format!(
            "path = {:?}\n",
            dir.path().join("data").display().to_string()
        ),
        Some(replica) => format!(
            "backend = \"postgres\"\nurl = {:?}\npath = {:?}\nlease_secs = 3\nreplica = {:?}\n",
            replica.url,
            replica.folder.display().to_string(),
            replica.name
        ),
    };
    // Model and turn timeouts are long because phases hold the mock model while tens of
    // thousands of messages are posted; a held request must not time out and retry. Titles
    // are the shortened question: a model-written title is one more model call per new
    // thread, which measures the model, not antler.
    let mut config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[store]\n{store}\n\
         [model]\nbase_url = \"{model_base_url}\"\nmodel = \"{MODEL_NAME}\"\nrequest_timeout_secs = 1800\n\
         first_byte_timeout_secs = 1800\nidle_timeout_secs = 1800\n\n\
         [agent]\nmax_concurrent_turns = 64\nbacklog = {backlog}\nturn_timeout_secs = 1800\n\n\
         [agent.middleware.title]\nuse_model = false\n\n\
         [channels.api]\nenabled = true\n",
    );
    if memory.is_empty() {
        config.push_str("\n[memory]\nenabled = false\n");
    } else {
        config.push_str(&format!("\n[memory]\n{memory}\n"));
    }
    if let Some(api_url) = telegram_api {
        config.push_str(&format!(
            "\n[channels.telegram]\nenabled = true\nmode = \"webhook\"\n\
             bot_token = \"{TG_TOKEN}\"\nwebhook_secret = \"{TG_SECRET}\"\n\
             api_url = \"{api_url}\"\ndm_policy = \"open\"\n"
        ));
    }
    config.push_str(extra);
    let config_path = dir.path().join("antler.toml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(dir.path().join("antler.log")).unwrap();
    let probe = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    // `ANTLER_BENCH_WRAP="heaptrack -o /tmp/antler"` runs antler under a profiler.
    let mut command = match std::env::var("ANTLER_BENCH_WRAP") {
        Ok(wrap) if !wrap.trim().is_empty() => {
            let mut words = wrap.split_whitespace();
            let mut command = Command::new(words.next().unwrap());
            command.args(words).arg(antler_binary());
            command
        }
        _ => Command::new(antler_binary()),
    };
    let child = command
        .args(["serve", "--config"])
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("cannot spawn antler");
    let mut antler = Antler { child, url, dir };
    loop {
        if let Ok(r) = probe
            .get(format!("{}/readyz", antler.url))
            .timeout(Duration::from_secs(1))
            .send()
            .await
        {
            if r.status() == 200 {
                return (antler, started.elapsed());
            }
            if replica.is_some()
                && r.status() == 503
                && r.json::<Value>()
                    .await
                    .is_ok_and(|v| v["state"] == "standing_by")
            {
                return (antler, started.elapsed());
            }
        }
        if let Some(status) = antler.child.try_wait().unwrap() {
            panic!(
                "antler exited with {status} before it was ready:\n{}",
                antler.log()
            );
        }
        assert!(
            started.elapsed() < deadline,
            "antler not ready within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Resident memory, in MiB.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Mem {
    /// VmRSS.
    rss: f64,
    /// VmHWM (peak RSS).
    hwm: f64,
    /// RssAnon: the heap and stacks, without mapped files.
    anon: f64,
    /// Threads of the process.
    threads: f64,
}

impl Antler {
    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("antler.log")).unwrap_or_default()
    }

    /// Prints the warnings and errors of antler's log on stderr (the first few, and how many).
    fn report_log_problems(&self, label: &str) {
        let log = self.log();
        let problems: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains("ERROR"))
            // Expected: the bench leaves the allowlists empty and lets anyone talk.
            .filter(|l| !l.contains("allowed_chats are both empty"))
            .filter(|l| !l.contains("dm_policy is \"open\""))
            .collect();
        if !problems.is_empty() {
            eprintln!(
                "  {label}: {} warnings/errors in antler's log, the first:",
                problems.len()
            );
            for line in problems.iter().take(5) {
                eprintln!("    {line}");
            }
        }
    }

    fn store_path(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn mem(&self) -> Mem {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| -> f64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        let mib = |name: &str| field(name) / 1024.0;
        Mem {
            rss: mib("VmRSS:"),
            hwm: mib("VmHWM:"),
            anon: mib("RssAnon:"),
            threads: field("Threads:"),
        }
    }

    fn cpu_secs(&self) -> f64 {
        cpu_secs(&self.pid())
    }

    /// Bytes this process caused to be sent to storage (`write_bytes` of `/proc/<pid>/io`):
    /// whole pages, counted when they are dirtied.
    fn storage_write_bytes(&self) -> u64 {
        let io = std::fs::read_to_string(format!("/proc/{}/io", self.pid())).unwrap();
        io.lines()
            .find_map(|l| l.strip_prefix("write_bytes: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    async fn readyz(&self, client: &reqwest::Client) -> Value {
        let r = client
            .get(format!("{}/readyz", self.url))
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    }

    async fn flushes(&self, client: &reqwest::Client) -> f64 {
        let metrics = client
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("antler_store_flushes_total "))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    /// Waits until the inbox is empty and, with `outbox`, no reply is left to deliver; returns
    /// when the inbox emptied.
    async fn drain(&self, client: &reqwest::Client, outbox: bool, timeout: Duration) -> Duration {
        let started = Instant::now();
        let mut inbox_empty = None;
        loop {
            let ready = self.readyz(client).await;
            if inbox_empty.is_none() && ready["inbox"] == 0 {
                inbox_empty = Some(started.elapsed());
            }
            if let Some(at) = inbox_empty {
                if !outbox || ready["outbox_pending"] == 0 {
                    return at;
                }
            }
            assert!(
                started.elapsed() < timeout,
                "antler did not drain within {timeout:?}: {ready}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGKILL, and reap it.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for the graceful exit.
    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.pid()]).status();
        let begun = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                begun.elapsed() < Duration::from_secs(60),
                "antler did not stop after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// User + system CPU seconds of a process so far (assumes the usual 100 Hz clock tick).
fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) (utime, stime), counted from field 3 here.
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

/// Sum of the file lengths under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            dir_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

// ---- the phases ----

/// Sequential turns from one client, each on a new conversation: issue 27's table's shapes.
#[derive(Debug, Clone, serde::Serialize)]
struct Sequential {
    /// Spawn → `/readyz` 200, plus the first `wait: true` plain turn's round trip.
    first_turn_ms: f64,
    /// Spawn → `/readyz` 200 alone.
    ready_ms: f64,
    /// With `/readyz` 200, before any turn.
    idle: Mem,
    after_first_turn: Mem,
    /// After the K plain turns (its `hwm` is the peak so far).
    after_plain: Mem,
    plain: SequentialTurns,
    tool: SequentialTurns,
}

/// K sequential `wait: true` turns of one kind.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct SequentialTurns {
    p50_ms: f64,
    /// Antler's CPU over the K turns and their delivery receipts, ÷ K.
    cpu_us_per_turn: f64,
    model_calls_per_turn: f64,
}

/// Posts one `wait: true` message on `conversation`; returns the reply and the round trip.
async fn wait_turn(client: &reqwest::Client, url: &str, conversation: &str) -> (String, Duration) {
    let started = Instant::now();
    let answer: Value = client
        .post(url)
        .json(
            &json!({"conversation": conversation, "user": "bench", "text": "hello", "wait": true}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let took = started.elapsed();
    let reply = answer["reply"]
        .as_str()
        .unwrap_or_else(|| panic!("no reply: {answer}"));
    (reply.to_owned(), took)
}

/// K sequential turns on antler, each on a new conversation named `{prefix}{i}`, whose replies
/// must start with `reply`; the delivery receipts are drained before the CPU is read.
async fn sequential_turns(
    a: &Args,
    client: &reqwest::Client,
    antler: &Antler,
    model: &MockModel,
    prefix: &str,
    reply: &str,
) -> SequentialTurns {
    let url = format!("{}/api/v1/messages", antler.url);
    let k = a.sequential;
    let (calls0, cpu0) = (model.count(), antler.cpu_secs());
    let mut latencies = Vec::with_capacity(k);
    for i in 0..k {
        let (answer, took) = wait_turn(client, &url, &format!("{prefix}{i}")).await;
        assert!(answer.starts_with(reply), "turn {i}: {answer}");
        latencies.push(took.as_secs_f64() * 1e3);
    }
    antler.drain(client, true, a.timeout).await;
    SequentialTurns {
        p50_ms: median(latencies),
        cpu_us_per_turn: (antler.cpu_secs() - cpu0) * 1e6 / k as f64,
        model_calls_per_turn: (model.count() - calls0) as f64 / k as f64,
    }
}

/// The first answered turn and the RSS around it, then K plain turns on that antler and K tool
/// turns on a second one against a `current_time`-calling mock.
async fn sequential(a: &Args, r: usize, client: &reqwest::Client, model: &MockModel) -> Sequential {
    let (antler, ready) =
        start_antler(&model.base_url(), 1000, Duration::from_secs(30), None).await;
    let idle = antler.mem();
    eprintln!("  sequential (plain): antler pid {}", antler.pid());
    let url = format!("{}/api/v1/messages", antler.url);
    let (answer, took) = wait_turn(client, &url, &format!("s{r}-first")).await;
    assert_eq!(answer, "echo: hello");
    let first_turn_ms = (ready + took).as_secs_f64() * 1e3;
    let ready_ms = ready.as_secs_f64() * 1e3;
    let after_first_turn = antler.mem();
    let plain =
        sequential_turns(a, client, &antler, model, &format!("s{r}-p"), "echo: hello").await;
    let after_plain = antler.mem();
    antler.stop();

    let tool_model = MockModel::start_unrecorded(Behaviour::ToolThenAnswer).await;
    let (antler, _) =
        start_antler(&tool_model.base_url(), 1000, Duration::from_secs(30), None).await;
    eprintln!("  sequential (tool): antler pid {}", antler.pid());
    let url = format!("{}/api/v1/messages", antler.url);
    // Warm-up: the plain turns above come after a first turn too.
    let (answer, _) = wait_turn(client, &url, &format!("s{r}-warm")).await;
    assert!(answer.starts_with("The time is "), "{answer}");
    let tool = sequential_turns(
        a,
        client,
        &antler,
        &tool_model,
        &format!("s{r}-t"),
        "The time is ",
    )
    .await;
    antler.stop();
    Sequential {
        first_turn_ms,
        ready_ms,
        idle,
        after_first_turn,
        after_plain,
        plain,
        tool,
    }
}

/// Acknowledgements with the model held, then the drain.
#[derive(Debug, Clone, serde::Serialize)]
struct Acks {
    acks_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    syncs_per_ack: f64,
    cpu_us_per_ack: f64,
    /// CPU of this process (load generator + held mock) per ack.
    bench_cpu_us_per_ack: f64,
    /// Turns per second while the backlog of N drained (no HTTP client waiting).
    drain_turns_per_s: f64,
}

async fn acks(a: &Args, r: usize, client: &reqwest::Client, model: &MockModel) -> Acks {
    let n = a.messages;
    let (antler, _) =
        start_antler(&model.base_url(), n + 1000, Duration::from_secs(30), None).await;
    eprintln!("  acks: antler pid {}", antler.pid());
    let url = format!("{}/api/v1/messages", antler.url);
    model.hold();
    let (flushes0, cpu0, own0) = (
        antler.flushes(client).await,
        antler.cpu_secs(),
        cpu_secs("self"),
    );
    let body = move |i: usize| {
        json!({"conversation": format!("a{i}"), "user": "bench", "text": format!("hello {i}"),
               "message_id": format!("r{r}-a{i}")})
    };
    let l = load(
        client,
        &url,
        n,
        a.concurrency,
        a.timeout,
        202,
        body,
        |_, v| v["duplicate"] == false,
    )
    .await;
    let (cpu, own) = (antler.cpu_secs() - cpu0, cpu_secs("self") - own0);
    let syncs = antler.flushes(client).await - flushes0;
    model.release();
    let drained = antler.drain(client, true, a.timeout).await;
    antler.stop();
    Acks {
        acks_per_s: l.rate(),
        p50_ms: l.pct(0.50),
        p99_ms: l.pct(0.99),
        syncs_per_ack: syncs / n as f64,
        cpu_us_per_ack: cpu * 1e6 / n as f64,
        bench_cpu_us_per_ack: own * 1e6 / n as f64,
        drain_turns_per_s: n as f64 / drained.as_secs_f64(),
    }
}

/// Turns end to end (`wait: true`), then the memory at T threads.
#[derive(Debug, Clone, serde::Serialize)]
struct Turns {
    turns_per_s: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    cpu_us_per_turn: f64,
    /// CPU of this process (load generator + mock model) per turn.
    bench_cpu_us_per_turn: f64,
    model_calls_per_turn: f64,
    syncs_per_turn: f64,
    mem: Mem,
}

async fn turns(a: &Args, r: usize, client: &reqwest::Client, model: &MockModel) -> Turns {
    let (n, t) = (a.messages, a.threads);
    let (antler, _) =
        start_antler(&model.base_url(), n + 1000, Duration::from_secs(30), None).await;
    eprintln!("  turns: antler pid {}", antler.pid());
    let url = format!("{}/api/v1/messages", antler.url);
    let (calls0, flushes0, cpu0, own0) = (
        model.count(),
        antler.flushes(client).await,
        antler.cpu_secs(),
        cpu_secs("self"),
    );
    let body = move |i: usize| {
        json!({"conversation": format!("c{}", i % t), "user": "bench", "text": format!("hello {i}"),
               "message_id": format!("r{r}-m{i}"), "wait": true})
    };
    let l = load(
        client,
        &url,
        n,
        a.concurrency,
        a.timeout,
        200,
        body,
        |i, v| v["reply"] == format!("echo: hello {i}"),
    )
    .await;
    let (cpu, own) = (antler.cpu_secs() - cpu0, cpu_secs("self") - own0);
    let mem = antler.mem();
    let syncs = antler.flushes(client).await - flushes0;
    let calls = model.count() - calls0;
    antler.stop();
    Turns {
        turns_per_s: l.rate(),
        p50_ms: l.pct(0.50),
        p90_ms: l.pct(0.90),
        p99_ms: l.pct(0.99),
        cpu_us_per_turn: cpu * 1e6 / n as f64,
        bench_cpu_us_per_turn: own * 1e6 / n as f64,
        model_calls_per_turn: calls as f64 / n as f64,
        syncs_per_turn: syncs / n as f64,
        mem,
    }
}

/// Q messages queued across Q conversations, before and after the drain.
#[derive(Debug, Clone, serde::Serialize)]
struct Queued {
    /// Acks per second while posting with concurrency QC.
    post_acks_per_s: f64,
    /// With the first [`WAITING`] queued (when Q is at least that): issue 27's "conversations
    /// waiting".
    waiting: Option<Mem>,
    before: Mem,
    after: Mem,
    drain_s: f64,
    store_mib: f64,
}

/// Conversations with a message queued at which issue 27 sets an RSS target (≤ 40 MB).
const WAITING: usize = 15_000;

async fn queued(a: &Args, r: usize, client: &reqwest::Client, model: &MockModel) -> Queued {
    let q = a.queued;
    let (antler, _) =
        start_antler(&model.base_url(), q + 1000, Duration::from_secs(30), None).await;
    eprintln!("  queued: antler pid {}", antler.pid());
    let url = format!("{}/api/v1/messages", antler.url);
    model.hold();
    // Posted in two parts when Q is larger than WAITING, RSS read after the first.
    let first = q.min(WAITING);
    let mut wall = Duration::ZERO;
    let mut waiting = None;
    for (from, count) in [(0, first), (first, q - first)] {
        if count == 0 {
            continue;
        }
        let body = move |i: usize| {
            let i = from + i;
            json!({"conversation": format!("q{i}"), "user": "bench", "text": format!("hello {i}"),
                   "message_id": format!("r{r}-q{i}")})
        };
        let l = load(
            client,
            &url,
            count,
            a.queued_concurrency,
            a.timeout,
            202,
            body,
            |_, v| v["duplicate"] == false,
        )
        .await;
        wall += l.wall;
        if from == 0 && count == WAITING {
            waiting = Some(antler.mem());
        }
    }
    let before = antler.mem();
    let started = Instant::now();
    model.release();
    antler.drain(client, true, a.timeout).await;
    let drain_s = started.elapsed().as_secs_f64();
    let after = antler.mem();
    let store_mib = dir_bytes(&antler.store_path()) as f64 / 1_048_576.0;
    antler.stop();
    Queued {
        post_acks_per_s: q as f64 / wall.as_secs_f64(),
        waiting,
        before,
        after,
        drain_s,
        store_mib,
    }
}

/// L sequential turns on one thread: what the store gains per turn.
#[derive(Debug, Clone, serde::Serialize)]
struct Growth {
    /// `store_bytes` of `/readyz` (sled's log file length plus blobs) before turn 1 and after
    /// each turn.
    store_bytes: Vec<u64>,
    /// Bytes antler caused to be written to storage, from the same points on.
    write_bytes: Vec<u64>,
    /// Sum of the file lengths in the store directory after the last turn.
    dir_bytes: u64,
}

/// Growth per turn over turns 1–5 and over the last five turns.
#[derive(Debug, Clone, Copy)]
struct Windows {
    early_mean: f64,
    late_mean: f64,
    /// The smallest growth of one turn in the window: the turn's own records, appended, with
    /// no page of the tree rewritten whole.
    early_min: f64,
    late_min: f64,
}

impl Windows {
    /// From values taken before turn 1 and after each turn.
    fn of(v: &[u64]) -> Self {
        let l = v.len() - 1;
        let deltas: Vec<f64> = v.windows(2).map(|w| w[1] as f64 - w[0] as f64).collect();
        let mean = |d: &[f64]| d.iter().sum::<f64>() / d.len() as f64;
        let min = |d: &[f64]| d.iter().copied().fold(f64::INFINITY, f64::min);
        Self {
            early_mean: mean(&deltas[..5]),
            late_mean: mean(&deltas[l - 5..]),
            early_min: min(&deltas[..5]),
            late_min: min(&deltas[l - 5..]),
        }
    }
}

async fn growth(a: &Args, r: usize, client: &reqwest::Client, model: &MockModel) -> Growth {
    let (antler, _) = start_antler(&model.base_url(), 1000, Duration::from_secs(30), None).await;
    eprintln!("  growth: antler pid {}", antler.pid());
    let url = format!("{}/api/v1/messages", antler.url);
    let mut store_bytes = Vec::new();
    let mut write_bytes = Vec::new();
    for turn in 0..=a.thread_turns {
        if turn > 0 {
            let answer: Value = client
                .post(&url)
                .json(&json!({"conversation": "long", "user": "bench", "text": format!("hello {turn}"),
                              "message_id": format!("r{r}-l{turn}"), "wait": true}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(answer["reply"], format!("echo: hello {turn}"), "{answer}");
        }
        // The delivery receipt is written after the waiting client has its answer.
        antler.drain(client, true, a.timeout).await;
        let ready = antler.readyz(client).await;
        store_bytes.push(ready["store_bytes"].as_u64().unwrap());
        write_bytes.push(antler.storage_write_bytes());
    }
    let dir_bytes = dir_bytes(&antler.store_path());
    antler.stop();
    Growth {
        store_bytes,
        write_bytes,
        dir_bytes,
    }
}

/// Long-term memory's cost: L sequential turns of one user, each on a new thread, with
/// memory off and on (debounce 0; each turn's updater call is awaited before the next turn,
/// so the document grows by one fact a turn and each chat request carries it).
#[derive(Debug, Clone, serde::Serialize)]
struct Memory {
    off_p50_ms: f64,
    on_p50_ms: f64,
    off_cpu_us_per_turn: f64,
    /// Turn, queueing and the updater call's handling, per turn.
    on_cpu_us_per_turn: f64,
    /// Model requests per turn with memory on (chat + updater).
    requests_per_turn: f64,
    /// o200k tokens of the updater prompt (system + user), median and last.
    updater_prompt_tokens_p50: f64,
    updater_prompt_tokens_last: f64,
    /// o200k tokens of the `<memory>` block in the last turn's chat request.
    injected_tokens_last: f64,
    /// From a turn's answer to the updater call reaching the model (debounce 0 + polling).
    updater_delay_p50_ms: f64,
}

async fn memory_phase(a: &Args, client: &reqwest::Client) -> Memory {
    let model = MockModel::start(Behaviour::Memory {
        trigger: "likes".to_owned(),
        fact: "The user likes topic number {n} of the benchmark".to_owned(),
    })
    .await;
    let bpe = tiktoken_rs::o200k_base().unwrap();
    let tokens = |text: &str| bpe.encode_ordinary(text).len() as f64;
    let mut off_latencies = Vec::new();
    let mut on_latencies = Vec::new();
    let mut cpu = [0.0; 2];
    let mut delays = Vec::new();
    for (mode, memory) in [(0, ""), (1, "debounce_seconds = 0")] {
        let (antler, _) = start_antler_with(
            &model.base_url(),
            1000,
            Duration::from_secs(30),
            None,
            memory,
            "",
        )
        .await;
        eprintln!(
            "  memory {}: antler pid {}",
            ["off", "on"][mode],
            antler.pid()
        );
        let url = format!("{}/api/v1/messages", antler.url);
        let cpu_before = antler.cpu_secs();
        for turn in 0..a.thread_turns {
            let text = format!("I likes topic{turn} a lot");
            let started = Instant::now();
            let answer: Value = client
                .post(&url)
                .json(
                    &json!({"conversation": format!("mem{mode}-{turn}"), "user": "ada",
                              "text": text, "wait": true}),
                )
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let answered = Instant::now();
            assert!(
                answer["reply"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("echo: "),
                "{answer}"
            );
            if mode == 0 {
                off_latencies.push(answered - started);
                continue;
            }
            on_latencies.push(answered - started);
            let deadline = Instant::now() + a.timeout;
            loop {
                let at = model
                    .requests()
                    .into_iter()
                    .find(|r| is_updater(r) && r.last_user_text().contains(&text))
                    .map(|r| r.at);
                if let Some(at) = at {
                    delays.push(at.saturating_duration_since(answered).as_secs_f64() * 1e3);
                    break;
                }
                assert!(Instant::now() < deadline, "no updater call for turn {turn}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // The last updater answer is stored before the antler stops (its shutdown flushes).
        cpu[mode] = (antler.cpu_secs() - cpu_before) * 1e6 / a.thread_turns as f64;
        antler.stop();
    }
    let requests = model.requests();
    // Both antlers made one chat request a turn; the rest are the updater's.
    let on_requests = requests.len() - a.thread_turns;
    let prompt_tokens = |r: &mock_model::Recorded| {
        r.messages()
            .iter()
            .map(|m| tokens(m["content"].as_str().unwrap_or_default()))
            .sum::<f64>()
    };
    let updater: Vec<f64> = requests
        .iter()
        .filter(|r| is_updater(r))
        .map(prompt_tokens)
        .collect();
    let last_chat = requests
        .iter()
        .rev()
        .find(|r| {
            !is_updater(r)
                && r.last_user_text()
                    .contains(&format!("topic{} ", a.thread_turns - 1))
        })
        .unwrap();
    let system = last_chat.messages()[0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let block = system
        .find("<memory>")
        .map(|at| &system[at..])
        .unwrap_or_default();
    let latency_ms = |v: &[Duration]| median(v.iter().map(|d| d.as_secs_f64() * 1e3).collect());
    Memory {
        off_p50_ms: latency_ms(&off_latencies),
        on_p50_ms: latency_ms(&on_latencies),
        off_cpu_us_per_turn: cpu[0],
        on_cpu_us_per_turn: cpu[1],
        requests_per_turn: on_requests as f64 / a.thread_turns as f64,
        updater_prompt_tokens_p50: median(updater.clone()),
        updater_prompt_tokens_last: updater.last().copied().unwrap_or(f64::NAN),
        injected_tokens_last: tokens(block),
        updater_delay_p50_ms: median(delays),
    }
}

/// The shell's sandbox: turns that run `bash -c true` under each backend.
#[derive(Debug, Clone, serde::Serialize)]
struct SandboxCost {
    /// Backend name, p50 turn latency in ms, or `None` when it is not available here.
    backends: Vec<(String, Option<f64>)>,
}

/// L turns that each run one `bash -c true` call, under `none`, `landlock` and `bwrap` in
/// turn (one antler each); what differs between them is the sandbox's start and teardown.
async fn sandbox_phase(a: &Args, client: &reqwest::Client) -> SandboxCost {
    let model = MockModel::start(Behaviour::TurnScript(vec![(
        "bash".to_owned(),
        json!({"command": "true"}).to_string(),
    )]))
    .await;
    let mut backends = Vec::new();
    for backend in ["none", "landlock", "bwrap"] {
        // Anyone may run the shell here: the phase measures the sandbox, not the guardrail.
        let extra = format!(
            "\n[agent.tools.bash]\nsandbox = \"{backend}\"\n\n\
             [agent.middleware.guardrail]\nadmin_only = []\n"
        );
        let (antler, _) = start_antler_with(
            &model.base_url(),
            1000,
            Duration::from_secs(30),
            None,
            "",
            &extra,
        )
        .await;
        let ready: Value = client
            .get(format!("{}/readyz", antler.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if ready["shell"]["offered"] != json!(true) {
            eprintln!(
                "  sandbox: {backend} is not available here: {}",
                ready["shell"]["detail"]
            );
            backends.push((backend.to_owned(), None));
            antler.stop();
            continue;
        }
        let url = format!("{}/api/v1/messages", antler.url);
        let mut latencies = Vec::new();
        // One warm-up turn: the first command also warms the page cache.
        for turn in 0..=a.thread_turns {
            let started = Instant::now();
            let answer: Value = client
                .post(&url)
                .json(
                    &json!({"conversation": format!("sh-{turn}"), "text": "run it", "wait": true}),
                )
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let reply = answer["reply"].as_str().unwrap_or_default();
            assert!(reply.contains("[exit code 0]"), "{backend}: {answer}");
            if turn > 0 {
                latencies.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
        antler.stop();
        backends.push((backend.to_owned(), Some(median(latencies))));
    }
    SandboxCost { backends }
}

/// Delegation: turns answered directly against turns that delegate three tasks.
#[derive(Debug, Clone, serde::Serialize)]
struct Subagents {
    direct_p50_ms: f64,
    delegated_p50_ms: f64,
    direct_cpu_us_per_turn: f64,
    delegated_cpu_us_per_turn: f64,
    /// Model requests per delegated turn (lead, three subagents, lead).
    requests_per_turn: f64,
}

/// L turns answered directly, then L turns whose lead delegates three tasks in one response
/// (they run at once), on one antler; the mock answers at once, so what differs is antler's
/// work: three records created and moved to their end (each a synced write), three subagent
/// runs, the checkpoint before the calls, and two more lead requests' worth of tool results.
async fn subagents_phase(a: &Args, client: &reqwest::Client) -> Subagents {
    let model = MockModel::start(Behaviour::Echo).await;
    let (antler, _) = start_antler_with(
        &model.base_url(),
        1000,
        Duration::from_secs(30),
        None,
        "",
        "",
    )
    .await;
    eprintln!("  subagents: antler pid {}", antler.pid());
    let url = format!("{}/api/v1/messages", antler.url);
    let mut latencies = [Vec::new(), Vec::new()];
    let mut cpu = [0.0; 2];
    for mode in 0..2 {
        if mode == 1 {
            model.set_behaviour(Behaviour::Delegate(
                ["alpha", "beta", "gamma"].map(str::to_owned).to_vec(),
            ));
        }
        let before = model.requests().len();
        let cpu_before = antler.cpu_secs();
        for turn in 0..a.thread_turns {
            let started = Instant::now();
            let answer: Value = client
                .post(&url)
                .json(
                    &json!({"conversation": format!("sub{mode}-{turn}"), "user": "ada",
                              "text": "look into three things", "wait": true}),
                )
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            latencies[mode].push(started.elapsed().as_secs_f64() * 1e3);
            let reply = answer["reply"].as_str().unwrap_or_default();
            let expected = if mode == 0 {
                "echo: "
            } else {
                "summary: Task succeeded"
            };
            assert!(reply.starts_with(expected), "{answer}");
        }
        cpu[mode] = (antler.cpu_secs() - cpu_before) * 1e6 / a.thread_turns as f64;
        if mode == 1 {
            let requests = model.requests().len() - before;
            antler.stop();
            return Subagents {
                direct_p50_ms: median(latencies[0].clone()),
                delegated_p50_ms: median(latencies[1].clone()),
                direct_cpu_us_per_turn: cpu[0],
                delegated_cpu_us_per_turn: cpu[1],
                requests_per_turn: requests as f64 / a.thread_turns as f64,
            };
        }
    }
    unreachable!("the loop returns in its second round")
}

fn is_updater(request: &mock_model::Recorded) -> bool {
    request
        .messages()
        .first()
        .and_then(|m| m["content"].as_str())
        .is_some_and(|s| s.starts_with(mock_model::MEMORY_PROMPT))
}

/// Telegram end to end: signed webhooks in, answers out through the mock Bot API.
#[derive(Debug, Clone, serde::Serialize)]
struct Telegram {
    /// Webhooks acknowledged (200, durable) per second while the model was held.
    acks_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us_per_ack: f64,
    /// Answered turns per second from the model's release to the N-th `SendMessage`.
    drain_turns_per_s: f64,
    /// Answered turns per second with the model free: first webhook to the N-th `SendMessage`.
    turns_per_s: f64,
    /// Webhook ack latency while turns ran beside it.
    load_p50_ms: f64,
    load_p99_ms: f64,
    /// CPU of antler per answered turn under load (webhook, turn and delivery).
    cpu_us_per_turn: f64,
    /// Bot API calls of the first (held) and the second (under load) antler.
    calls_held: BotCalls,
    calls_load: BotCalls,
}

/// A private text message from chat `chat` as Telegram posts it.
fn tg_update(update_id: usize, chat: usize, i: usize) -> Value {
    json!({"update_id": update_id, "message": {
        "message_id": i + 1, "date": 1_700_000_000,
        "chat": {"id": chat, "type": "private", "first_name": "U"},
        "from": {"id": chat, "is_bot": false, "first_name": "U"},
        "text": format!("hello {i}")}})
}

async fn telegram(
    a: &Args,
    client: &reqwest::Client,
    tg_client: &reqwest::Client,
    model: &MockModel,
    bot: &BotApi,
    bot_url: &str,
) -> Telegram {
    let (n, t) = (a.messages, a.threads);

    // (a) Webhook acks with the model held, then the drain.
    // From before the start: antler's GetMe counts too.
    let calls0 = bot.counts();
    let (antler, _) = start_antler(
        &model.base_url(),
        n + 1000,
        Duration::from_secs(30),
        Some(bot_url),
    )
    .await;
    eprintln!("  telegram (held): antler pid {}", antler.pid());
    let url = format!("{}/webhooks/telegram", antler.url);
    model.hold();
    let cpu0 = antler.cpu_secs();
    // One chat per message, as in the acks phase.
    let body = |i: usize| tg_update(1_000_000 + i, 100_000_000 + i, i);
    let held = load(
        tg_client,
        &url,
        n,
        a.concurrency,
        a.timeout,
        200,
        body,
        |_, v| v.is_null(),
    )
    .await;
    let cpu = antler.cpu_secs() - cpu0;
    let released = Instant::now();
    model.release();
    bot.wait_sent(calls0.send_message + n, &antler, a.timeout)
        .await;
    let drained = released.elapsed();
    antler.drain(client, true, a.timeout).await;
    let calls_held = bot.counts().since(calls0);
    antler.report_log_problems("telegram (held)");
    antler.stop();
    assert_eq!(
        calls_held.send_message, n,
        "each webhook is answered once: {calls_held:?}"
    );

    // (b) Answered turns under load: a fresh antler, the model free, T chats.
    // From before the start: antler's GetMe counts too.
    let calls0 = bot.counts();
    let (antler, _) = start_antler(
        &model.base_url(),
        n + 1000,
        Duration::from_secs(30),
        Some(bot_url),
    )
    .await;
    eprintln!("  telegram (load): antler pid {}", antler.pid());
    let url = format!("{}/webhooks/telegram", antler.url);
    let cpu0 = antler.cpu_secs();
    let body = move |i: usize| tg_update(2_000_000 + i, 200_000_000 + i % t, i);
    let started = Instant::now();
    let under_load = load(
        tg_client,
        &url,
        n,
        a.concurrency,
        a.timeout,
        200,
        body,
        |_, v| v.is_null(),
    )
    .await;
    bot.wait_sent(calls0.send_message + n, &antler, a.timeout)
        .await;
    let answered = started.elapsed();
    let cpu_load = antler.cpu_secs() - cpu0;
    antler.drain(client, true, a.timeout).await;
    let calls_load = bot.counts().since(calls0);
    antler.report_log_problems("telegram (load)");
    antler.stop();
    assert_eq!(
        calls_load.send_message, n,
        "each webhook is answered once: {calls_load:?}"
    );

    Telegram {
        acks_per_s: held.rate(),
        p50_ms: held.pct(0.50),
        p99_ms: held.pct(0.99),
        cpu_us_per_ack: cpu * 1e6 / n as f64,
        drain_turns_per_s: n as f64 / drained.as_secs_f64(),
        turns_per_s: n as f64 / answered.as_secs_f64(),
        load_p50_ms: under_load.pct(0.50),
        load_p99_ms: under_load.pct(0.99),
        cpu_us_per_turn: cpu_load * 1e6 / n as f64,
        calls_held,
        calls_load,
    }
}

// ---- PostgreSQL: replicas on one database ----

/// The server the PostgreSQL phases use (`ANTLER_BENCH_DATABASE_URL`), if any.
fn bench_database() -> Option<String> {
    std::env::var("ANTLER_BENCH_DATABASE_URL")
        .ok()
        .map(|url| url.trim().to_owned())
        .filter(|url| !url.is_empty())
}

/// A schema of its own on the bench's server (the tests' `Schema`, tests/e2e/postgres.rs).
struct Schema {
    server: String,
    name: String,
}

impl Schema {
    async fn create(server: &str) -> Self {
        let name = format!("bench_{}", uuid::Uuid::now_v7().simple());
        run_sql(server, &format!("CREATE SCHEMA {name}")).await;
        Self {
            server: server.to_owned(),
            name,
        }
    }

    /// The server's URL with this schema first on the `search_path`.
    fn url(&self) -> String {
        let join = if self.server.contains('?') { '&' } else { '?' };
        format!("{}{join}options=-csearch_path%3D{}", self.server, self.name)
    }

    async fn drop(self) {
        run_sql(
            &self.server,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        )
        .await;
    }
}

async fn run_sql(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to ANTLER_BENCH_DATABASE_URL: {e}"));
    let connection = tokio::spawn(connection);
    client.batch_execute(sql).await.expect(sql);
    drop(client);
    let _ = connection.await;
}

/// User + system CPU seconds of the local PostgreSQL's processes (`comm` = postgres), so far;
/// 0 when the server runs elsewhere. Other clients of the server count too.
fn postgres_cpu_secs() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut total = 0.0;
    for entry in entries.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if comm.trim() != "postgres" {
            continue;
        }
        // The process may be gone by now.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        total += (tick(11) + tick(12)) / 100.0;
    }
    total
}

/// R replicas of antler on one fresh schema, sharing one `[store] path`.
struct PgSet {
    schema: Schema,
    folder: tempfile::TempDir,
    replicas: Vec<Antler>,
}

impl PgSet {
    /// Starts `count` replicas one after the other (the first applies the migrations).
    async fn start(
        server: &str,
        model: &MockModel,
        count: usize,
        backlog: usize,
        label: &str,
    ) -> Self {
        let schema = Schema::create(server).await;
        let folder = tempfile::tempdir().unwrap();
        let url = schema.url();
        let mut replicas = Vec::with_capacity(count);
        for i in 0..count {
            let replica = PgReplica {
                url: &url,
                folder: folder.path(),
                name: format!("{label}-{i}"),
            };
            let (antler, _) = spawn_antler(
                &model.base_url(),
                backlog,
                Duration::from_secs(60),
                None,
                "",
                "",
                Some(&replica),
            )
            .await;
            eprintln!("  {label}: replica {i}, antler pid {}", antler.pid());
            replicas.push(antler);
        }
        Self {
            schema,
            folder,
            replicas,
        }
    }

    fn urls(&self, path: &str) -> Vec<String> {
        self.replicas
            .iter()
            .map(|r| format!("{}{path}", r.url))
            .collect()
    }

    fn cpu_secs(&self) -> f64 {
        self.replicas.iter().map(Antler::cpu_secs).sum()
    }

    /// Waits until every replica that reports the store (`/readyz` with `inbox`: the serving
    /// ones) shows an empty inbox and outbox, and at least one does; returns when that was.
    async fn drain(&self, client: &reqwest::Client, timeout: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let mut seen = Vec::new();
            for replica in &self.replicas {
                let ready = replica.readyz(client).await;
                if !ready["inbox"].is_null() {
                    seen.push(ready);
                }
            }
            if !seen.is_empty()
                && seen
                    .iter()
                    .all(|r| r["inbox"] == 0 && r["outbox_pending"] == 0)
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < timeout,
                "the replicas did not drain within {timeout:?}: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the replicas (the last started first), prints their logs' problems and drops the
    /// schema.
    async fn stop(self, label: &str) {
        let Self {
            schema,
            folder,
            mut replicas,
        } = self;
        while let Some(replica) = replicas.pop() {
            replica.report_log_problems(&format!("{label} replica {}", replicas.len()));
            replica.stop();
        }
        drop(folder);
        schema.drop().await;
    }
}

/// A load phase on PostgreSQL with one or more replicas.
#[derive(Debug, Clone, serde::Serialize)]
struct PgLoad {
    replicas: usize,
    per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU of all replicas per message.
    cpu_us: f64,
    /// CPU of the local PostgreSQL's processes per message.
    pg_cpu_us: f64,
    /// 503s retried on another replica.
    retried_503: usize,
    /// `pg-acks`: turns per second while the backlog drained after the release.
    drain_turns_per_s: Option<f64>,
}

impl PgLoad {
    /// The figures of load `l` of `n` messages on `replicas`, which spent `cpu` seconds (and
    /// PostgreSQL `pg`).
    fn of(replicas: usize, l: &Load, cpu: f64, pg: f64, n: usize) -> Self {
        Self {
            replicas,
            per_s: l.rate(),
            p50_ms: l.pct(0.50),
            p99_ms: l.pct(0.99),
            cpu_us: cpu * 1e6 / n as f64,
            pg_cpu_us: pg * 1e6 / n as f64,
            retried_503: l.retried,
            drain_turns_per_s: None,
        }
    }
}

/// The `acks` phase on `count` replicas of one database.
async fn pg_acks(
    a: &Args,
    r: usize,
    client: &reqwest::Client,
    model: &MockModel,
    server: &str,
    count: usize,
) -> PgLoad {
    let n = a.messages;
    let label = format!("pg-acks x{count}");
    let set = PgSet::start(server, model, count, n + 1000, &label).await;
    model.hold();
    let (cpu0, pg0) = (set.cpu_secs(), postgres_cpu_secs());
    let body = move |i: usize| {
        json!({"conversation": format!("a{i}"), "user": "bench", "text": format!("hello {i}"),
               "message_id": format!("r{r}-a{i}")})
    };
    let l = load_on(
        client,
        &set.urls("/api/v1/messages"),
        n,
        a.concurrency,
        a.timeout,
        202,
        body,
        |_, v| v["duplicate"] == false,
    )
    .await;
    let (cpu, pg) = (set.cpu_secs() - cpu0, postgres_cpu_secs() - pg0);
    model.release();
    let drained = set.drain(client, a.timeout).await;
    set.stop(&label).await;
    PgLoad {
        drain_turns_per_s: Some(n as f64 / drained.as_secs_f64()),
        ..PgLoad::of(count, &l, cpu, pg, n)
    }
}

/// The `turns` phase on `count` replicas of one database.
async fn pg_turns(
    a: &Args,
    r: usize,
    client: &reqwest::Client,
    model: &MockModel,
    server: &str,
    count: usize,
) -> PgLoad {
    let (n, t) = (a.messages, a.threads);
    let label = format!("pg-turns x{count}");
    let set = PgSet::start(server, model, count, n + 1000, &label).await;
    let (cpu0, pg0) = (set.cpu_secs(), postgres_cpu_secs());
    let body = move |i: usize| {
        json!({"conversation": format!("c{}", i % t), "user": "bench", "text": format!("hello {i}"),
               "message_id": format!("r{r}-m{i}"), "wait": true})
    };
    let l = load_on(
        client,
        &set.urls("/api/v1/messages"),
        n,
        a.concurrency,
        a.timeout,
        200,
        body,
        |i, v| v["reply"] == format!("echo: hello {i}"),
    )
    .await;
    let (cpu, pg) = (set.cpu_secs() - cpu0, postgres_cpu_secs() - pg0);
    set.drain(client, a.timeout).await;
    set.stop(&label).await;
    PgLoad::of(count, &l, cpu, pg, n)
}

/// The PostgreSQL load figures of one run: 1 and 2 replicas.
#[derive(Debug, Clone, serde::Serialize)]
struct PgPair {
    one: PgLoad,
    two: PgLoad,
}

/// Kills of the replica holding a chat, and the time until the survivor answered.
#[derive(Debug, Clone, serde::Serialize)]
struct Takeover {
    /// SIGKILL → the chat's next answer at the mock Bot API, per kill.
    ms: Vec<f64>,
    /// 503s retried: the first message of each round (on the other replica) and the next
    /// message (on the survivor, until it took it).
    retried_503: usize,
    /// Which replica slot answered each round's first message (and was killed).
    killed: Vec<usize>,
    /// First answers sent again after the kill (at-least-once delivery's window).
    repeated_answers: usize,
    /// Model calls over the phase (two messages per round: 2 × KT when no turn ran twice).
    model_calls: usize,
}

/// Posts a Telegram update to `urls[first]`, moving on to the next replica after a 503 or a
/// refused connection, as a platform retries (every 20 ms once each replica has refused);
/// returns the replica that took it (200) and the 503s met.
async fn post_until_taken(
    tg_client: &reqwest::Client,
    urls: &[String],
    first: usize,
    update: &Value,
    deadline: Duration,
) -> (usize, usize) {
    let started = Instant::now();
    let (mut at, mut refused) = (first, 0);
    loop {
        match tg_client.post(&urls[at]).json(update).send().await {
            Ok(r) if r.status() == 200 => return (at, refused),
            Ok(r) if r.status() == 503 => refused += 1,
            Ok(r) => {
                let status = r.status();
                panic!("{}: {status} {}", urls[at], r.text().await.unwrap())
            }
            Err(e) if e.is_connect() => {}
            Err(e) => panic!("{}: {e}", urls[at]),
        }
        assert!(
            started.elapsed() < deadline,
            "no replica took the update within {deadline:?}"
        );
        at = (at + 1) % urls.len();
        if at == first {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The answers the mock Bot APIs have sent to `chat`, in order of arrival.
fn answers(bots: &[(Arc<BotApi>, String)], chat: i64) -> Vec<(Instant, String, usize)> {
    let mut all: Vec<(Instant, String, usize)> = bots
        .iter()
        .enumerate()
        .flat_map(|(slot, (bot, _))| {
            bot.sent_to(chat)
                .into_iter()
                .map(move |(at, text)| (at, text, slot))
        })
        .collect();
    all.sort_by_key(|(at, _, _)| *at);
    all
}

/// Waits until an answer to `chat` holds `text`; returns it (arrival, text, slot).
async fn wait_answer(
    bots: &[(Arc<BotApi>, String)],
    chat: i64,
    text: &str,
    deadline: Duration,
) -> (Instant, String, usize) {
    let started = Instant::now();
    loop {
        let all = answers(bots, chat);
        if let Some(found) = all.into_iter().find(|(_, t, _)| t.contains(text)) {
            return found;
        }
        assert!(
            started.elapsed() < deadline,
            "chat {chat}: no answer with {text:?} within {deadline:?}: {:?}",
            answers(bots, chat)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One replica of the `takeover` phase, answering Telegram through the mock `bot_url`.
async fn takeover_replica(
    model: &MockModel,
    url: &str,
    folder: &Path,
    bot_url: &str,
    name: String,
) -> Antler {
    let replica = PgReplica { url, folder, name };
    let (antler, _) = spawn_antler(
        &model.base_url(),
        1000,
        Duration::from_secs(60),
        Some(bot_url),
        "",
        "",
        Some(&replica),
    )
    .await;
    eprintln!(
        "  takeover: {} started, antler pid {}",
        replica.name,
        antler.pid()
    );
    antler
}

/// Two replicas on one database (`lease_secs = 3`), each with a mock Bot API of its own (so
/// that the bench sees which replica answered). K rounds: a chat's first message, posted to
/// the replicas in turn (503: the other), is answered by replica X; X is SIGKILLed; the
/// chat's next message is posted to the survivor until it takes it; the time from the kill
/// to that answer at a mock Bot API is the takeover. X is restarted before the next round.
async fn takeover(
    a: &Args,
    r: usize,
    tg_client: &reqwest::Client,
    model: &MockModel,
    server: &str,
) -> Takeover {
    let deadline = Duration::from_secs(60);
    let schema = Schema::create(server).await;
    let folder = tempfile::tempdir().unwrap();
    let url = schema.url();
    let bots = [BotApi::start().await, BotApi::start().await];
    let name = |slot: usize, k: usize| format!("takeover-r{r}-s{slot}-{k}");
    let mut slots = [
        Some(takeover_replica(model, &url, folder.path(), &bots[0].1, name(0, 0)).await),
        Some(takeover_replica(model, &url, folder.path(), &bots[1].1, name(1, 0)).await),
    ];
    let mut result = Takeover {
        ms: Vec::new(),
        retried_503: 0,
        killed: Vec::new(),
        repeated_answers: 0,
        model_calls: 0,
    };
    let calls0 = model.count();
    let mut kills = Vec::new();
    let chat_of = |k: usize| 300_000_000 + (r * 10_000 + k) as i64;
    for k in 0..a.takeovers {
        let urls: Vec<String> = slots
            .iter()
            .map(|s| format!("{}/webhooks/telegram", s.as_ref().unwrap().url))
            .collect();
        let chat = chat_of(k);
        let update = |j: usize| {
            let mut u = tg_update(3_000_000 + r * 100_000 + k * 2 + j, chat as usize, j);
            u["message"]["text"] = json!(format!("takeover {k} message {j}"));
            u
        };
        let (_, refused) = post_until_taken(tg_client, &urls, k % 2, &update(0), deadline).await;
        result.retried_503 += refused;
        let (_, _, x) =
            wait_answer(&bots, chat, &format!("takeover {k} message 0"), deadline).await;
        let survivor = 1 - x;
        let killed_at = Instant::now();
        slots[x].take().unwrap().kill();
        kills.push(killed_at);
        let (_, refused) = post_until_taken(
            tg_client,
            std::slice::from_ref(&urls[survivor]),
            0,
            &update(1),
            deadline,
        )
        .await;
        result.retried_503 += refused;
        let (answered_at, _, by) =
            wait_answer(&bots, chat, &format!("takeover {k} message 1"), deadline).await;
        assert_eq!(by, survivor, "round {k}: answered by the killed replica");
        result
            .ms
            .push((answered_at - killed_at).as_secs_f64() * 1e3);
        result.killed.push(x);
        eprintln!(
            "  takeover {}/{}: slot {x} killed, slot {survivor} answered after {:.0} ms",
            k + 1,
            a.takeovers,
            result.ms[k]
        );
        slots[x] =
            Some(takeover_replica(model, &url, folder.path(), &bots[x].1, name(x, k + 1)).await);
    }
    for (i, slot) in slots.iter_mut().enumerate().rev() {
        let antler = slot.take().unwrap();
        antler.report_log_problems(&format!("takeover slot {i}"));
        antler.stop();
    }
    // Each message is answered; a first answer sent again (the kill came between its
    // `SendMessage` and the record of its delivery) is counted, the second must be once.
    for (k, killed_at) in kills.iter().enumerate() {
        let all = answers(&bots, chat_of(k));
        let of = |j: usize| {
            all.iter()
                .filter(|(_, t, _)| t.contains(&format!("takeover {k} message {j}")))
                .count()
        };
        assert_eq!(
            of(1),
            1,
            "round {k}: the second message answered once: {all:?}"
        );
        assert!(of(0) >= 1, "round {k}: the first message answered: {all:?}");
        result.repeated_answers += of(0) - 1;
        if of(0) > 1 {
            let seen: Vec<String> = all
                .iter()
                .map(|(at, text, slot)| {
                    let ms = if at >= killed_at {
                        format!("+{:.0}", (*at - *killed_at).as_secs_f64() * 1e3)
                    } else {
                        format!("-{:.0}", (*killed_at - *at).as_secs_f64() * 1e3)
                    };
                    format!("{ms} ms from slot {slot}: {text:?}")
                })
                .collect();
            eprintln!(
                "  takeover {}: the first answer was sent again; answers relative to the kill: {seen:?}",
                k + 1
            );
        }
    }
    result.model_calls = model.count() - calls0;
    drop(folder);
    schema.drop().await;
    result
}

// ---- reporting ----

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 0 {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct Run {
    ceiling_req_per_s: f64,
    ceiling_p50_ms: f64,
    ceiling_p99_ms: f64,
    sequential: Option<Sequential>,
    acks: Option<Acks>,
    /// Acks/s ÷ this run's ceiling.
    ack_ratio: Option<f64>,
    turns: Option<Turns>,
    /// Turns/s ÷ this run's ceiling.
    turn_ratio: Option<f64>,
    queued: Option<Queued>,
    growth: Option<Growth>,
    memory: Option<Memory>,
    subagents: Option<Subagents>,
    sandbox: Option<SandboxCost>,
    telegram: Option<Telegram>,
    /// Telegram's webhook acks/s, drain turns/s and turns/s under load ÷ this run's ceiling.
    telegram_ratios: Option<TelegramRatios>,
    /// The `acks` and `turns` phases on PostgreSQL, 1 and 2 replicas.
    pg_acks: Option<PgPair>,
    pg_turns: Option<PgPair>,
    takeover: Option<Takeover>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
struct TelegramRatios {
    acks: f64,
    drain: f64,
    turns: f64,
}

/// One of issue 27's figures: its key in the JSON line's `issue27` (the unit in its name), its
/// target as the table shows it (empty: the issue sets none) and the figure at the issue's start
/// ("now" in its table, and its wrk figures), measured on the same 2-core machine.
/// The phases that measure issue 27's figures: what a baseline binary runs.
const ISSUE27_PHASES: [&str; 5] = ["sequential", "acks", "turns", "queued", "growth"];

struct Issue27 {
    key: &'static str,
    target: &'static str,
    baseline: &'static str,
}

const ISSUE27: [Issue27; 15] = [
    Issue27 {
        key: "first_turn_ms",
        target: "≤ 15 ms",
        baseline: "22 ms",
    },
    Issue27 {
        key: "rss_idle_mib",
        target: "≤ 15 MB",
        baseline: "22 MB",
    },
    Issue27 {
        key: "rss_after_first_turn_mib",
        target: "",
        baseline: "30 MB / peak 70 MB (8-thread bench)",
    },
    Issue27 {
        key: "plain_turn_p50_ms",
        target: "",
        baseline: "2.2 ms (2 model calls: answer + title)",
    },
    Issue27 {
        key: "cpu_plain_turn_ms",
        target: "≤ 0.4 ms",
        baseline: "1.27 ms",
    },
    Issue27 {
        key: "tool_turn_p50_ms",
        target: "",
        baseline: "3.7 ms",
    },
    Issue27 {
        key: "cpu_tool_turn_ms",
        target: "≤ 0.6 ms",
        baseline: "not in the issue",
    },
    Issue27 {
        key: "turns_per_s",
        target: "≥ 5,000/s",
        baseline: "1,800–2,150/s (wrk); 976/s (8 client threads)",
    },
    Issue27 {
        key: "cpu_plain_turn_under_load_ms",
        target: "≤ 0.4 ms",
        baseline: "1.27 ms (shape not stated)",
    },
    Issue27 {
        key: "rss_peak_under_load_mib",
        target: "≤ 50 MB",
        baseline: "99 MB (default 10k backlog full, wrk)",
    },
    Issue27 {
        key: "ack_ratio",
        target: "≥ 0.50",
        baseline: "0.06 (8,300 acks/s against 134,000 req/s, wrk)",
    },
    Issue27 {
        key: "rss_15000_waiting_mib",
        target: "≤ 40 MB",
        baseline: "83 MB",
    },
    Issue27 {
        key: "rss_60000_queued_mib",
        target: "≤ 60 MB",
        baseline: "111 MB (~66k queued)",
    },
    Issue27 {
        key: "stored_bytes_per_turn",
        target: "≤ 4 KB",
        baseline: "7–9 KB",
    },
    Issue27 {
        key: "stored_growth_flat",
        target: "flat in thread length",
        baseline: "not in the issue",
    },
];

/// The printed table's rows (metric, value, target, baseline) and the JSON line's `issue27`.
#[derive(Default)]
struct Table {
    rows: Vec<[String; 4]>,
    /// The issue 27 figure each row measures, if any (parallel to `rows`).
    keys: Vec<Option<String>>,
    issue27: serde_json::Map<String, Value>,
}

impl Table {
    /// A row that measures none of issue 27's figures; `target` may hold an older one.
    fn row(&mut self, metric: String, value: String, target: String) {
        self.rows.push([metric, value, target, String::new()]);
        self.keys.push(None);
    }

    /// Puts the baseline binary's figures, measured in the same runs, into the baseline
    /// column beside the issue's own: `measured` is the baseline's table.
    fn measured_baseline(&mut self, measured: &Table) {
        for (row, key) in self.rows.iter_mut().zip(&self.keys) {
            let Some(key) = key else { continue };
            let Some(index) = measured.keys.iter().position(|k| k.as_ref() == Some(key)) else {
                continue;
            };
            let issue = std::mem::take(&mut row[3]);
            row[3] = format!("{} (issue: {issue})", measured.rows[index][1]);
            if let Some(Value::Object(entry)) = self.issue27.get_mut(key.as_str()) {
                entry.insert(
                    "baseline_measured".into(),
                    measured.issue27[key.as_str()]["figure"].clone(),
                );
            }
        }
    }

    /// A row that measures issue 27's `key`: `figure` goes to the JSON line, `ok` says whether
    /// its target is met (`None`: no target, or not at this run's size).
    fn goal(&mut self, key: &str, metric: String, value: String, figure: f64, ok: Option<bool>) {
        let goal = ISSUE27
            .iter()
            .find(|g| g.key == key)
            .unwrap_or_else(|| panic!("no issue 27 figure {key}"));
        let target = match (goal.target, ok) {
            ("", _) => String::new(),
            (target, Some(ok)) => format!("{target}: {}", met(ok)),
            (target, None) => format!("{target}: n/a at this size"),
        };
        self.rows
            .push([metric, value, target, goal.baseline.to_owned()]);
        self.keys.push(Some(key.to_owned()));
        self.issue27.insert(
            key.to_owned(),
            json!({"figure": figure, "target": goal.target, "met": ok,
                   "baseline": goal.baseline}),
        );
    }
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(bench(args));
}

fn met(ok: bool) -> String {
    if ok { "met" } else { "NOT met" }.to_owned()
}

/// The median over the runs that measured `f`.
fn med<T>(runs: &[Run], part: fn(&Run) -> Option<&T>, f: impl Fn(&T) -> f64) -> f64 {
    median(runs.iter().filter_map(&part).map(f).collect())
}

#[allow(clippy::too_many_lines)]
async fn bench(a: Args) {
    let model = MockModel::start_unrecorded(Behaviour::Echo).await;
    let bare = Router::new().route("/ack", post(bare_ack));
    let bare_url = format!("{}/ack", spawn_server(bare).await);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.concurrency.max(a.queued_concurrency))
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap();
    // Telegram's webhooks: the same client settings, every request signed.
    let (bot, bot_url) = BotApi::start().await;
    let mut signed = reqwest::header::HeaderMap::new();
    signed.insert(
        "X-Telegram-Bot-Api-Secret-Token",
        reqwest::header::HeaderValue::from_static(TG_SECRET),
    );
    let tg_client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.concurrency)
        .timeout(Duration::from_secs(180))
        .default_headers(signed)
        .build()
        .unwrap();
    let (n, c, t, q, qc, l) = (
        a.messages,
        a.concurrency,
        a.threads,
        a.queued,
        a.queued_concurrency,
        a.thread_turns,
    );
    eprintln!(
        "pipeline bench: N={n} C={c} T={t} Q={q} QC={qc} L={l} R={} S={} phases={:?} binary={}",
        a.runs,
        a.startups,
        a.only,
        antler_binary()
    );
    let pg_phases: Vec<&str> = ["pg-acks", "pg-turns", "takeover"]
        .into_iter()
        .filter(|phase| a.runs(phase))
        .collect();
    if bench_database().is_none() && !pg_phases.is_empty() {
        eprintln!(
            "  skipped {pg_phases:?}: set ANTLER_BENCH_DATABASE_URL \
             (e.g. postgres://root@127.0.0.1:5432/test) to measure antler on PostgreSQL"
        );
    }
    let begun = Instant::now();

    let mut startups = Vec::new();
    if a.runs("startup") {
        for _ in 0..a.startups {
            let (antler, ready) =
                start_antler(&model.base_url(), 1000, Duration::from_secs(30), None).await;
            startups.push(ready.as_secs_f64() * 1e3);
            antler.stop();
        }
    }

    let rig = Rig {
        client: &client,
        tg_client: &tg_client,
        model: &model,
        bot: &bot,
        bot_url: &bot_url,
        bare_url: &bare_url,
    };
    let baseline = baseline_binary();
    // The baseline measures only issue 27's phases.
    let baseline_args = Args {
        only: ISSUE27_PHASES
            .iter()
            .filter(|phase| a.runs(phase))
            .map(|phase| (*phase).to_owned())
            .collect(),
        ..a.clone()
    };
    let mut runs = Vec::new();
    let mut baseline_runs = Vec::new();
    for r in 0..a.runs {
        // Interleaved, so that both binaries see the same moods of the machine.
        if let Some(path) = &baseline {
            *BASELINE_PASS.lock().unwrap() = Some(path.clone());
            eprintln!("  run {} baseline: {path}", r + 1);
            let run = measure(&baseline_args, r, &rig).await;
            *BASELINE_PASS.lock().unwrap() = None;
            eprintln!(
                "  run {} baseline ({:.0} s in): {}",
                r + 1,
                begun.elapsed().as_secs_f64(),
                serde_json::to_string(&run).unwrap()
            );
            baseline_runs.push(run);
        }
        let run = measure(&a, r, &rig).await;
        eprintln!(
            "  run {} ({:.0} s in): {}",
            r + 1,
            begun.elapsed().as_secs_f64(),
            serde_json::to_string(&run).unwrap()
        );
        runs.push(run);
    }

    let (mut table, mut report) = summarize(&a, &runs, &startups);
    if baseline.is_some() {
        let (measured, baseline_report) = summarize(&baseline_args, &baseline_runs, &[]);
        table.measured_baseline(&measured);
        report.insert("baseline".into(), Value::Object(baseline_report));
        report.insert(
            "baseline_runs_detail".into(),
            serde_json::to_value(&baseline_runs).unwrap(),
        );
    }

    println!(
        "\nantler pipeline: N={n} messages, C={c} clients, T={t} threads, Q={q} queued \
         (QC={qc}), L={l} turns on one thread; medians of {} runs; {:.0} s",
        a.runs,
        begun.elapsed().as_secs_f64()
    );
    println!(
        "| {:<60} | {:<34} | {:<22} | {:<40} |\n|{:-<62}|{:-<36}|{:-<24}|{:-<42}|",
        "metric",
        "value",
        "target (issue 27)",
        if baseline.is_some() {
            "baseline: measured (issue 27's start)"
        } else {
            "baseline (issue 27's start)"
        },
        "",
        "",
        "",
        ""
    );
    for [metric, value, target, baseline] in table.rows {
        println!("| {metric:<60} | {value:<34} | {target:<22} | {baseline:<40} |");
    }
    report.insert("issue27".into(), Value::Object(table.issue27));
    report.insert(
        "args".into(),
        json!({"messages": n, "concurrency": c, "threads": t, "queued": q,
               "queued_concurrency": qc, "thread_turns": l, "runs": a.runs,
               "startups": a.startups, "phases": a.only}),
    );
    report.insert("runs_detail".into(), serde_json::to_value(&runs).unwrap());
    println!("{}", Value::Object(report));
}

/// What stays the same for every run: the mock model, the ceiling's URL and the clients.
struct Rig<'a> {
    client: &'a reqwest::Client,
    tg_client: &'a reqwest::Client,
    model: &'a MockModel,
    bot: &'a BotApi,
    bot_url: &'a str,
    bare_url: &'a str,
}

/// Run `r`: the ceiling, then every chosen phase on the binary of this pass.
#[allow(clippy::too_many_lines)]
async fn measure(a: &Args, r: usize, rig: &Rig<'_>) -> Run {
    let Rig {
        client,
        tg_client,
        model,
        bot,
        bot_url,
        bare_url,
    } = *rig;
    let (n, c) = (a.messages, a.concurrency);
    // The ceiling: the same client, body shape, concurrency and count against a bare
    // handler, measured in this run so that the ratios compare like with like.
    let body = move |i: usize| {
        json!({"conversation": format!("a{i}"), "user": "bench", "text": format!("hello {i}"),
               "message_id": format!("r{r}-a{i}")})
    };
    let ceiling = load(client, bare_url, n, c, a.timeout, 202, body, |_, _| true).await;
    let sequential = if a.runs("sequential") {
        Some(sequential(a, r, client, model).await)
    } else {
        None
    };
    let acks = if a.runs("acks") {
        Some(acks(a, r, client, model).await)
    } else {
        None
    };
    let database = bench_database();
    let pg_acks = match &database {
        Some(server) if a.runs("pg-acks") => Some(PgPair {
            one: pg_acks(a, r, client, model, server, 1).await,
            two: pg_acks(a, r, client, model, server, 2).await,
        }),
        _ => None,
    };
    let turns = if a.runs("turns") {
        Some(turns(a, r, client, model).await)
    } else {
        None
    };
    let pg_turns = match &database {
        Some(server) if a.runs("pg-turns") => Some(PgPair {
            one: pg_turns(a, r, client, model, server, 1).await,
            two: pg_turns(a, r, client, model, server, 2).await,
        }),
        _ => None,
    };
    let queued = if a.runs("queued") {
        Some(queued(a, r, client, model).await)
    } else {
        None
    };
    let growth = if a.runs("growth") {
        Some(growth(a, r, client, model).await)
    } else {
        None
    };
    let memory = if a.runs("memory") {
        Some(memory_phase(a, client).await)
    } else {
        None
    };
    let subagents = if a.runs("subagents") {
        Some(subagents_phase(a, client).await)
    } else {
        None
    };
    let sandbox = if a.runs("sandbox") {
        Some(sandbox_phase(a, client).await)
    } else {
        None
    };
    let telegram = if a.runs("telegram") {
        Some(telegram(a, client, tg_client, model, bot, bot_url).await)
    } else {
        None
    };
    let takeover = match &database {
        Some(server) if a.runs("takeover") => Some(takeover(a, r, tg_client, model, server).await),
        _ => None,
    };
    Run {
        ceiling_req_per_s: ceiling.rate(),
        ceiling_p50_ms: ceiling.pct(0.50),
        ceiling_p99_ms: ceiling.pct(0.99),
        ack_ratio: acks.as_ref().map(|x| x.acks_per_s / ceiling.rate()),
        turn_ratio: turns.as_ref().map(|x| x.turns_per_s / ceiling.rate()),
        sequential,
        acks,
        turns,
        queued,
        growth,
        memory,
        subagents,
        sandbox,
        telegram_ratios: telegram.as_ref().map(|x| TelegramRatios {
            acks: x.acks_per_s / ceiling.rate(),
            drain: x.drain_turns_per_s / ceiling.rate(),
            turns: x.turns_per_s / ceiling.rate(),
        }),
        telegram,
        pg_acks,
        pg_turns,
        takeover,
    }
}

/// The table and the JSON report of `runs` (and of the startups measured before them).
#[allow(clippy::too_many_lines)]
fn summarize(a: &Args, runs: &[Run], startups: &[f64]) -> (Table, serde_json::Map<String, Value>) {
    let (n, c, t, q, qc, l) = (
        a.messages,
        a.concurrency,
        a.threads,
        a.queued,
        a.queued_concurrency,
        a.thread_turns,
    );
    let startup_ms = median(startups.to_vec());
    let mut table = Table::default();
    let mut report = serde_json::Map::new();
    if a.runs("startup") {
        table.row(
            format!("startup: spawn → /readyz 200 (median of {})", a.startups),
            format!("{startup_ms:.1} ms"),
            String::new(),
        );
        report.insert(
            "startup".into(),
            json!({"median_ms": startup_ms, "ms": startups}),
        );
    }
    let ceiling = median(runs.iter().map(|r| r.ceiling_req_per_s).collect());
    let ceiling_p50 = median(runs.iter().map(|r| r.ceiling_p50_ms).collect());
    let ceiling_p99 = median(runs.iter().map(|r| r.ceiling_p99_ms).collect());
    table.row(
        format!("ceiling: bare axum handler, 202, C={c}"),
        format!("{ceiling:.0} req/s (p50 {ceiling_p50:.2}, p99 {ceiling_p99:.2} ms)"),
        String::new(),
    );
    report.insert(
        "ceiling".into(),
        json!({"req_per_s": ceiling, "p50_ms": ceiling_p50, "p99_ms": ceiling_p99}),
    );

    if a.runs("sequential") {
        let x = |f: fn(&Sequential) -> f64| med(runs, |r| r.sequential.as_ref(), f);
        let k = a.sequential;
        let (first, ready) = (x(|s| s.first_turn_ms), x(|s| s.ready_ms));
        let (idle, after, peak) = (
            x(|s| s.idle.rss),
            x(|s| s.after_first_turn.rss),
            x(|s| s.after_plain.hwm),
        );
        let (plain_p50, plain_cpu, plain_calls) = (
            x(|s| s.plain.p50_ms),
            x(|s| s.plain.cpu_us_per_turn),
            x(|s| s.plain.model_calls_per_turn),
        );
        let (tool_p50, tool_cpu, tool_calls) = (
            x(|s| s.tool.p50_ms),
            x(|s| s.tool.cpu_us_per_turn),
            x(|s| s.tool.model_calls_per_turn),
        );
        table.goal(
            "first_turn_ms",
            "start → first answered turn (spawn → /readyz 200 → wait: true)".into(),
            format!("{first:.1} ms (/readyz 200 at {ready:.1})"),
            first,
            Some(first <= 15.0),
        );
        table.goal(
            "rss_idle_mib",
            "RSS idle (/readyz 200, no turn yet)".into(),
            format!("{idle:.1} MiB"),
            idle,
            Some(idle <= 15.0 * MB_IN_MIB),
        );
        table.goal(
            "rss_after_first_turn_mib",
            format!("RSS after the first turn / peak after {k} sequential turns"),
            format!("{after:.1} / {peak:.1} MiB"),
            after,
            None,
        );
        table.goal(
            "plain_turn_p50_ms",
            format!("plain turn, sequential p50, {k} new threads (HTTP included)"),
            format!("{plain_p50:.2} ms ({plain_calls:.2} model calls)"),
            plain_p50,
            None,
        );
        table.goal(
            "cpu_plain_turn_ms",
            "antler CPU per plain turn, sequential".into(),
            format!("{:.3} ms", plain_cpu / 1e3),
            plain_cpu / 1e3,
            Some(plain_cpu <= 400.0),
        );
        table.goal(
            "tool_turn_p50_ms",
            format!("tool turn (current_time), sequential p50, {k} new threads"),
            format!("{tool_p50:.2} ms ({tool_calls:.2} model calls)"),
            tool_p50,
            None,
        );
        table.goal(
            "cpu_tool_turn_ms",
            "antler CPU per tool turn, sequential".into(),
            format!("{:.3} ms", tool_cpu / 1e3),
            tool_cpu / 1e3,
            Some(tool_cpu <= 600.0),
        );
        report.insert(
            "sequential".into(),
            json!({"turns": k, "first_turn_ms": first, "ready_ms": ready, "rss_idle_mib": idle,
                   "rss_after_first_turn_mib": after, "peak_rss_mib": peak,
                   "plain": {"p50_ms": plain_p50, "cpu_us": plain_cpu, "model_calls_per_turn": plain_calls},
                   "tool": {"p50_ms": tool_p50, "cpu_us": tool_cpu, "model_calls_per_turn": tool_calls}}),
        );
    }

    if a.runs("acks") {
        let x = |f: fn(&Acks) -> f64| med(runs, |r| r.acks.as_ref(), f);
        let ratio = median(runs.iter().filter_map(|r| r.ack_ratio).collect());
        let (rate, p50, p99) = (x(|x| x.acks_per_s), x(|x| x.p50_ms), x(|x| x.p99_ms));
        let syncs = x(|x| x.syncs_per_ack);
        let (cpu, bench_cpu) = (x(|x| x.cpu_us_per_ack), x(|x| x.bench_cpu_us_per_ack));
        let drain = x(|x| x.drain_turns_per_s);
        table.row(
            format!("durable acks (202, model held), C={c}"),
            format!("{rate:.0} acks/s"),
            String::new(),
        );
        table.goal(
            "ack_ratio",
            "acks ÷ ceiling (median of per-run ratios; issue: wrk)".into(),
            format!("{ratio:.3}"),
            ratio,
            Some(ratio >= 0.5),
        );
        table.row(
            "ack latency p50 / p99".into(),
            format!("{p50:.2} / {p99:.2} ms"),
            String::new(),
        );
        table.row(
            "group-committed syncs per ack".into(),
            format!("{syncs:.3}"),
            String::new(),
        );
        table.row(
            "CPU per ack: antler / load generator + mock".into(),
            format!("{cpu:.0} / {bench_cpu:.0} µs"),
            String::new(),
        );
        table.row(
            "drain of those N after release (no client waits)".into(),
            format!("{drain:.0} turns/s"),
            String::new(),
        );
        report.insert(
            "acks".into(),
            json!({"per_s": rate, "ratio": ratio, "p50_ms": p50, "p99_ms": p99,
                   "syncs_per_ack": syncs, "cpu_us": cpu, "bench_cpu_us": bench_cpu,
                   "drain_turns_per_s": drain}),
        );
    }

    if a.runs("turns") {
        let x = |f: fn(&Turns) -> f64| med(runs, |r| r.turns.as_ref(), f);
        let ratio = median(runs.iter().filter_map(|r| r.turn_ratio).collect());
        let tps = x(|x| x.turns_per_s);
        let (p50, p90, p99) = (x(|x| x.p50_ms), x(|x| x.p90_ms), x(|x| x.p99_ms));
        let (cpu, bench_cpu) = (x(|x| x.cpu_us_per_turn), x(|x| x.bench_cpu_us_per_turn));
        let (syncs, calls) = (x(|x| x.syncs_per_turn), x(|x| x.model_calls_per_turn));
        let (rss, hwm) = (x(|x| x.mem.rss), x(|x| x.mem.hwm));
        table.goal(
            "turns_per_s",
            format!("turns end to end (wait: true), T={t}, C={c} (issue: wrk; 8 threads)"),
            format!("{tps:.0} turns/s"),
            tps,
            Some(tps >= 5000.0),
        );
        table.row(
            "turn latency p50 / p90 / p99".into(),
            format!("{p50:.1} / {p90:.1} / {p99:.1} ms"),
            String::new(),
        );
        table.row(
            "turns ÷ ceiling".into(),
            format!("{ratio:.3}"),
            String::new(),
        );
        table.goal(
            "cpu_plain_turn_under_load_ms",
            format!("CPU per turn under load (C={c}): antler / load generator + mock"),
            format!("{:.3} / {:.3} ms", cpu / 1e3, bench_cpu / 1e3),
            cpu / 1e3,
            Some(cpu <= 400.0),
        );
        table.row(
            "syncs per turn / model calls per turn".into(),
            format!("{syncs:.2} / {calls:.2}"),
            String::new(),
        );
        table.goal(
            "rss_peak_under_load_mib",
            format!("RSS / peak RSS at {t} threads (under load, backlog not full)"),
            format!("{rss:.1} / {hwm:.1} MiB"),
            hwm,
            Some(hwm <= 50.0 * MB_IN_MIB),
        );
        report.insert(
            "turns".into(),
            json!({"per_s": tps, "ratio": ratio, "latency_ms": {"p50": p50, "p90": p90, "p99": p99},
                   "cpu_us": cpu, "bench_cpu_us": bench_cpu, "syncs_per_turn": syncs,
                   "model_calls_per_turn": calls, "rss_mib": rss, "peak_rss_mib": hwm}),
        );
    }

    if a.runs("queued") {
        let x = |f: fn(&Queued) -> f64| med(runs, |r| r.queued.as_ref(), f);
        let rate = x(|x| x.post_acks_per_s);
        let (rss, hwm) = (x(|x| x.before.rss), x(|x| x.before.hwm));
        let (after, after_hwm) = (x(|x| x.after.rss), x(|x| x.after.hwm));
        let (anon, after_anon) = (x(|x| x.before.anon), x(|x| x.after.anon));
        let (drain, store) = (x(|x| x.drain_s), x(|x| x.store_mib));
        // The memory targets are set for 60,000 queued messages.
        let target = |verdict: String| {
            if q >= 60_000 {
                verdict
            } else {
                "n/a below Q=60000".to_owned()
            }
        };
        table.row(
            format!("{q} queued, one per conversation: posting, QC={qc}"),
            format!("{rate:.0} acks/s"),
            String::new(),
        );
        let waiting: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.queued.as_ref()?.waiting.map(|m| m.rss))
            .collect();
        let waiting = (!waiting.is_empty()).then(|| median(waiting));
        if let Some(rss) = waiting {
            table.goal(
                "rss_15000_waiting_mib",
                format!("RSS with the first {WAITING} queued (one per conversation, model held)"),
                format!("{rss:.1} MiB"),
                rss,
                Some(rss <= 40.0 * MB_IN_MIB),
            );
        }
        table.goal(
            "rss_60000_queued_mib",
            format!("RSS with {q} queued (peak so far; anonymous)"),
            format!("{rss:.1} MiB ({hwm:.1}; {anon:.1})"),
            rss,
            (q >= 60_000).then_some(rss <= 60.0 * MB_IN_MIB),
        );
        table.row(
            "RSS after the drain (peak; anonymous)".into(),
            format!("{after:.1} MiB ({after_hwm:.1}; {after_anon:.1})"),
            target(format!("< 40 MB: {}", met(after < 40.0 * MB_IN_MIB))),
        );
        table.row(
            "drain time / store size after".into(),
            format!("{drain:.1} s / {store:.1} MiB"),
            String::new(),
        );
        report.insert(
            "queued".into(),
            json!({"post_acks_per_s": rate, "rss_waiting_mib": waiting, "waiting": WAITING,
                   "rss_mib": rss, "peak_rss_mib": hwm, "anon_mib": anon,
                   "rss_after_drain_mib": after, "peak_rss_after_drain_mib": after_hwm,
                   "anon_after_drain_mib": after_anon,
                   "drain_s": drain, "store_mib": store}),
        );
    }

    if a.runs("growth") {
        let size = |f: fn(&Windows) -> f64| {
            med(
                runs,
                |r| r.growth.as_ref(),
                |g| f(&Windows::of(&g.store_bytes)),
            )
        };
        let written = |f: fn(&Windows) -> f64| {
            med(
                runs,
                |r| r.growth.as_ref(),
                |g| f(&Windows::of(&g.write_bytes)),
            )
        };
        let (mean_early, mean_late) = (size(|w| w.early_mean), size(|w| w.late_mean));
        let (min_early, min_late) = (size(|w| w.early_min), size(|w| w.late_min));
        let (w_early, w_late) = (written(|w| w.early_mean), written(|w| w.late_mean));
        // Flat: a turn appends its own records, never the thread again (the smallest growth
        // stays put), and page rewrites do not multiply either. Rewrites come in bursts every
        // few turns, so the five-turn means get some slack.
        let flat = min_late <= min_early * 1.1 && mean_late <= mean_early * 2.0;
        let window = format!("turns 1–5 / {}–{l}", l - 4);
        table.goal(
            "stored_bytes_per_turn",
            format!("store growth per turn, mean, {window}"),
            format!("{mean_early:.0} / {mean_late:.0} B"),
            mean_late,
            Some(mean_early <= 4000.0 && mean_late <= 4000.0),
        );
        table.goal(
            "stored_growth_flat",
            format!("store growth per turn, smallest, {window}"),
            format!("{min_early:.0} / {min_late:.0} B"),
            min_late / min_early,
            Some(flat),
        );
        table.row(
            format!("bytes written per turn (4 KiB pages), {window}"),
            format!("{w_early:.0} / {w_late:.0} B"),
            String::new(),
        );
        report.insert(
            "growth".into(),
            json!({"store_bytes_per_turn_mean": [mean_early, mean_late],
                   "store_bytes_per_turn_min": [min_early, min_late],
                   "write_bytes_per_turn": [w_early, w_late], "flat": flat}),
        );
    }

    if a.runs("memory") {
        let x = |f: fn(&Memory) -> f64| med(runs, |r| r.memory.as_ref(), f);
        let (off, on) = (x(|m| m.off_p50_ms), x(|m| m.on_p50_ms));
        let (cpu_off, cpu_on) = (x(|m| m.off_cpu_us_per_turn), x(|m| m.on_cpu_us_per_turn));
        table.row(
            format!("memory: turn p50 off / on ({l} turns, one user)"),
            format!("{off:.1} / {on:.1} ms (×{:.2})", on / off),
            String::new(),
        );
        table.row(
            "memory: antler CPU per turn off / on (on: + updater)".into(),
            format!("{cpu_off:.0} / {cpu_on:.0} µs (×{:.2})", cpu_on / cpu_off),
            String::new(),
        );
        let (p50, last) = (
            x(|m| m.updater_prompt_tokens_p50),
            x(|m| m.updater_prompt_tokens_last),
        );
        table.row(
            "memory: updater prompt tokens per turn, median / last".into(),
            format!("{p50:.0} / {last:.0}"),
            format!("{:.1} model requests per turn", x(|m| m.requests_per_turn)),
        );
        table.row(
            format!("memory: injected block after {l} facts; updater delay p50"),
            format!(
                "{:.0} tokens; {:.0} ms",
                x(|m| m.injected_tokens_last),
                x(|m| m.updater_delay_p50_ms)
            ),
            String::new(),
        );
        report.insert(
            "memory".into(),
            json!({"turn_p50_ms": [off, on], "cpu_us_per_turn": [cpu_off, cpu_on],
                   "updater_prompt_tokens": [p50, last],
                   "requests_per_turn": x(|m| m.requests_per_turn),
                   "injected_tokens_last": x(|m| m.injected_tokens_last),
                   "updater_delay_p50_ms": x(|m| m.updater_delay_p50_ms)}),
        );
    }

    if a.runs("subagents") {
        let x = |f: fn(&Subagents) -> f64| med(runs, |r| r.subagents.as_ref(), f);
        let (direct, delegated) = (x(|s| s.direct_p50_ms), x(|s| s.delegated_p50_ms));
        let (cpu_direct, cpu_delegated) = (
            x(|s| s.direct_cpu_us_per_turn),
            x(|s| s.delegated_cpu_us_per_turn),
        );
        table.row(
            format!("subagents: turn p50 direct / 3 tasks delegated ({l} turns each)"),
            format!(
                "{direct:.1} / {delegated:.1} ms (×{:.2})",
                delegated / direct
            ),
            format!(
                "{:.1} model requests per delegated turn",
                x(|s| s.requests_per_turn)
            ),
        );
        table.row(
            "subagents: antler CPU per turn direct / delegated".into(),
            format!(
                "{cpu_direct:.0} / {cpu_delegated:.0} µs (×{:.2})",
                cpu_delegated / cpu_direct
            ),
            String::new(),
        );
        report.insert(
            "subagents".into(),
            json!({"turn_p50_ms": [direct, delegated],
                   "cpu_us_per_turn": [cpu_direct, cpu_delegated],
                   "requests_per_turn": x(|s| s.requests_per_turn)}),
        );
    }

    if a.runs("sandbox") {
        let p50 = |name: &str| -> Option<f64> {
            let all: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.sandbox.as_ref())
                .filter_map(|s| s.backends.iter().find(|(b, _)| b == name)?.1)
                .collect();
            (!all.is_empty()).then(|| median(all))
        };
        let base = p50("none");
        let mut shown = Vec::new();
        for name in ["none", "landlock", "bwrap"] {
            let text = match (p50(name), base) {
                (Some(ms), Some(base)) if name != "none" => {
                    format!(
                        "{name} {ms:.2} ms (+{:.2} ms, ×{:.2})",
                        ms - base,
                        ms / base
                    )
                }
                (Some(ms), _) => format!("{name} {ms:.2} ms"),
                (None, _) => format!("{name} not available"),
            };
            shown.push(text);
        }
        table.row(
            format!("sandbox: turn p50 with one `bash -c true` ({l} turns each)"),
            shown.join(" / "),
            String::new(),
        );
        report.insert(
            "sandbox".into(),
            json!({"turn_p50_ms": {"none": base, "landlock": p50("landlock"), "bwrap": p50("bwrap")}}),
        );
    }

    if a.runs("telegram") {
        let x = |f: fn(&Telegram) -> f64| med(runs, |r| r.telegram.as_ref(), f);
        let ratio = |f: fn(&TelegramRatios) -> f64| {
            median(
                runs.iter()
                    .filter_map(|r| r.telegram_ratios.as_ref())
                    .map(f)
                    .collect(),
            )
        };
        let (rate, p50, p99, cpu) = (
            x(|x| x.acks_per_s),
            x(|x| x.p50_ms),
            x(|x| x.p99_ms),
            x(|x| x.cpu_us_per_ack),
        );
        let (drain, tps) = (x(|x| x.drain_turns_per_s), x(|x| x.turns_per_s));
        let (load_p50, load_p99, turn_cpu) = (
            x(|x| x.load_p50_ms),
            x(|x| x.load_p99_ms),
            x(|x| x.cpu_us_per_turn),
        );
        let (ack_ratio, drain_ratio, turn_ratio) =
            (ratio(|r| r.acks), ratio(|r| r.drain), ratio(|r| r.turns));
        let per_turn = |f: fn(&BotCalls) -> usize| {
            med(
                runs,
                |r| r.telegram.as_ref(),
                |x: &Telegram| (f(&x.calls_held) + f(&x.calls_load)) as f64 / (2 * n) as f64,
            )
        };
        let (actions, edits) = (
            per_turn(|c| c.send_chat_action),
            per_turn(|c| c.edit_message_text),
        );
        table.row(
            format!("telegram: webhook acks (200, model held), C={c}"),
            format!("{rate:.0} acks/s"),
            String::new(),
        );
        table.row(
            "telegram: webhook acks ÷ ceiling".into(),
            format!("{ack_ratio:.3}"),
            String::new(),
        );
        table.row(
            "telegram: webhook ack latency p50 / p99".into(),
            format!("{p50:.2} / {p99:.2} ms"),
            String::new(),
        );
        table.row(
            "telegram: antler CPU per webhook ack".into(),
            format!("{cpu:.0} µs"),
            String::new(),
        );
        table.row(
            "telegram: answered turns, drain after release".into(),
            format!("{drain:.0} turns/s (÷ ceiling {drain_ratio:.3})"),
            String::new(),
        );
        table.row(
            format!("telegram: answered turns under load, T={t}, C={c}"),
            format!("{tps:.0} turns/s (÷ ceiling {turn_ratio:.3})"),
            String::new(),
        );
        table.row(
            "telegram: under load, ack p50 / p99; CPU per turn".into(),
            format!("{load_p50:.2} / {load_p99:.2} ms; {turn_cpu:.0} µs"),
            String::new(),
        );
        table.row(
            "telegram: SendChatAction / EditMessageText per turn".into(),
            format!("{actions:.2} / {edits:.2}"),
            String::new(),
        );
        report.insert(
            "telegram".into(),
            json!({"acks_per_s": rate, "ack_ratio": ack_ratio, "p50_ms": p50, "p99_ms": p99,
                   "cpu_us_per_ack": cpu, "drain_turns_per_s": drain, "drain_ratio": drain_ratio,
                   "turns_per_s": tps, "turn_ratio": turn_ratio,
                   "load_ack_ms": {"p50": load_p50, "p99": load_p99},
                   "cpu_us_per_turn": turn_cpu, "chat_actions_per_turn": actions,
                   "edits_per_turn": edits}),
        );
    }
    pg_rows(a, runs, &mut table, &mut report);
    (table, report)
}

/// Nearest-rank percentile `p` of `v` (NaN when empty).
fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len());
    v[i - 1]
}

/// The rows of the PostgreSQL phases: each figure beside sled's of the same runs, medians over
/// the runs, ratios taken within a run; takeover percentiles over every kill of every run.
#[allow(clippy::too_many_lines)]
fn pg_rows(a: &Args, runs: &[Run], table: &mut Table, report: &mut serde_json::Map<String, Value>) {
    let c = a.concurrency;
    let database = bench_database().is_some();
    for (phase, what) in [("pg-acks", "ack"), ("pg-turns", "turn")] {
        if !a.runs(phase) {
            continue;
        }
        if !database {
            table.row(
                format!("{phase}: skipped"),
                "ANTLER_BENCH_DATABASE_URL unset".into(),
                String::new(),
            );
            continue;
        }
        // (sled, pg ×1, pg ×2) of one run, with sled's figures as a PgLoad.
        let per_run: Vec<(PgLoad, PgLoad, PgLoad)> = runs
            .iter()
            .filter_map(|r| {
                let (sled, pair) = if phase == "pg-acks" {
                    let x = r.acks.as_ref()?;
                    let sled = PgLoad {
                        replicas: 0,
                        per_s: x.acks_per_s,
                        p50_ms: x.p50_ms,
                        p99_ms: x.p99_ms,
                        cpu_us: x.cpu_us_per_ack,
                        pg_cpu_us: 0.0,
                        retried_503: 0,
                        drain_turns_per_s: Some(x.drain_turns_per_s),
                    };
                    (sled, r.pg_acks.as_ref()?)
                } else {
                    let x = r.turns.as_ref()?;
                    let sled = PgLoad {
                        replicas: 0,
                        per_s: x.turns_per_s,
                        p50_ms: x.p50_ms,
                        p99_ms: x.p99_ms,
                        cpu_us: x.cpu_us_per_turn,
                        pg_cpu_us: 0.0,
                        retried_503: 0,
                        drain_turns_per_s: None,
                    };
                    (sled, r.pg_turns.as_ref()?)
                };
                Some((sled, pair.one.clone(), pair.two.clone()))
            })
            .collect();
        let m =
            |f: &dyn Fn(&(PgLoad, PgLoad, PgLoad)) -> f64| median(per_run.iter().map(f).collect());
        let (sled, one, two) = (m(&|x| x.0.per_s), m(&|x| x.1.per_s), m(&|x| x.2.per_s));
        let (r1, r2) = (m(&|x| x.1.per_s / x.0.per_s), m(&|x| x.2.per_s / x.1.per_s));
        let lat = |i: usize| {
            let pick = move |x: &(PgLoad, PgLoad, PgLoad)| match i {
                0 => x.0.clone(),
                1 => x.1.clone(),
                _ => x.2.clone(),
            };
            (m(&|x| pick(x).p50_ms), m(&|x| pick(x).p99_ms))
        };
        let ((s50, s99), (o50, o99), (t50, t99)) = (lat(0), lat(1), lat(2));
        let (cpu_s, cpu_1, cpu_2) = (m(&|x| x.0.cpu_us), m(&|x| x.1.cpu_us), m(&|x| x.2.cpu_us));
        let (pg_1, pg_2) = (m(&|x| x.1.pg_cpu_us), m(&|x| x.2.pg_cpu_us));
        let retried = m(&|x| x.2.retried_503 as f64);
        let unit = if phase == "pg-acks" {
            "acks/s"
        } else {
            "turns/s"
        };
        let shape = if phase == "pg-acks" {
            format!("durable acks (202, model held), C={c}")
        } else {
            format!("turns end to end (wait: true), T={}, C={c}", a.threads)
        };
        table.row(
            format!("{phase}: {shape}: sled / pg ×1 / pg ×2"),
            format!("{sled:.0} / {one:.0} / {two:.0} {unit}"),
            String::new(),
        );
        table.row(
            format!("{phase}: pg ×1 ÷ sled / pg ×2 ÷ pg ×1 (within runs)"),
            format!("{r1:.3} / {r2:.3}"),
            String::new(),
        );
        table.row(
            format!("{phase}: latency p50 / p99, sled; pg ×1; pg ×2"),
            format!("{s50:.1}/{s99:.1}; {o50:.1}/{o99:.1}; {t50:.1}/{t99:.1} ms"),
            String::new(),
        );
        table.row(
            format!("{phase}: CPU per {what}: antler sled / pg ×1 / pg ×2 (both replicas)"),
            format!("{cpu_s:.0} / {cpu_1:.0} / {cpu_2:.0} µs"),
            String::new(),
        );
        table.row(
            format!("{phase}: CPU per {what}: PostgreSQL's processes, pg ×1 / pg ×2"),
            format!("{pg_1:.0} / {pg_2:.0} µs"),
            String::new(),
        );
        table.row(
            format!("{phase}: 503s retried on the other replica (pg ×2, of N)"),
            format!("{retried:.0}"),
            String::new(),
        );
        let mut entry = json!({
            "per_s": {"sled": sled, "pg1": one, "pg2": two},
            "ratio": {"pg1_sled": r1, "pg2_pg1": r2},
            "latency_ms": {"sled": [s50, s99], "pg1": [o50, o99], "pg2": [t50, t99]},
            "cpu_us": {"sled": cpu_s, "pg1": cpu_1, "pg2": cpu_2},
            "postgres_cpu_us": {"pg1": pg_1, "pg2": pg_2},
            "retried_503_pg2": retried,
        });
        if phase == "pg-acks" {
            let drain = |i: usize| {
                m(&|x| {
                    let l = [&x.0, &x.1, &x.2][i];
                    l.drain_turns_per_s.unwrap_or(f64::NAN)
                })
            };
            let (d0, d1, d2) = (drain(0), drain(1), drain(2));
            table.row(
                "pg-acks: drain of those N after release: sled / pg ×1 / pg ×2".into(),
                format!("{d0:.0} / {d1:.0} / {d2:.0} turns/s"),
                String::new(),
            );
            entry["drain_turns_per_s"] = json!({"sled": d0, "pg1": d1, "pg2": d2});
        }
        report.insert(phase.replace('-', "_"), entry);
    }

    if a.runs("takeover") {
        if !database {
            table.row(
                "takeover: skipped".into(),
                "ANTLER_BENCH_DATABASE_URL unset".into(),
                String::new(),
            );
            return;
        }
        let all: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.takeover.as_ref())
            .flat_map(|t| t.ms.iter().copied())
            .collect();
        let retried: usize = runs
            .iter()
            .filter_map(|r| r.takeover.as_ref())
            .map(|t| t.retried_503)
            .sum();
        let repeated: usize = runs
            .iter()
            .filter_map(|r| r.takeover.as_ref())
            .map(|t| t.repeated_answers)
            .sum();
        let (p50, p99) = (percentile(all.clone(), 0.50), percentile(all.clone(), 0.99));
        let max = all.iter().copied().fold(f64::NAN, f64::max);
        table.row(
            format!(
                "takeover: SIGKILL → next answer at the platform, lease_secs = 3 ({} kills)",
                all.len()
            ),
            format!("p50 {p50:.0} / p99 {p99:.0} / max {max:.0} ms"),
            String::new(),
        );
        let calls: usize = runs
            .iter()
            .filter_map(|r| r.takeover.as_ref())
            .map(|t| t.model_calls)
            .sum();
        table.row(
            "takeover: 503s retried; first answers sent again; model calls / messages".into(),
            format!("{retried}; {repeated}; {calls} / {}", 2 * all.len()),
            String::new(),
        );
        report.insert(
            "takeover".into(),
            json!({"kills": all.len(), "p50_ms": p50, "p99_ms": p99, "max_ms": max,
                   "lease_secs": 3, "retried_503": retried, "repeated_answers": repeated,
                   "model_calls": calls, "messages": 2 * all.len(),
                   "ms": all}),
        );
    }
}
