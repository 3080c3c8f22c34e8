//! Schedules through the whole app: real HTTP to a mock Telegram Bot API and the mock model,
//! the store on disk, and the scheduler's clock moved by hand. A firing is answered in its
//! conversation once, on time, also across a restart, and after downtime `missed = "once"`
//! runs one catch-up where `"skip"` runs none.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use antler_testkit::mock_model::{Behaviour, MockModel};
use antler_testkit::telegram::MockTelegram;
use antler_testkit::wait_until;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{AppError, serve_with_clock};
use crate::config::Config;
use crate::schedule::clock::ManualClock;

/// Milliseconds since the epoch of a UTC time.
fn utc(civil: &str) -> u64 {
    let zoned = civil
        .parse::<jiff::civil::DateTime>()
        .unwrap()
        .in_tz("UTC")
        .unwrap();
    u64::try_from(zoned.timestamp().as_millisecond()).unwrap()
}

fn config(model: &MockModel, telegram: &MockTelegram, store: &Path) -> Config {
    // Only user 1 may talk: the schedules' author is no allowed user, and still runs.
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shutdown_grace_secs = 5
[store]
path = {store:?}
[model]
base_url = "{model}"
api_key = "sk-test"
model = "{name}"
max_retries = 1
[delivery]
backoff_base_ms = 10
backoff_max_secs = 1
[agent.middleware.title]
use_model = false
[memory]
enabled = false
{telegram}
[[schedules]]
name = "morning"
cron = "0 9 * * *"
timezone = "UTC"
conversation = "telegram:42"
prompt = "morning report"
[[schedules]]
name = "quiet"
cron = "0 9 * * *"
timezone = "UTC"
conversation = "telegram:42"
prompt = "quiet report"
missed = "skip"
"#,
        store = store.display().to_string(),
        model = model.base_url(),
        name = antler_testkit::mock_model::MODEL_NAME,
        telegram = telegram.config("allowed_users = [\"1\"]\n"),
    );
    Config::from_toml_str(&text, &|_| None).unwrap()
}

/// antler serving with the scheduler on `clock`.
struct App {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), AppError>>,
}

