//! # antler-testkit
//!
//! Test-only code shared by the channel crates and the end-to-end tests (a dev-dependency only,
//! never published):
//!
//! - one mock platform API per platform ([`telegram::MockTelegram`], [`slack::MockSlack`],
//!   [`discord::MockDiscord`], [`feishu::MockFeishu`]) on 127.0.0.1, answering as the real API
//!   documents (fields, error shapes, 429s) and recording every request, and Feishu's long
//!   connection ([`feishu_socket::MockFeishuSocket`]);
//! - the platforms' request signers (Telegram's secret header, Slack's v0 HMAC, Discord's
//!   Ed25519, Feishu's encryption and signature), so a test sends what the platform sends;
//! - the channel [`conformance`] list: one set of cases every platform crate runs against its
//!   own channel with [`conformance_tests!`];
//! - a [`RecordingChannel`] for the gateway's own tests;
//! - the mock OpenAI-compatible model ([`mock_model::MockModel`]) the end-to-end tests and the
//!   pipeline benchmark run antler against.
//!
//! Nothing here reaches the internet: every server binds 127.0.0.1.
// A failed setup must fail the test at once and loudly, as in test code.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test-only code: a broken setup fails the test that uses it"
)]

pub mod conformance;
pub mod discord;
pub mod feishu;
pub mod feishu_socket;
pub mod mock_model;
mod recording;
pub mod slack;
pub mod telegram;

use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use conformance::{Conformance, Expect, Fixture, MockApi, Platform, Vector};
pub use recording::RecordingChannel;

/// The generous deadline for anything a test waits for.
pub const DEADLINE: Duration = Duration::from_secs(30);

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

/// Waits until `list` holds at least `n` items (for at most [`DEADLINE`]); they.
pub async fn wait_for_at_least<T, F, Fut>(what: &str, n: usize, mut list: F) -> Vec<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Vec<T>>,
{
    wait_until(what, || {
        let items = list();
        async move {
            let items = items.await;
            (items.len() >= n).then_some(items)
        }
    })
    .await
}

/// Now, in Unix seconds.
#[must_use]
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Now, in Unix milliseconds: the clock a channel under test is given to judge live requests.
#[must_use]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time the recorded vectors were signed at, 2026-01-01T00:00:00Z, in milliseconds.
#[must_use]
pub fn vector_clock_ms() -> u64 {
    VECTOR_TIME * 1000
}

/// The recorded vectors' signing time in Unix seconds (see `../shared/fixtures/README.md`).
pub const VECTOR_TIME: u64 = 1_767_225_600;

/// The bytes of `name` among `platform`'s recorded payloads and vectors
/// (`channels/<platform>/tests/fixtures/<name>`).
#[must_use]
pub fn fixture_bytes(platform: &str, name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../{platform}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// [`fixture_bytes`] as text.
#[must_use]
pub fn fixture_text(platform: &str, name: &str) -> String {
    String::from_utf8(fixture_bytes(platform, name)).expect("a fixture is UTF-8")
}

/// [`fixture_bytes`] as JSON.
#[must_use]
pub fn fixture_json(platform: &str, name: &str) -> serde_json::Value {
    serde_json::from_slice(&fixture_bytes(platform, name))
        .unwrap_or_else(|e| panic!("fixture {platform}/{name} is not JSON: {e}"))
}

/// One request a mock platform API received: its method, path (with the query) and body
/// (JSON when it parses, else `Null`).
#[derive(Debug, Clone)]
pub struct Call {
    /// `GET`, `POST`, `PATCH`…
    pub method: String,
    /// The URL's path.
    pub path: String,
    /// The URL's query, if any.
    pub query: Option<String>,
    /// The request headers.
    pub headers: http::HeaderMap,
    /// The body as JSON, `Null` when it is not JSON.
    pub body: serde_json::Value,
    /// The raw body.
    pub raw: Vec<u8>,
}

/// Every request `server` received, in order.
pub async fn calls_of(server: &wiremock::MockServer) -> Vec<Call> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|request| {
            let mut headers = http::HeaderMap::new();
            for (name, value) in &request.headers {
                if let (Ok(name), Ok(value)) = (
                    http::HeaderName::from_bytes(name.as_str().as_bytes()),
                    http::HeaderValue::from_bytes(value.as_bytes()),
                ) {
                    headers.append(name, value);
                }
            }
            Call {
                method: request.method.to_string(),
                path: request.url.path().to_owned(),
                query: request.url.query().map(str::to_owned),
                headers,
                body: serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null),
                raw: request.body,
            }
        })
        .collect()
}

/// The JSON bodies of the requests `server` received whose path ends with `/<method>`, in
/// order (an API of one method a path: Telegram's, Slack's).
pub async fn bodies_of(server: &wiremock::MockServer, method: &str) -> Vec<serde_json::Value> {
    let suffix = format!("/{method}");
    calls_of(server)
        .await
        .into_iter()
        .filter(|c| c.path.ends_with(&suffix))
        .map(|c| c.body)
        .collect()
}

/// What a webhook answered: its status and body.
#[derive(Debug)]
pub struct Answered {
    /// The HTTP status.
    pub status: reqwest::StatusCode,
    /// The body as text.
    pub text: String,
}

impl Answered {
    /// The body as JSON (panics when it is not).
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {}", self.text))
    }
}

/// Posts `body` with `headers` to `url`, as a platform delivers a webhook.
pub async fn post_webhook(
    http: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
    headers: &http::HeaderMap,
) -> Answered {
    let mut request = http.post(url).body(body);
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_bytes());
    }
    let response = request.send().await.expect("POST the webhook");
    let status = response.status();
    let text = response.text().await.expect("the webhook's answer");
    Answered { status, text }
}

/// A header map of `(name, value)` pairs.
#[must_use]
pub fn headers<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (name, value) in pairs {
        map.insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            http::HeaderValue::from_str(value).expect("a header value"),
        );
    }
    map
}

/// Runs `future` to completion on a fresh two-thread runtime: what [`conformance_tests!`]
/// generates its tests with, so a channel crate needs no tokio test macros of its own.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

/// `dm_policy = "open"` for a platform config whose `more` lines name no allowlist and no
/// `dm_policy`: these fixtures describe a bot anyone may talk to, which an empty allowlist
/// meant before DM pairing (issue 25) made `pairing` the default; empty otherwise.
#[must_use]
pub fn open_unless_listed(more: &str) -> &'static str {
    if ["allowed_users", "allowed_chats", "dm_policy"]
        .iter()
        .any(|key| more.contains(key))
    {
        ""
    } else {
        "dm_policy = \"open\"\n"
    }
}

/// An approval prompt's buttons, as the gateway makes them: Approve (`approve:k3x9p2ab`) and
/// Deny (`deny:k3x9p2ab`).
#[must_use]
pub fn approve_deny() -> Vec<antler_channel::Button> {
    use antler_channel::{Button, ButtonStyle};
    vec![
        Button {
            label: "✅ Approve".into(),
            action: "approve:k3x9p2ab".into(),
            style: ButtonStyle::Primary,
        },
        Button {
            label: "❌ Deny".into(),
            action: "deny:k3x9p2ab".into(),
            style: ButtonStyle::Danger,
        },
    ]
}
