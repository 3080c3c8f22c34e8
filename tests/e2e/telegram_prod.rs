//! Telegram in production (issue 24): updates and Bot API answers as the real platform sends
//! them, beyond what teloxide models, each reproduced end to end against the mock Bot API.

use antler_testkit::telegram::{MockTelegram, SECRET, fixture, post};
use reqwest::StatusCode;

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{TestApp, metric_value};

/// Posts each recorded update `names` to the webhook; Telegram hears 200 for each.
async fn post_all(base: &str, names: &[&str]) {
    for name in names {
        assert_eq!(
            post(base, &fixture(name), Some(SECRET)).await,
            StatusCode::OK,
            "{name}"
        );
    }
}

/// The texts of the first `n` answers once antler is idle, sorted (turns of different chats
/// end in any order).
async fn sorted_answers(api: &MockTelegram, app: &TestApp, n: usize) -> Vec<String> {
    api.wait_for_sends(n).await;
    app.wait_idle().await;
    let mut texts: Vec<String> = api
        .sent()
        .await
        .iter()
        .map(|body| body["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    texts.sort();
    texts
}

/// Bot API: "external_reply: Information about the message that is being replied to, which may
/// come from another chat or forum topic"; MessageEntity types grow with the API (`date_time`);
/// `paid_media` and an `Audio` whose `mime_type` is "Optional" are real messages too. teloxide
/// cannot model any of these and turns the whole message into an empty `UpdateKind::Error`;
/// Telegram never redelivers an update answered 200, so each must still be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_teloxide_cannot_model_are_still_read_and_answered() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    post_all(
        &app.base,
        &[
            "tg_external_reply",
            "tg_new_entity",
            "tg_paid_media_caption",
            "tg_audio_no_mime",
        ],
    )
    .await;
    let texts = sorted_answers(&api, &app, 4).await;
    assert_eq!(
        texts,
        [
            "echo: pause deploys until 2026-12-05 09:00",
            "echo: summarize the dashboard I shared",
            "echo: transcribe the on-call handover",
            "echo: why did this alert fire?",
        ]
    );
    assert_eq!(model.count(), 4);

    // A message with no chat cannot be answered: acknowledged, logged and counted, not lost
    // silently.
    let unreadable = fixture("tg_private_text")
        .replace("730100001", "730100077")
        .replace("\"chat\"", "\"chat_was_here\"");
    assert_eq!(
        post(&app.base, &unreadable, Some(SECRET)).await,
        StatusCode::OK
    );
    let metrics = app.get("/metrics").await.text;
    assert!(
        metric_value(&metrics, "antler_telegram_unreadable_updates_total") >= Some(1.0),
        "{metrics}"
    );
    app.shutdown().await;
}

/// Polling reads the same way: `getUpdates` hands over the updates' JSON, not teloxide's lossy
/// model of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polled_messages_teloxide_cannot_model_are_answered_too() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling_update("", "tg_audio_no_mime").await;
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::start(&model, &dir.path().join("store"), &api.polling_config()).await;
    let sent = api.wait_for_sends(1).await;
    assert_eq!(sent[0]["text"], "echo: transcribe the on-call handover");
    app.wait_idle().await;
    app.shutdown().await;
}

