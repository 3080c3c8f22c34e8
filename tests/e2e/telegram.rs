//! Telegram end to end: signed webhooks in through `POST /webhooks/telegram`, the real runtime
//! with the mock model, answers out to a mock Bot API (teloxide capitalises method names:
//! `/bot<token>/SendMessage`).

use std::time::{Duration, Instant};

use antler_testkit::telegram::{MockTelegram, SECRET, fixture, post};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, TestApp, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_message_is_answered_once_even_when_delivered_twice() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let update = fixture("tg_private_text");
    assert_eq!(post(&app.base, &update, Some(SECRET)).await, StatusCode::OK);
    assert_eq!(post(&app.base, &update, Some(SECRET)).await, StatusCode::OK);

    let sent = api.wait_for_sends(1).await;
    assert_eq!(sent[0]["chat_id"], 5_550_001_001u64);
    assert_eq!(sent[0]["text"], "echo: status payments-api");
    assert_eq!(sent[0]["parse_mode"], "HTML");
    assert_eq!(sent[0].get("reply_parameters"), None);
    app.wait_idle().await;
    assert_eq!(
        api.sent().await.len(),
        1,
        "the redelivery is not answered again"
    );
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_secret_is_refused_and_nothing_runs() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let update = fixture("tg_private_text");
    assert_eq!(
        post(&app.base, &update, None).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        post(&app.base, &update, Some("hook-secret_2")).await,
        StatusCode::UNAUTHORIZED
    );
    // Refused before anything was stored: there is no turn to wait for.
    app.wait_idle().await;
    assert_eq!(model.count(), 0);
    assert!(api.sent().await.is_empty());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_groups_only_mentions_are_answered_as_replies_and_topics_stay_in_their_topic() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;

    // Not addressed: acknowledged, and nothing runs.
    let plain = fixture("tg_group_mention")
        .replace("730100002", "730100099")
        .replace("🚀 @opsbot_bot restart web-api", "restart web-api please")
        .replace(
            "{\"offset\": 3, \"length\": 11, \"type\": \"mention\"}",
            "{\"offset\": 0, \"length\": 7, \"type\": \"bold\"}",
        );
    assert_eq!(post(&app.base, &plain, Some(SECRET)).await, StatusCode::OK);

    assert_eq!(
        post(&app.base, &fixture("tg_group_mention"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(1).await;
    assert_eq!(sent[0]["chat_id"], -1_002_200_330_044i64);
    assert_eq!(sent[0]["text"], "echo: 🚀 restart web-api");
    assert_eq!(sent[0]["reply_parameters"]["message_id"], 88);

    assert_eq!(
        post(&app.base, &fixture("tg_forum_topic"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(2).await;
    assert_eq!(sent[1]["chat_id"], -1_003_300_440_055i64);
    assert_eq!(sent[1]["message_thread_id"], 400);
    assert_eq!(sent[1]["text"], "echo: tail logs worker");

    app.wait_idle().await;
    assert_eq!(
        model.count(),
        2,
        "the plain group message never reached the model"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_from_telegram_delays_the_answer_and_it_still_arrives_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    // The first SendMessage is refused with Telegram's 429; the next one goes through.
    api.rate_limit_next_send(1).await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post(&app.base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(2).await;
    assert_eq!(
        sent[0]["text"], sent[1]["text"],
        "the refused message went again"
    );
    app.wait_idle().await;
    assert_eq!(
        api.sent().await.len(),
        2,
        "delivered once after the refusal"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_markdown_answer_arrives_as_several_valid_messages() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let mut text = String::new();
    for i in 0..45 {
        text.push_str(&format!(
            "Step {i}: **check** the <service> & its logs.\n\n```sh\nkubectl logs deploy/web-{i} | grep -c '<error>'\n```\n\n"
        ));
        text.push_str(&"more words here ".repeat(8));
        text.push_str("\n\n");
    }
    assert!(text.len() > 10_000);
    let update = fixture("tg_private_text").replace(
        "\"text\": \"status payments-api\"",
        &format!("\"text\": {}", serde_json::to_string(&text).unwrap()),
    );
    assert_eq!(post(&app.base, &update, Some(SECRET)).await, StatusCode::OK);
    app.wait_idle().await;
    let sent = api.wait_for_sends(3).await;
    let mut words = 0;
    for body in &sent {
        let html = body["text"].as_str().unwrap();
        assert!(
            html.encode_utf16().count() <= 4096,
            "{} units",
            html.encode_utf16().count()
        );
        assert_eq!(
            html.matches("<pre>").count(),
            html.matches("</pre>").count(),
            "{html}"
        );
        assert_eq!(
            html.matches("<b>").count(),
            html.matches("</b>").count(),
            "{html}"
        );
        assert!(
            !html.contains("<service>") && !html.contains("<error>"),
            "escaped: {html}"
        );
        words += html.matches("more words here").count();
    }
    assert_eq!(words, 45 * 8, "nothing lost between the chunks");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_outside_the_allowlist_gets_one_refusal_with_their_id_and_no_model_call() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("allowed_users = [\"42\"]\n")).await;
    assert_eq!(
        post(&app.base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    let second = fixture("tg_private_text").replace("730100001", "730100002");
    assert_eq!(post(&app.base, &second, Some(SECRET)).await, StatusCode::OK);
    let sent = api.wait_for_sends(1).await;
    let refusal = sent[0]["text"].as_str().unwrap();
    assert!(
        refusal.contains("not allowed") && refusal.contains("5550001001"),
        "{refusal}"
    );
    app.wait_idle().await;
    assert_eq!(api.sent().await.len(), 1, "one refusal an hour");
    assert_eq!(model.count(), 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bot_shows_it_is_typing_while_the_turn_runs() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post(&app.base, &fixture("tg_forum_topic"), Some(SECRET)).await,
        StatusCode::OK
    );
    // While the model holds the answer, the topic shows "typing…".
    let action = wait_until("a typing indicator", || async {
        api.received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .find(|r| r.url.path().ends_with("/SendChatAction"))
            .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
    })
    .await;
    assert_eq!(action["chat_id"], -1_003_300_440_055i64);
    assert_eq!(action["action"], "typing");
    assert_eq!(action["message_thread_id"], 400);
    model.release();
    api.wait_for_sends(1).await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_streams_into_one_draft_that_ends_as_the_answer() {
    // About 4 seconds of stream; private chats are edited at most once a second.
    let model = MockModel::start(Behaviour::Trickle {
        pieces: 6,
        every: std::time::Duration::from_millis(700),
    })
    .await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post(&app.base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    api.wait_for_sends(1).await;
    // Idle: the answer was delivered, and the draft writer stopped before it was.
    app.wait_idle().await;
    let sent = api.sent().await;
    assert_eq!(sent.len(), 1, "one message, the draft: {sent:?}");
    let draft = sent[0]["text"].as_str().unwrap();
    assert!(
        !draft.is_empty() && "echo: status payments-api".starts_with(draft),
        "the draft holds the start of the answer: {draft}"
    );
    let edits = api.calls("EditMessageText").await;
    assert!(
        edits.len() >= 2,
        "edited while writing, then finished: {edits:?}"
    );
    assert_eq!(
        edits.last().unwrap()["text"],
        "echo: status payments-api",
        "the last edit is the whole answer"
    );
    for edit in &edits {
        assert_eq!(edit["message_id"], 700);
        assert_eq!(edit["chat_id"], 5_550_001_001u64);
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_answers_updates_and_a_restart_does_not_answer_them_again() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling("").await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let app = TestApp::start(&model, &store, &api.polling_config()).await;
    let sent = api.wait_for_sends(1).await;
    assert_eq!(sent[0]["text"], "echo: status payments-api");
    // The update is confirmed by the next call, with an offset past it.
    wait_until("the update confirmed", || async {
        api.received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .any(|r| {
                r.url.path().ends_with("/GetUpdates")
                    && serde_json::from_slice::<Value>(&r.body)
                        .is_ok_and(|b| b["offset"] == 730100002)
            })
            .then_some(())
    })
    .await;
    app.wait_idle().await;
    app.shutdown().await;

    // A restart asks without an offset; this mock sends the same update again, as Telegram
    // does for one it never saw confirmed: recognised, not answered twice.
    let polls_before = api.received_requests().await.unwrap_or_default().len();
    let again = TestApp::start(&model, &store, &api.polling_config()).await;
    wait_until("the restarted poller asked Telegram", || async {
        (api.received_requests().await.unwrap_or_default().len() > polls_before + 2).then_some(())
    })
    .await;
    again.wait_idle().await;
    assert_eq!(
        api.sent().await.len(),
        1,
        "answered once across the restart"
    );
    assert_eq!(model.count(), 1);
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_refuses_to_start_while_a_webhook_is_set() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling("https://bot.example.com/webhooks/telegram").await;
    let dir = tempfile::tempdir().unwrap();
    let config = crate::support::config(
        &model.base_url(),
        &dir.path().join("store"),
        &api.polling_config(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = antler::serve(config, listener, async {})
        .await
        .expect_err("polling cannot start while a webhook is set");
    let text = error.to_string();
    assert!(
        text.contains("antler telegram delete-webhook") && text.contains("bot.example.com"),
        "{text}"
    );
    assert!(!text.contains("TEST-token"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_ack_and_a_restart_answer_exactly_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    // The model never answers while the first process lives: the turn stays in flight.
    model.hold();
    let api = MockTelegram::start().await;
    let rig = ChildRig::new(&model, &api.config(""));
    let mut first = rig.serve().await;
    let update = fixture("tg_private_text");
    assert_eq!(
        post(&first.base, &update, Some(SECRET)).await,
        StatusCode::OK
    );
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    api.wait_for_sends(1).await;
    // Telegram delivers the update again (it saw no answer before the crash): recognised.
    assert_eq!(
        post(&second.base, &update, Some(SECRET)).await,
        StatusCode::OK
    );
    second.client.wait_idle().await;
    let sent = api.sent().await;
    assert_eq!(sent.len(), 1, "{sent:?}\n{}", second.log_text());
    assert_eq!(sent[0]["text"], "echo: status payments-api");
    assert_eq!(
        model.count(),
        2,
        "the interrupted turn ran once more, and only once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_a_draft_in_flight_leaves_no_second_draft() {
    // A stream far longer than the test waits: the process dies while the draft is written.
    let model = MockModel::start(Behaviour::Trickle {
        pieces: 60,
        every: std::time::Duration::from_millis(500),
    })
    .await;
    let api = MockTelegram::start().await;
    let rig = ChildRig::new(&model, &api.config(""));
    let mut first = rig.serve().await;
    let update = fixture("tg_private_text");
    assert_eq!(
        post(&first.base, &update, Some(SECRET)).await,
        StatusCode::OK
    );
    // The draft exists and was edited once: its id was saved before that edit.
    wait_until("the draft edited once", || async {
        (!api.calls("EditMessageText").await.is_empty()).then_some(())
    })
    .await;
    first.kill().await;
    assert_eq!(api.sent().await.len(), 1);

    model.set_behaviour(Behaviour::Trickle {
        pieces: 4,
        every: std::time::Duration::from_millis(600),
    });
    let second = rig.serve().await;
    wait_until("the answer in the draft", || async {
        api.calls("EditMessageText")
            .await
            .last()
            .is_some_and(|edit| edit["text"] == "echo: status payments-api")
            .then_some(())
    })
    .await;
    second.client.wait_idle().await;
    let sent = api.sent().await;
    assert_eq!(
        sent.len(),
        1,
        "the re-run wrote into the old draft: {sent:?}\n{}",
        second.log_text()
    );
    for edit in api.calls("EditMessageText").await {
        assert_eq!(edit["message_id"], 700);
    }
}

/// The review's attack: the shell writes a file, presents it, then swaps it for a link to the
/// host's config before delivery. Delivery opens the file beneath the outputs folder with
/// links refused, so `sendDocument` never carries the config; a note says the file was not
/// sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presented_file_swapped_for_a_link_is_never_uploaded() {
    use crate::support::Step;
    let dir = crate::support::searchable_tempdir();
    let config = dir.path().join("antler.toml");
    std::fs::write(&config, "bot_token = \"HOST-CONFIG-SECRET\"\n").unwrap();
    let model = MockModel::start(Behaviour::Script(vec![
        Step::call(
            "write_file",
            json!({"path": "/mnt/user-data/outputs/report.txt", "content": "report"}),
        ),
        Step::call(
            "present_files",
            json!({"paths": ["/mnt/user-data/outputs/report.txt"]}),
        ),
        Step::call(
            "bash",
            json!({"command": format!(
                "cd /mnt/user-data/outputs && rm report.txt && ln -s {} report.txt && ls -l",
                config.display()
            )}),
        ),
        Step::text("Here is the report."),
    ]))
    .await;
    let api = MockTelegram::start().await;
    api.accept_documents().await;
    let app = TestApp::start(
        &model,
        &dir.path().join("store"),
        &api.config("admins = [\"5550001001\"]\n[agent.tools.bash]\nsandbox = \"none\"\n"),
    )
    .await;
    assert_eq!(
        post(&app.base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(2).await;
    app.wait_idle().await;
    let bash_result = model.requests()[3].messages().last().cloned().unwrap();
    assert!(
        bash_result["content"]
            .as_str()
            .unwrap()
            .contains("report.txt ->"),
        "the link was planted: {bash_result}"
    );
    assert_eq!(sent[0]["text"], "Here is the report.");
    let note = sent[1]["text"].as_str().unwrap();
    assert!(
        note.contains("report.txt was not sent") && note.contains("symbolic link"),
        "{note}"
    );
    let uploads = api
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path().ends_with("/SendDocument"))
        .count();
    assert_eq!(uploads, 0, "the swapped file was uploaded");
    let everything: Vec<u8> = api
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|r| r.body)
        .collect();
    assert!(!String::from_utf8_lossy(&everything).contains("HOST-CONFIG-SECRET"));
    app.shutdown().await;
}

/// How long antler may take to learn the bot's username once `getMe` works again: teloxide
/// holds back every 5xx answer for 10 s before returning it (teloxide-core's
/// `DELAY_ON_SERVER_ERROR`), so a retry begun during the outage ends 10 s later, and antler's
/// backoff then waits up to 5 s before the next one. Generous, so a loaded machine still passes.
const IDENTITY_DEADLINE: Duration = Duration::from_secs(120);

/// Polls `check` until it gives a value, for at most [`IDENTITY_DEADLINE`].
async fn wait_for_identity<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < IDENTITY_DEADLINE,
            "timed out after {IDENTITY_DEADLINE:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 24, finding 1, over the webhook: until `getMe` told the bot's username, a group message
/// `@opsbot_bot …` may be for the bot, so it is answered 503 and Telegram delivers it again
/// (Bot API, setWebhook: "In case of an unsuccessful request (a request with response HTTP
/// status code different from 2XY), we will repeat the request and give up after a reasonable
/// number of attempts"). A private message needs no username and is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_mention_before_get_me_answers_is_delivered_again_not_lost() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    api.set_get_me_down(true);
    let app = TestApp::spawn(&model, &api.config("")).await;
    let mention = fixture("tg_group_mention");
    assert_eq!(
        post(&app.base, &mention, Some(SECRET)).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "not acknowledged while the bot's username is unknown"
    );
    assert_eq!(
        post(&app.base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(1).await;
    assert_eq!(sent[0]["text"], "echo: status payments-api");
    app.wait_idle().await;
    assert_eq!(model.count(), 1, "the mention was neither stored nor run");

    api.set_get_me_down(false);
    // Telegram's redelivery, once antler's retry of getMe (with backoff) has succeeded.
    wait_for_identity("the redelivered mention is taken", || async {
        (post(&app.base, &mention, Some(SECRET)).await == StatusCode::OK).then_some(())
    })
    .await;
    let sent = api.wait_for_sends(2).await;
    assert_eq!(sent[1]["chat_id"], -1_002_200_330_044i64);
    assert_eq!(sent[1]["text"], "echo: 🚀 restart web-api");
    // A further redelivery of the same update is recognised.
    assert_eq!(
        post(&app.base, &mention, Some(SECRET)).await,
        StatusCode::OK
    );
    app.wait_idle().await;
    assert_eq!(api.sent().await.len(), 2, "the mention is answered once");
    assert_eq!(model.count(), 2, "the mention ran once");
    app.shutdown().await;
}

/// Issue 24, finding 1, over long polling: until `getMe` answered, a polled group mention is
/// not confirmed (Bot API, getUpdates: "An update is considered confirmed as soon as getUpdates
/// is called with an offset higher than its update_id"), so Telegram returns it again; once
/// the username is known it is answered once and confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_group_mention_before_get_me_answers_is_not_confirmed_until_then() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling_update("", "tg_group_mention").await;
    api.set_get_me_down(true);
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::start(&model, &dir.path().join("store"), &api.polling_config()).await;
    let update_id =
        serde_json::from_str::<Value>(&fixture("tg_group_mention")).unwrap()["update_id"]
            .as_i64()
            .unwrap();
    let polls = || async {
        api.received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.url.path().ends_with("/GetUpdates"))
            .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap_or_default())
            .collect::<Vec<Value>>()
    };
    // Telegram returned the mention at least twice: it was asked for again, not confirmed.
    wait_until("the mention polled twice", || async {
        (polls().await.len() >= 3).then_some(())
    })
    .await;
    assert!(
        polls()
            .await
            .iter()
            .all(|b| b["offset"].as_i64().is_none_or(|o| o <= update_id)),
        "confirmed while the bot's username is unknown: {:?}",
        polls().await
    );
    assert!(api.sent().await.is_empty());
    assert_eq!(model.count(), 0);

    api.set_get_me_down(false);
    let sent = wait_for_identity("the mention answered", || async {
        Some(api.sent().await).filter(|sent| !sent.is_empty())
    })
    .await;
    assert_eq!(sent[0]["chat_id"], -1_002_200_330_044i64);
    assert_eq!(sent[0]["text"], "echo: 🚀 restart web-api");
    wait_until("the mention confirmed", || async {
        polls()
            .await
            .iter()
            .any(|b| b["offset"] == update_id + 1)
            .then_some(())
    })
    .await;
    app.wait_idle().await;
    assert_eq!(api.sent().await.len(), 1, "answered once");
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

/// A press of `data` by `from` (id, first name) on the bot's message [`MESSAGE_ID`] in Ada's
/// private chat, as Telegram delivers a `callback_query` update.
fn press(update_id: u64, query_id: &str, from: (u64, &str), data: &str) -> String {
    json!({
        "update_id": update_id,
        "callback_query": {
            "id": query_id,
            "from": {"id": from.0, "is_bot": false, "first_name": from.1},
            "message": {
                "message_id": antler_testkit::telegram::MESSAGE_ID,
                "from": {"id": 7_000_000_001u64, "is_bot": true, "first_name": "Ops Bot", "username": "opsbot_bot"},
                "chat": {"id": 5_550_001_001u64, "first_name": "Ada", "type": "private"},
                "date": 1_767_225_700,
                "text": "⏸ Approval needed: current_time"
            },
            "chat_instance": "-88237128934",
            "data": data
        }
    })
    .to_string()
}

/// The answer the approved `current_time` call leads to, once it is sent.
async fn time_answer(api: &MockTelegram) -> Value {
    wait_until("the answer after the approval", || async {
        api.sent().await.into_iter().find(|m| {
            m["text"]
                .as_str()
                .is_some_and(|t| t.contains("The time is"))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_decided_once_with_its_buttons_and_a_stranger_is_refused_privately() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockTelegram::start().await;
    let config = format!(
        "{}\n[approvals]\ntools = [\"current_time\"]\napprovers = \"admins\"\n",
        api.config("admins = [\"5550001001\"]\n")
    );
    let app = TestApp::spawn(&model, &config).await;
    assert_eq!(
        post(&app.base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    // The reply, then the prompt: its own message, with the call and two buttons.
    let sent = api.wait_for_sends(2).await;
    let prompt = &sent[1];
    assert!(
        prompt["text"]
            .as_str()
            .unwrap()
            .contains("Approval needed: current_time"),
        "{prompt}"
    );
    let keyboard = prompt["reply_markup"]["inline_keyboard"][0]
        .as_array()
        .unwrap();
    assert_eq!(keyboard.len(), 2, "{prompt}");
    let approve = keyboard[0]["callback_data"].as_str().unwrap().to_owned();
    assert!(approve.starts_with("approve:"), "{approve}");
    assert!(
        keyboard[1]["callback_data"]
            .as_str()
            .unwrap()
            .starts_with("deny:")
    );
    app.wait_idle().await;
    assert_eq!(model.count(), 1, "the call waits");

    // Someone who is not an approver: told privately, and nothing changes.
    let stranger = press(730_100_501, "q-stranger", (5_550_001_002, "Lin"), &approve);
    assert_eq!(
        post(&app.base, &stranger, Some(SECRET)).await,
        StatusCode::OK
    );
    let answers = wait_until("the stranger's refusal", || async {
        let answers = api.calls("AnswerCallbackQuery").await;
        (!answers.is_empty()).then_some(answers)
    })
    .await;
    assert_eq!(answers[0]["callback_query_id"], "q-stranger");
    assert_eq!(answers[0]["show_alert"], true);
    assert!(
        answers[0]["text"]
            .as_str()
            .unwrap()
            .contains("only approvers")
    );
    app.wait_idle().await;
    assert!(api.calls("EditMessageText").await.is_empty());
    assert_eq!(model.count(), 1, "nothing ran");

    // The admin approves; the same press delivered again changes nothing.
    let admin = press(730_100_502, "q-admin", (5_550_001_001, "Ada"), &approve);
    assert_eq!(post(&app.base, &admin, Some(SECRET)).await, StatusCode::OK);
    assert_eq!(post(&app.base, &admin, Some(SECRET)).await, StatusCode::OK);
    let answer = time_answer(&api).await;
    assert_eq!(answer["chat_id"], 5_550_001_001u64);
    app.wait_idle().await;
    assert_eq!(
        model.count(),
        2,
        "the tool ran once, and the model was asked once more"
    );
    let edits = api.calls("EditMessageText").await;
    assert_eq!(
        edits.len(),
        2,
        "each approver's press shows the decision: {edits:?}"
    );
    for edit in &edits {
        assert_eq!(edit["message_id"], antler_testkit::telegram::MESSAGE_ID);
        let text = edit["text"].as_str().unwrap();
        assert!(
            text.contains("✅ Approved by Ada (telegram:5550001001) at "),
            "{text}"
        );
        assert!(edit.get("reply_markup").is_none(), "the buttons are gone");
    }
    let answers = api.calls("AnswerCallbackQuery").await;
    assert_eq!(answers.len(), 3);
    assert!(
        answers[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("✅ Approved")
    );
    assert!(
        answers[2]["text"].as_str().unwrap().contains("already"),
        "{}",
        answers[2]
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_polled_after_a_restart_resumes_the_waiting_call() {
    let model = MockModel::start(Behaviour::ToolThenAnswer).await;
    let api = MockTelegram::start_polling("").await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let config = format!(
        "{}admins = [\"5550001001\"]\n\n[approvals]\ntools = [\"current_time\"]\n",
        api.polling_config()
    );
    let app = TestApp::start(&model, &store, &config).await;
    let sent = api.wait_for_sends(2).await;
    let approve = sent[1]["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
        .as_str()
        .unwrap()
        .to_owned();
    app.wait_idle().await;
    app.shutdown().await;

    // Pressed while antler was down: the press waits in Telegram's queue.
    let pressed = press(
        730_100_002,
        "q-after-restart",
        (5_550_001_001, "Ada"),
        &approve,
    );
    api.poll_next(730_100_001, serde_json::from_str(&pressed).unwrap())
        .await;
    let again = TestApp::start(&model, &store, &config).await;
    let answer = time_answer(&api).await;
    assert_eq!(answer["chat_id"], 5_550_001_001u64);
    again.wait_idle().await;
    assert_eq!(model.count(), 2);
    let answers = api.calls("AnswerCallbackQuery").await;
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["callback_query_id"], "q-after-restart");
    assert_eq!(api.calls("EditMessageText").await.len(), 1);
    // Polling asks for presses too.
    let polls = api.calls("GetUpdates").await;
    assert!(
        polls
            .iter()
            .all(|p| p["allowed_updates"] == json!(["message", "callback_query"])),
        "{polls:?}"
    );
    again.shutdown().await;
}
