//! End-to-end pipeline benchmark: the real `antler serve` binary against an instant mock model.
//!
//! `cargo bench --bench pipeline -- [--quick] [--messages N] [--concurrency C] [--threads T]
//! [--runs R] [--startups S] [--timeout-secs X]`
//!
//! In one process: an instant OpenAI-compatible mock model and a bare axum handler (the HTTP
//! ceiling), both on 127.0.0.1:0, and the load generator (one shared reqwest client, HTTP/1.1
//! keep-alive, C concurrent tasks). Measured: spawn → first 200 of `/readyz` (median of S
//! spawns); N messages through `POST /api/v1/messages` with `"wait": true` over T conversations
//! (median of R runs, each with a fresh store); the child's RSS from `/proc/<pid>/status`; the
//! bare handler with the same client, concurrency and N. Prints a table and one JSON line.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

const ANSWER: &str = "Sure, here is a short answer.";

struct Args {
    messages: usize,
    concurrency: usize,
    threads: usize,
    runs: usize,
    startups: usize,
    timeout: Duration,
}

impl Args {
    fn parse() -> Self {
        let mut a = Self {
            messages: 5000,
            concurrency: 64,
            threads: 1000,
            runs: 3,
            startups: 5,
            timeout: Duration::from_secs(600),
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || -> usize {
                let v = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
                v.parse()
                    .unwrap_or_else(|_| panic!("{flag}: not a number: {v}"))
            };
            match flag.as_str() {
                "--messages" => a.messages = value(),
                "--concurrency" => a.concurrency = value().max(1),
                "--threads" => a.threads = value().max(1),
                "--runs" => a.runs = value().max(1),
                "--startups" => a.startups = value().max(1),
                "--timeout-secs" => a.timeout = Duration::from_secs(value() as u64),
                "--quick" => {
                    a.messages = 500;
                    a.runs = 1;
                    a.startups = 1;
                }
                "--bench" => {} // passed by `cargo bench`
                other => panic!("unknown argument {other}"),
            }
        }
        a
    }
}

// ---- in-process servers ----

/// The instant mock model: `POST /v1/chat/completions`, streamed or not.
async fn mock_completion(calls: Arc<AtomicU64>, body: Bytes) -> axum::response::Response {
    calls.fetch_add(1, Ordering::Relaxed);
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19});
    let base = json!({"id": "chatcmpl-bench", "created": 0, "model": "bench"});
    if request["stream"].as_bool() == Some(true) {
        let mut delta = base.clone();
        delta["object"] = "chat.completion.chunk".into();
        delta["choices"] = json!([{"index": 0, "delta": {"role": "assistant", "content": ANSWER}, "finish_reason": null}]);
        let mut finish = base;
        finish["object"] = "chat.completion.chunk".into();
        finish["choices"] = json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]);
        finish["usage"] = usage;
        let sse = format!("data: {delta}\n\ndata: {finish}\n\ndata: [DONE]\n\n");
        ([(header::CONTENT_TYPE, "text/event-stream")], sse).into_response()
    } else {
        let mut done = base;
        done["object"] = "chat.completion".into();
        done["choices"] = json!([{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}]);
        done["usage"] = usage;
        axum::Json(done).into_response()
    }
}