/// Bot API: a failed request is `{"ok": false, "error_code": N, "description": "…"}`; Telegram
/// answers its 5xx that way (502 Bad Gateway, 500 "Internal Server Error: restart", 503). They
/// pass: the answer is tried again with delivery's backoff, not dropped after one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_errors_from_telegram_are_retried_and_the_answer_arrives_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    api.server_error_next_sends(&[
        (502, "Bad Gateway"),
        (500, "Internal Server Error: restart"),
        (503, "Service Unavailable"),
    ])
    .await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    assert_eq!(
        post(&app.base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(4).await;
    app.wait_idle().await;
    assert!(
        sent.iter()
            .all(|body| body["text"] == "echo: status payments-api"),
        "{sent:?}"
    );
    assert_eq!(api.sent().await.len(), 4, "three refused, one delivered");
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

/// Bot API, Message: "from: Sender of the message; may be empty for messages sent to channels.
/// For backward compatibility, if the message was sent on behalf of a chat, the field contains
/// a fake sender user in non-channel chats"; "sender_chat: Sender of the message when sent on
/// behalf of a chat. For example, the supergroup itself for messages sent by its anonymous
/// administrators or a linked channel for messages automatically forwarded to the channel's
/// discussion group". The fake sender (GroupAnonymousBot, Channel_Bot) is a bot; the person
/// behind it is not, and the allowlist names them by `sender_chat`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_admins_and_people_posting_as_a_channel_are_answered() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let config = api.config("allowed_users = [\"-1002200330044\", \"-1001999888777\"]\n");
    let app = TestApp::spawn(&model, &config).await;
    post_all(&app.base, &["tg_anonymous_admin", "tg_channel_sender"]).await;
    // A linked channel's post, forwarded automatically to its discussion group, is nobody
    // talking to the bot.
    let forwarded = fixture("tg_channel_sender")
        .replace("730100022", "730100023")
        .replace("\"text\":", "\"is_automatic_forward\": true, \"text\":");
    assert_eq!(
        post(&app.base, &forwarded, Some(SECRET)).await,
        StatusCode::OK
    );
    let texts = sorted_answers(&api, &app, 2).await;
    assert_eq!(texts, ["echo: freeze deploys", "echo: who is on call?"]);
    assert_eq!(model.count(), 2);
    app.shutdown().await;
}

/// A forum topic closed or deleted while its question was answered: Telegram refuses
/// `sendMessage` into it with 400 "Bad Request: TOPIC_CLOSED" or "Bad Request: message thread
/// not found". The answer goes to the chat's General topic (no `message_thread_id`) with a note,
/// not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_closed_or_deleted_topic_goes_to_general_with_a_note() {
    for refusal in [
        "Bad Request: TOPIC_CLOSED",
        "Bad Request: message thread not found",
    ] {
        let model = MockModel::start(Behaviour::Echo).await;
        let api = MockTelegram::start().await;
        api.refuse_topic(400, refusal).await;
        let app = TestApp::spawn(&model, &api.config("")).await;
        assert_eq!(
            post(&app.base, &fixture("tg_forum_topic"), Some(SECRET)).await,
            StatusCode::OK
        );
        let sent = api.wait_for_sends(2).await;
        app.wait_idle().await;
        let sent_now = api.sent().await;
        assert_eq!(
            sent_now.len(),
            2,
            "{refusal}: refused once, then sent: {sent:?}"
        );
        assert_eq!(sent[0]["message_thread_id"], 400);
        let general = &sent[1];
        assert_eq!(general["chat_id"], -1_003_300_440_055i64);
        assert_eq!(general.get("message_thread_id"), None, "{general}");
        let text = general["text"].as_str().unwrap();
        assert!(text.contains("echo: tail logs worker"), "{text}");
        assert!(text.contains("topic"), "a note says why it is here: {text}");
        app.shutdown().await;
    }
}

/// Bot API, Formatting options: bold, italic and strikethrough "can contain and can be part of
/// any other entities, except pre and code"; "blockquote [...] entities can't be nested"; "All
/// other entities can't contain each other" (so no `code` inside a link). The mock refuses
/// those nestings as Telegram does; the answer must arrive as HTML in one message, not as the
/// plain-text fallback after a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_never_nest_what_telegram_html_forbids() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let markdown = "**run `make deploy`** then [`docs`](https://example.com/d) ~~`old`~~\\n\\n> quoted\\n>\\n> > nested **`x`**";
    let update = fixture("tg_private_text").replace(
        "\"text\": \"status payments-api\"",
        &format!("\"text\": \"{markdown}\""),
    );
    assert_eq!(post(&app.base, &update, Some(SECRET)).await, StatusCode::OK);
    api.wait_for_sends(1).await;
    app.wait_idle().await;
    let sent = api.sent().await;
    assert_eq!(sent.len(), 1, "refused once and sent again plain: {sent:?}");
    assert_eq!(sent[0]["parse_mode"], "HTML");
    let html = sent[0]["text"].as_str().unwrap();
    assert!(!antler_testkit::telegram::refused_nesting(html), "{html}");
    assert!(
        html.contains("make deploy") && html.contains("<blockquote>"),
        "{html}"
    );
    assert!(html.contains("nested"), "{html}");
    app.shutdown().await;
}