impl App {
    async fn start(config: Config, clock: &ManualClock) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health = format!("http://{}/healthz", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_with_clock(
            config,
            listener,
            async move {
                let _ = stopped.await;
            },
            Arc::new(clock.clone()),
        ));
        let http = reqwest::Client::new();
        wait_until("antler answers /healthz", || async {
            let answer = http.get(&health).send().await.ok()?;
            answer.status().is_success().then_some(())
        })
        .await;
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// The texts Telegram was sent, in order.
async fn texts(telegram: &MockTelegram) -> Vec<String> {
    telegram
        .sent()
        .await
        .iter()
        .map(|body: &Value| body["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Waits until Telegram got `n` messages, then a moment more, so one too many shows.
async fn settled_texts(telegram: &MockTelegram, n: usize) -> Vec<String> {
    telegram.wait_for_sends(n).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    texts(telegram).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_is_answered_on_time_once_and_caught_up_once_after_downtime() {
    let model = MockModel::start(Behaviour::Echo).await;
    let telegram = MockTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let clock = ManualClock::new(utc("2026-12-04T08:59"));

    let app = App::start(config(&model, &telegram, &store), &clock).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(texts(&telegram).await.is_empty(), "nothing is due yet");

    clock.set(utc("2026-12-04T09:00"));
    let mut sent = settled_texts(&telegram, 2).await;
    sent.sort();
    assert_eq!(sent, ["echo: morning report", "echo: quiet report"]);
    let bodies = telegram.sent().await;
    assert!(
        bodies.iter().all(|body| body["chat_id"] == 42),
        "{bodies:?}"
    );
    assert_eq!(model.requests().len(), 2, "one turn each");

    // A restart the same day: nothing runs again.
    app.stop().await;
    clock.set(utc("2026-12-04T09:30"));
    let app = App::start(config(&model, &telegram, &store), &clock).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(texts(&telegram).await.len(), 2);
    app.stop().await;

    // Down for three days: `once` catches up one firing, `skip` none.
    clock.set(utc("2026-12-07T12:00"));
    let app = App::start(config(&model, &telegram, &store), &clock).await;
    let sent = settled_texts(&telegram, 3).await;
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[2], "echo: morning report");
    assert_eq!(model.requests().len(), 3);

    // And on time again the next day, both.
    clock.set(utc("2026-12-08T09:00"));
    let sent = settled_texts(&telegram, 5).await;
    assert_eq!(sent.len(), 5, "{sent:?}");
    app.stop().await;
}

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const USER_TOKEN: &str = "user-token-0123456789a";

/// Posts `text` on `conversation` with `token` and waits for the reply: (reply, thread id).
async fn ask(base: &str, token: &str, conversation: &str, text: &str) -> (String, String) {
    let answer: Value = reqwest::Client::new()
        .post(format!("{base}/api/v1/messages"))
        .bearer_auth(token)
        .json(&serde_json::json!({"conversation": conversation, "text": text, "wait": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        answer["reply"].as_str().unwrap_or_default().to_owned(),
        answer["thread_id"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_add_list_and_remove_schedules_in_chat_and_they_fire_there() {
    let model = MockModel::start(Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[store]
path = {store:?}
[model]
base_url = "{model}"
model = "{name}"
[agent]
timezone = "Europe/Berlin"
[agent.middleware.title]
use_model = false
[memory]
enabled = false
[channels.api]
token = "{ADMIN_TOKEN}"
[[channels.api.tokens]]
token = "{USER_TOKEN}"
user = "ana"
"#,
        store = dir.path().join("store").display().to_string(),
        model = model.base_url(),
        name = antler_testkit::mock_model::MODEL_NAME,
    );
    let config = Config::from_toml_str(&text, &|_| None).unwrap();
    let clock = ManualClock::new(utc("2026-12-04T08:05"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_with_clock(
        config,
        listener,
        async move {
            let _ = stopped.await;
        },
        Arc::new(clock.clone()),
    ));
    let app = App { stop, task };

    let (refused, _) = ask(&base, USER_TOKEN, "ops", r#"/schedule add x "every 1h" hi"#).await;
    assert_eq!(refused, "Only admins can add or remove schedules.");
    let (added, thread) = ask(
        &base,
        ADMIN_TOKEN,
        "ops",
        r#"/schedule add ticks "every 15m" status please"#,
    )
    .await;
    assert_eq!(
        added,
        "Schedule ticks added: every 15m; next run 2026-12-04 08:15 UTC."
    );
    let (bad, _) = ask(
        &base,
        ADMIN_TOKEN,
        "ops",
        r#"/schedule add daily "0 9 * *" hi"#,
    )
    .await;
    assert!(
        bad.starts_with("Not added: the time must have five fields"),
        "{bad}"
    );
    let (berlin, _) = ask(
        &base,
        ADMIN_TOKEN,
        "ops",
        r#"/schedule add daily "0 9 * * *" hi"#,
    )
    .await;
    assert!(
        berlin.contains("0 9 \\* \\* \\* (Europe/Berlin); next run 2026-12-05 09:00 CET"),
        "{berlin}"
    );
    let (listed, _) = ask(&base, ADMIN_TOKEN, "ops", "/schedules").await;
    assert!(
        listed.contains("• ticks — every 15m — next run 2026-12-04 08:15 UTC"),
        "{listed}"
    );
    let (elsewhere, _) = ask(&base, USER_TOKEN, "ops", "/schedules").await;
    assert!(
        elsewhere.starts_with("No schedules here."),
        "ana's `ops` is hers: {elsewhere}"
    );

    // It fires into the conversation it was made in, answered there.
    clock.set(utc("2026-12-04T08:15"));
    let http = reqwest::Client::new();
    wait_until("the scheduled turn's answer in the thread", || async {
        let view: Value = http
            .get(format!("{base}/api/v1/threads/{thread}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        view.to_string()
            .contains("echo: status please")
            .then_some(())
    })
    .await;

    let (removed, _) = ask(&base, ADMIN_TOKEN, "ops", "/schedule remove ticks").await;
    assert_eq!(removed, "Schedule ticks removed.");
    let (again, _) = ask(&base, ADMIN_TOKEN, "ops", "/schedule remove ticks").await;
    assert_eq!(again, "there is no schedule named ticks.");
    app.stop().await;
}