async fn spawn_server(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

// ---- load generator ----

struct Load {
    wall: Duration,
    /// Sorted per-request latencies.
    latencies: Vec<Duration>,
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

/// Sends `n` POSTs from `c` tasks; every answer must be 200 (and satisfy `check`).
async fn load(
    client: &reqwest::Client,
    url: &str,
    n: usize,
    c: usize,
    timeout: Duration,
    body: impl Fn(usize) -> Value + Send + Sync + 'static,
    check: fn(&Value) -> bool,
) -> Load {
    let next = Arc::new(AtomicUsize::new(0));
    let body = Arc::new(body);
    let started = Instant::now();
    let tasks: Vec<_> = (0..c)
        .map(|_| {
            let (client, url, next, body) =
                (client.clone(), url.to_owned(), next.clone(), body.clone());
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(n / c + 1);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return lat;
                    }
                    let payload = body(i);
                    let t = Instant::now();
                    let response = client
                        .post(&url)
                        .json(&payload)
                        .send()
                        .await
                        .expect("request failed");
                    let status = response.status();
                    let answer: Value = response.json().await.expect("bad response body");
                    assert!(
                        status == 200 && check(&answer),
                        "request {i}: {status} {answer}"
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
    Load { wall, latencies }
}

// ---- the antler child ----

/// The running `antler serve`; killed (SIGKILL) on drop unless stopped gracefully first.
struct Antler {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Antler {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn antler_binary() -> &'static str {
    let path = env!("CARGO_BIN_EXE_antler");
    assert!(Path::new(path).exists(), "antler binary missing at {path}");
    path
}

/// Spawns antler with a fresh store; returns it and the time until `/readyz` answered 200.
async fn start_antler(model_url: &str, deadline: Duration) -> (Antler, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[store]\npath = \"{store}\"\n\n\
         [model]\nbase_url = \"{model_url}/v1\"\nmodel = \"bench\"\n\n\
         [agent]\nmax_concurrent_turns = 64\nbacklog = 100000\n\n[channels.api]\nenabled = true\n",
        store = dir.path().join("data").display(),
    );
    let config_path = dir.path().join("antler.toml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(dir.path().join("antler.log")).unwrap();
    let probe = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let child = Command::new(antler_binary())
        .args(["serve", "--config"])
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("cannot spawn antler");
    let mut antler = Antler {
        child,
        url,
        _dir: dir,
    };
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
        }
        if let Some(status) = antler.child.try_wait().unwrap() {
            let log =
                std::fs::read_to_string(antler._dir.path().join("antler.log")).unwrap_or_default();
            panic!("antler exited with {status} before it was ready:\n{log}");
        }
        assert!(
            started.elapsed() < deadline,
            "antler not ready within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

impl Antler {
    /// `(VmHWM, VmRSS)` in MiB.
    fn rss_mib(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| -> f64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            let kb: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            kb / 1024.0
        };
        (field("VmHWM:"), field("VmRSS:"))
    }

    fn cpu_secs(&self) -> f64 {
        cpu_secs(&self.child.id().to_string())
    }

    /// SIGTERM, then wait for the graceful exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let begun = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                begun.elapsed() < Duration::from_secs(30),
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

// ---- reporting ----

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 0 {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

#[derive(serde::Serialize)]
struct Run {
    turns_per_s: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    peak_rss_mib: f64,
    rss_mib: f64,
    cpu_us_per_turn: f64,
    /// CPU of this process (load generator + mock model) per turn.
    bench_cpu_us_per_turn: f64,
    model_calls: u64,
    flushes: f64,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(bench(args));
}

/// One fresh antler, N messages through it, its figures.
async fn measure(
    a: &Args,
    r: usize,
    client: &reqwest::Client,
    model: &str,
    calls: &AtomicU64,
) -> Run {
    let (n, t) = (a.messages, a.threads);
    let (antler, _) = start_antler(model, Duration::from_secs(30)).await;
    let url = format!("{}/api/v1/messages", antler.url);
    let (calls0, cpu0, own0) = (
        calls.load(Ordering::Relaxed),
        antler.cpu_secs(),
        cpu_secs("self"),
    );
    let body = move |i: usize| {
        json!({"conversation": format!("c{}", i % t), "user": "bench", "text": format!("hello {i}"),
               "message_id": format!("r{r}-m{i}"), "wait": true})
    };
    let l = load(client, &url, n, a.concurrency, a.timeout, body, |v| {
        v["reply"] == ANSWER
    })
    .await;
    let (peak_rss_mib, rss_mib) = antler.rss_mib();
    let metrics = client
        .get(format!("{}/metrics", antler.url))
        .send()
        .await
        .unwrap();
    let flushes = metrics
        .text()
        .await
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("antler_store_flushes_total "))
        .map_or(f64::NAN, |v| v.trim().parse().unwrap());
    let run = Run {
        turns_per_s: l.rate(),
        p50_ms: l.pct(0.50),
        p90_ms: l.pct(0.90),
        p99_ms: l.pct(0.99),
        peak_rss_mib,
        rss_mib,
        cpu_us_per_turn: (antler.cpu_secs() - cpu0) * 1e6 / n as f64,
        bench_cpu_us_per_turn: (cpu_secs("self") - own0) * 1e6 / n as f64,
        model_calls: calls.load(Ordering::Relaxed) - calls0,
        flushes,
    };
    antler.stop();
    eprintln!("  run {}: {}", r + 1, serde_json::to_string(&run).unwrap());
    run
}

async fn bench(a: Args) {
    let calls = Arc::new(AtomicU64::new(0));
    let mock = {
        let calls = calls.clone();
        Router::new().route(
            "/v1/chat/completions",
            post(move |body: Bytes| mock_completion(calls.clone(), body)),
        )
    };
    let model_url = spawn_server(mock).await;
    let bare = Router::new().route(
        "/echo",
        post(|_body: Bytes| async { axum::Json(json!({"ok": true, "id": 1})) }),
    );
    let bare_url = format!("{}/echo", spawn_server(bare).await);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.concurrency)
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap();
    let (n, c, t) = (a.messages, a.concurrency, a.threads);
    eprintln!(
        "pipeline bench: N={n} C={c} T={t} R={} S={} binary={}",
        a.runs,
        a.startups,
        antler_binary()
    );

    // The ceiling: the same client, body shape, concurrency and count against a bare handler.
    let mut ceiling = Vec::new();
    for _ in 0..a.runs {
        let body = move |i: usize| json!({"conversation": format!("c{}", i % t), "user": "bench", "text": "hello", "wait": true});
        ceiling.push(load(&client, &bare_url, n, c, a.timeout, body, |_| true).await);
    }
    let ceiling_rps = median(ceiling.iter().map(Load::rate).collect());
    let ceiling_p50 = median(ceiling.iter().map(|l| l.pct(0.50)).collect());
    let ceiling_p99 = median(ceiling.iter().map(|l| l.pct(0.99)).collect());

    let mut startups = Vec::new();
    for _ in 0..a.startups {
        let (antler, ready) = start_antler(&model_url, Duration::from_secs(30)).await;
        startups.push(ready.as_secs_f64() * 1e3);
        antler.stop();
    }
    let startup_ms = median(startups.clone());

    let mut runs = Vec::new();
    for r in 0..a.runs {
        runs.push(measure(&a, r, &client, &model_url, &calls).await);
    }
    let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let (tps, p50, p90, p99) = (
        m(|r| r.turns_per_s),
        m(|r| r.p50_ms),
        m(|r| r.p90_ms),
        m(|r| r.p99_ms),
    );
    let (hwm, rss) = (m(|r| r.peak_rss_mib), m(|r| r.rss_mib));
    let (cpu, bench_cpu) = (m(|r| r.cpu_us_per_turn), m(|r| r.bench_cpu_us_per_turn));
    let flushes_per_turn = m(|r| r.flushes) / n as f64;
    let ratio = tps / ceiling_rps;

    let rows = [
        (
            format!("startup: spawn → /readyz 200 (median of {})", a.startups),
            format!("{startup_ms:.1} ms"),
        ),
        (
            "throughput, wait:true, durable".into(),
            format!("{tps:.0} turns/s"),
        ),
        (
            "latency p50 / p90 / p99".into(),
            format!("{p50:.1} / {p90:.1} / {p99:.1} ms"),
        ),
        (
            "peak RSS (VmHWM) / RSS after run".into(),
            format!("{hwm:.1} / {rss:.1} MiB"),
        ),
        (
            "antler CPU per turn (user+sys)".into(),
            format!("{cpu:.0} µs"),
        ),
        (
            "client + mock CPU per turn (bench)".into(),
            format!("{bench_cpu:.0} µs"),
        ),
        (
            "group-committed flushes per turn".into(),
            format!("{flushes_per_turn:.2}"),
        ),
        (
            "ceiling: bare axum POST".into(),
            format!("{ceiling_rps:.0} req/s"),
        ),
        (
            "ceiling latency p50 / p99".into(),
            format!("{ceiling_p50:.2} / {ceiling_p99:.2} ms"),
        ),
        ("ratio antler ÷ ceiling".into(), format!("{ratio:.3}")),
    ];
    println!(
        "\nantler pipeline: N={n} messages, C={c} clients, T={t} threads, medians of {} runs",
        a.runs
    );
    println!(
        "| {:<42} | {:<22} |\n|{:-<44}|{:-<24}|",
        "metric", "value", "", ""
    );
    for (metric, value) in rows {
        println!("| {metric:<42} | {value:<22} |");
    }
    let report = json!({
        "messages": n, "concurrency": c, "threads": t, "runs": a.runs, "startups": a.startups,
        "startup_ms_median": startup_ms, "startup_ms": startups,
        "turns_per_s": tps, "latency_ms": {"p50": p50, "p90": p90, "p99": p99},
        "rss_mib": {"peak": hwm, "current": rss}, "cpu_us_per_turn": cpu,
        "bench_cpu_us_per_turn": bench_cpu, "flushes_per_turn": flushes_per_turn, "runs_detail": runs,
        "ceiling": {"req_per_s": ceiling_rps, "p50_ms": ceiling_p50, "p99_ms": ceiling_p99},
        "ratio": ratio,
    });
    println!("{report}");
}