/// A sticker, a voice note or a location in a private chat has nothing antler can read yet;
/// the person is told so (as on Feishu) rather than left waiting, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_stickers_voice_notes_and_locations_get_a_cant_read_notice() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    post_all(&app.base, &["tg_sticker", "tg_voice", "tg_location"]).await;
    let texts = sorted_answers(&api, &app, 3).await;
    assert_eq!(texts.len(), 3);
    for (text, kind) in texts.iter().zip(["location", "sticker", "voice message"]) {
        assert!(
            text.contains("can't read") && text.contains(kind),
            "{kind}: {text}"
        );
    }
    assert_eq!(model.count(), 0);
    app.shutdown().await;
}

/// A group upgraded to a supergroup while its question was answered: Telegram refuses the old
/// id with `parameters.migrate_to_chat_id`; the answer goes to the new id instead of being
/// dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_group_that_became_a_supergroup_goes_to_the_new_id() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    api.migrate_group(-4_004_004_004, -1_004_004_004_004).await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let update = fixture("tg_group_mention")
        .replace("-1002200330044", "-4004004004")
        .replace("\"supergroup\"", "\"group\"");
    assert_eq!(post(&app.base, &update, Some(SECRET)).await, StatusCode::OK);
    let sent = api.wait_for_sends(2).await;
    app.wait_idle().await;
    assert_eq!(api.sent().await.len(), 2, "{sent:?}");
    assert_eq!(sent[0]["chat_id"], -4_004_004_004i64);
    assert_eq!(sent[1]["chat_id"], -1_004_004_004_004i64);
    assert_eq!(sent[1]["text"], "echo: 🚀 restart web-api");
    assert_eq!(
        sent[1].get("reply_parameters"),
        None,
        "the old message ids do not exist in the new chat"
    );
    app.shutdown().await;
}

/// The user text of `request`'s last user message, whole (`<uploaded_files>` included).
fn last_user_message(request: &crate::support::mock_model::Recorded) -> String {
    request
        .messages()
        .iter()
        .rev()
        .find(|message| message["role"] == "user")
        .map(|message| message["content"].to_string())
        .unwrap_or_default()
}

/// Bot API, Message: "media_group_id: The unique identifier of a media message group this
/// message belongs to". An album of two photos arrives as two updates, the caption on one;
/// it is one message: one turn with both files and the caption, answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_album_is_one_message_with_all_its_files_answered_once() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    api.serve_files().await;
    let app = TestApp::spawn(&model, &api.config("")).await;
    let (one, two) = (fixture("tg_album_1"), fixture("tg_album_2"));
    let (first, second) = tokio::join!(
        post(&app.base, &one, Some(SECRET)),
        post(&app.base, &two, Some(SECRET)),
    );
    assert_eq!((first, second), (StatusCode::OK, StatusCode::OK));
    let sent = api.wait_for_sends(1).await;
    app.wait_idle().await;
    assert_eq!(api.sent().await.len(), 1, "{sent:?}");
    assert!(
        sent[0]["text"].as_str().is_some_and(
            |text| text.starts_with("echo: compare the latency before and after the deploy")
        ),
        "{sent:?}"
    );
    assert_eq!(model.count(), 1, "one turn for the album");
    let requests = model.requests();
    let asked = last_user_message(&requests[0]);
    assert!(
        asked.contains("photo_AQADone.jpg") && asked.contains("photo_AQADtwo.jpg"),
        "both photos reach the model: {asked}"
    );
    assert_eq!(api.calls("GetFile").await.len(), 2);

    // Telegram delivering a part again changes nothing.
    assert_eq!(
        post(&app.base, &fixture("tg_album_2"), Some(SECRET)).await,
        StatusCode::OK
    );
    app.wait_idle().await;
    assert_eq!(api.sent().await.len(), 1);
    assert_eq!(model.count(), 1);
    app.shutdown().await;
}

/// Each part of an album is durable before Telegram hears 200; a crash while the album's turn
/// runs leaves both in the inbox, and after the restart the album is answered once, still as
/// one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_album_whose_turn_a_crash_cut_short_is_answered_once_after_the_restart() {
    let model = MockModel::start(Behaviour::Echo).await;
    model.hold();
    let api = MockTelegram::start().await;
    api.serve_files().await;
    let rig = crate::support::ChildRig::new(&model, &api.config(""));
    let mut first = rig.serve().await;
    let base = format!("http://127.0.0.1:{}", rig.port);
    let (one, two) = (fixture("tg_album_1"), fixture("tg_album_2"));
    let (one, two) = tokio::join!(
        post(&base, &one, Some(SECRET)),
        post(&base, &two, Some(SECRET)),
    );
    assert_eq!((one, two), (StatusCode::OK, StatusCode::OK));
    model.wait_for_requests(1).await;
    first.kill().await;

    model.release();
    let second = rig.serve().await;
    let sent = api.wait_for_sends(1).await;
    second.wait_idle().await;
    assert_eq!(api.sent().await.len(), 1, "{sent:?}\n{}", second.log_text());
    assert_eq!(
        model.count(),
        2,
        "the cut turn ran once more, and only once"
    );
    let requests = model.requests();
    let asked = last_user_message(&requests[1]);
    assert!(
        asked.contains("photo_AQADone.jpg") && asked.contains("photo_AQADtwo.jpg"),
        "{asked}"
    );
    drop(second);
}

/// Bot API, Message: "migrate_to_chat_id: The group has been migrated to a supergroup with the
/// specified identifier"; "migrate_from_chat_id: The supergroup has been migrated from a group
/// with the specified identifier". The conversation moves with the chat: the supergroup goes on
/// with the group's thread, and is allowed where the group was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_upgraded_to_a_supergroup_keeps_its_conversation_and_its_access() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("allowed_chats = [\"-4004004004\"]\n")).await;
    let in_group = fixture("tg_group_mention")
        .replace("-1002200330044", "-4004004004")
        .replace("\"supergroup\"", "\"group\"");
    assert_eq!(
        post(&app.base, &in_group, Some(SECRET)).await,
        StatusCode::OK
    );
    api.wait_for_sends(1).await;
    app.wait_idle().await;

    post_all(&app.base, &["tg_migrate_to", "tg_migrate_from"]).await;
    let in_supergroup = fixture("tg_group_mention")
        .replace("730100002", "730100042")
        .replace("-1002200330044", "-1004004004004")
        .replace("restart web-api", "is web-api back?");
    assert_eq!(
        post(&app.base, &in_supergroup, Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(2).await;
    app.wait_idle().await;
    assert_eq!(sent[1]["chat_id"], -1_004_004_004_004i64);
    assert_eq!(
        sent[1]["text"], "echo: 🚀 is web-api back?",
        "allowed as the group was, not refused"
    );
    assert_eq!(model.count(), 2, "the service messages ran nothing");
    let requests = model.requests();
    let history = requests[1].messages_without_context();
    assert!(
        history
            .iter()
            .any(|message| message["content"].to_string().contains("restart web-api")),
        "the supergroup goes on with the group's thread: {history:?}"
    );
    assert_eq!(api.sent().await.len(), 2);
    app.shutdown().await;
}

/// A polling bot has no `set-webhook` to set its command menu: `serve` sets it at start when
/// Telegram's differs (Bot API, setMyCommands: "Use this method to change the list of the
/// bot's commands").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_bot_sets_its_command_menu_at_start() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, ResponseTemplate};
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling("").await;
    let token = antler_testkit::telegram::TOKEN;
    Mock::given(method("POST"))
        .and(path(format!("/bot{token}/GetMyCommands")))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(serde_json::json!({"ok": true, "result": []})),
        )
        .mount(&api)
        .await;
    Mock::given(method("POST"))
        .and(path(format!("/bot{token}/SetMyCommands")))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"ok": true, "result": true})),
        )
        .mount(&api)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::start(&model, &dir.path().join("store"), &api.polling_config()).await;
    let set = antler_testkit::wait_until("the menu is set", || async {
        let calls = api.calls("SetMyCommands").await;
        (!calls.is_empty()).then_some(calls)
    })
    .await;
    let commands: Vec<&str> = set[0]["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["command"].as_str())
        .collect();
    assert!(
        commands.contains(&"new") && commands.contains(&"stop"),
        "{commands:?}"
    );
    api.wait_for_sends(1).await;
    app.wait_idle().await;
    app.shutdown().await;
}

/// An idle antler, polling Telegram, stops on SIGTERM cleanly: exit 0, nothing logged at warn
/// or above while it stops (the long poll is cancelled, the store closed). Measured: ~20 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_polling_antler_stops_cleanly_on_sigterm() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start_polling("").await;
    let rig = crate::support::ChildRig::new(&model, &api.polling_config());
    let mut child = rig.serve().await;
    api.wait_for_sends(1).await;
    child.wait_idle().await;
    let status = crate::support::sigterm(&mut child.process).await;
    assert!(status.success(), "{status}\n{}", child.log_text());
    let log = child.log_text();
    let (_, stopping) = log
        .split_once("shutting down")
        .unwrap_or_else(|| panic!("no shutdown logged: {log}"));
    assert!(stopping.contains("stopped"), "{log}");
    let complaints: Vec<&str> = stopping
        .lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect();
    assert!(complaints.is_empty(), "{complaints:#?}");
}

/// Bot API: a revoked token is answered 401 "Unauthorized". Polling goes on trying (the
/// operator may fix the token), but `/readyz` shows Telegram unhealthy, with why, until
/// `getUpdates` works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_shows_telegram_unhealthy_in_readyz_until_polling_works_again() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, ResponseTemplate};
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let updates = format!("/bot{}/GetUpdates", antler_testkit::telegram::TOKEN);
    Mock::given(method("POST"))
        .and(path(updates.clone()))
        .respond_with(ResponseTemplate::new(401).set_body_json(serde_json::json!({
            "ok": false, "error_code": 401, "description": "Unauthorized"
        })))
        .mount(&api)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::start(&model, &dir.path().join("store"), &api.polling_config()).await;
    let telegram = |readyz: serde_json::Value| readyz["channels"]["telegram"].clone();
    let refused = antler_testkit::wait_until("telegram is unhealthy", || async {
        let readyz = app.get("/readyz").await.json;
        (telegram(readyz.clone())["ok"] == false).then_some(readyz)
    })
    .await;
    assert_eq!(
        refused["ready"], true,
        "a refused token does not make antler unready"
    );
    let state = telegram(refused.clone());
    assert_eq!(state["state"], "reconnecting", "{state}");
    assert!(
        state["refused"]
            .as_str()
            .is_some_and(|why| why.contains("channels.telegram.bot_token")),
        "{state}"
    );
    assert!(
        refused["version"].is_string() && refused["uptime_secs"].is_u64(),
        "{refused}"
    );
    // The series is there; its value is not checked here: the metrics recorder is the
    // process's, shared with the other apps these tests run at once, whose Telegram is healthy.
    let metrics = app.get("/metrics").await.text;
    assert!(
        metrics.contains("antler_channel_healthy{channel=\"telegram\"}"),
        "{metrics}"
    );

    // The token works again (here: the Bot API answers): healthy at once.
    api.reset().await;
    Mock::given(method("POST"))
        .and(path(updates))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"ok": true, "result": []}))
                .set_delay(std::time::Duration::from_millis(100)),
        )
        .mount(&api)
        .await;
    let healthy = antler_testkit::wait_until("telegram is healthy again", || async {
        let state = telegram(app.get("/readyz").await.json);
        (state["ok"] == true).then_some(state)
    })
    .await;
    assert_eq!(healthy["state"], "connected", "{healthy}");
    assert!(healthy.get("refused").is_none(), "{healthy}");
    app.shutdown().await;
}

/// SIGHUP reads the configuration again: a new allowlist, system prompt and log level apply at
/// once, a turn running meanwhile is answered, and what needs a restart is named (before,
/// SIGHUP killed antler).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_allowlist_without_dropping_a_turn() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let rig =
        crate::support::ChildRig::new(&model, &api.config("allowed_users = [\"5550001001\"]\n"));
    // Without RUST_LOG, `server.log_level` decides, and SIGHUP changes it.
    let mut child =
        crate::support::Child::serve_with_env(&rig.config, rig.port, &rig.log, &[("RUST_LOG", "")])
            .await;
    let base = format!("http://127.0.0.1:{}", rig.port);
    let bob = |update: &str, text: &str| {
        fixture("tg_private_text")
            .replace("730100001", update)
            .replace("5550001001", "5550001002")
            .replace("status payments-api", text)
    };
    // Bob is not on the list: refused.
    assert_eq!(
        post(&base, &bob("730100051", "hello"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(1).await;
    assert!(
        sent[0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Sorry")),
        "{sent:?}"
    );

    // Ada's turn is running when the configuration changes.
    model.hold();
    assert_eq!(
        post(&base, &fixture("tg_private_text"), Some(SECRET)).await,
        StatusCode::OK
    );
    model.wait_for_requests(1).await;
    let config = std::fs::read_to_string(&rig.config).unwrap();
    let changed = config
        .replace(
            "allowed_users = [\"5550001001\"]",
            "allowed_users = [\"5550001001\", \"5550001002\"]",
        )
        .replace(
            "[server]\n",
            "[server]\nmax_connections = 77\nlog_level = \"info,antler=debug\"\n",
        )
        .replace(
            "[model]\n",
            "[model]\nsystem_prompt = \"Answer like a pirate.\"\n",
        );
    assert_ne!(changed, config);
    std::fs::write(&rig.config, changed).unwrap();
    assert!(
        !child.log_text().contains("log level applied"),
        "a debug line, hidden at the first level"
    );
    child.reload().await;
    let log = child.log_text();
    assert!(
        log.contains("restart=[\"server\"]"),
        "the log level is not a restart: {log}"
    );
    assert!(log.contains("log level applied"), "now at debug: {log}");
    model.release();
    let sent = api.wait_for_sends(2).await;
    assert_eq!(
        sent[1]["text"], "echo: status payments-api",
        "the turn went on"
    );

    // Bob may talk now.
    assert_eq!(
        post(&base, &bob("730100052", "hello again"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(3).await;
    assert_eq!(sent[2]["text"], "echo: hello again");
    let requests = model.requests();
    let pirate = |n: usize| {
        requests[n].messages()[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Answer like a pirate.")
    };
    assert!(!pirate(0), "the held run kept its prompt");
    assert!(
        pirate(requests.len() - 1),
        "the next run has the new system prompt"
    );
    assert!(child.process.try_wait().unwrap().is_none(), "still running");
    let status = crate::support::sigterm(&mut child.process).await;
    assert!(status.success());
}
