//! DM pairing end to end (issue 25), on Telegram with the mock Bot API: an unknown user who
//! writes privately gets a code naming their id, the same code when they ask again, and
//! nothing runs; `antler pairing approve` (the real binary, talking to the running serve
//! through its admin-only API) lets them talk at once, `--admin` as an admin; `deny` makes a
//! code unusable; approvals survive a restart. Slack DMs and Feishu p2p chats pair the same way.

use antler_testkit::telegram::{MockTelegram, SECRET, post};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::mock_model::{Behaviour, MockModel};
use crate::support::{ChildRig, run_binary};

const ADMIN_TOKEN: &str = "pairing-e2e-admin-token";
const ADA: u64 = 5_550_001_001;
const BOB: u64 = 5_550_001_002;

/// A private text message from `user` (Bot API `Update` with a `Message` whose `chat.type` is
/// `"private"`: a private chat's id is the user's).
fn dm(update_id: u64, user: u64, text: &str) -> String {
    json!({
        "update_id": 730_200_000 + update_id,
        "message": {
            "message_id": 2_000 + update_id,
            "from": {"id": user, "is_bot": false, "first_name": "Pat", "language_code": "en"},
            "chat": {"id": user, "first_name": "Pat", "type": "private"},
            "date": 1_767_225_600 + update_id,
            "text": text
        }
    })
    .to_string()
}

/// The code in a pairing reply, after "antler pairing approve ".
fn code_in(reply: &Value) -> String {
    let text = reply["text"].as_str().unwrap_or_default();
    let (_, rest) = text
        .split_once("antler pairing approve ")
        .unwrap_or_else(|| panic!("no pairing command in {text}"));
    rest.chars().take(8).collect()
}

async fn pairing_cli(rig: &ChildRig, args: &[&str]) -> (Option<i32>, String, String) {
    let config = rig.config.to_str().unwrap();
    let mut all = vec!["pairing"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--config", config]);
    run_binary(&all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_user_pairs_with_a_code_an_operator_approves_through_the_running_serve() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    // No allowlists and no dm_policy: pairing is the default.
    let telegram = api.config("").replace("dm_policy = \"open\"\n", "");
    assert!(!telegram.contains("dm_policy"));
    let rig = ChildRig::new(
        &model,
        &format!("{telegram}[channels.api]\ntoken = \"{ADMIN_TOKEN}\"\n"),
    );
    let mut serve = rig.serve().await;
    let base = serve.client.base.clone();

    // Unknown: a code with their id and the command, and nothing runs.
    assert_eq!(
        post(&base, &dm(1, ADA, "hello"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(1).await;
    let text = sent[0]["text"].as_str().unwrap();
    assert_eq!(sent[0]["chat_id"], ADA);
    let code = code_in(&sent[0]);
    assert!(
        text.contains(&format!("Your pairing code is {code}")),
        "{text}"
    );
    assert!(text.contains(&ADA.to_string()), "names their id: {text}");
    assert_eq!(code.len(), 8);
    // Asking again: the same code.
    assert_eq!(
        post(&base, &dm(2, ADA, "hello?"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(2).await;
    assert_eq!(code_in(&sent[1]), code, "the same code within the hour");
    assert_eq!(model.count(), 0, "no model call for an unknown user");

    // The pairing API is the operator's: no token or a wrong one is refused.
    let http = reqwest::Client::new();
    let url = format!("{base}/api/v1/pairing");
    let anonymous = http.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let approve_url = format!("{base}/api/v1/pairing/approve");
    let wrong = http
        .post(&approve_url)
        .bearer_auth("not-the-token")
        .json(&json!({"code": code}))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let listed: Value = http
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["pending"][0]["code"], code.as_str());
    assert_eq!(listed["pending"][0]["user_id"], ADA.to_string());
    assert_eq!(listed["pending"][0]["channel"], "telegram");

    // The CLI lists and approves through the running serve (the store is locked by it).
    let (status, out, err) = pairing_cli(&rig, &["list"]).await;
    assert_eq!(status, Some(0), "{err}");
    assert!(
        out.contains(&code) && out.contains(&ADA.to_string()),
        "{out}"
    );
    let (status, out, err) = pairing_cli(&rig, &["approve", &code.to_lowercase()]).await;
    assert_eq!(status, Some(0), "{err}");
    assert!(
        out.contains(&format!("approved telegram user {ADA}; they may talk now")),
        "{out}"
    );

    // At once: their next message reaches the model.
    assert_eq!(
        post(&base, &dm(3, ADA, "status payments-api"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(3).await;
    assert_eq!(sent[2]["text"], "echo: status payments-api");
    assert_eq!(model.count(), 1);
    // Not an admin: switching skills is refused.
    assert_eq!(
        post(&base, &dm(4, ADA, "/skills disable nosuch"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(4).await;
    let not_admin = sent[3]["text"].as_str().unwrap();
    assert!(not_admin.starts_with("Only admins"), "{not_admin}");
    // The used code is gone.
    let (status, _, err) = pairing_cli(&rig, &["approve", &code]).await;
    assert_eq!(status, Some(1));
    assert!(
        err.contains("no pending pairing request has this code"),
        "{err}"
    );

    // Denied: the code is unusable, answering as an unknown code does.
    assert_eq!(
        post(&base, &dm(5, BOB, "hi"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(5).await;
    let denied = code_in(&sent[4]);
    assert_ne!(denied, code);
    let (status, out, err) = pairing_cli(&rig, &["deny", &denied]).await;
    assert_eq!(status, Some(0), "{err}");
    assert!(
        out.contains(&format!(
            "denied the pairing request of telegram user {BOB}"
        )),
        "{out}"
    );
    let (status, _, err) = pairing_cli(&rig, &["approve", &denied]).await;
    assert_eq!(status, Some(1));
    assert!(
        err.contains("no pending pairing request has this code"),
        "{err}"
    );
    let (_, _, unknown) = pairing_cli(&rig, &["approve", "ZZZZ2222"]).await;
    assert_eq!(
        unknown, err,
        "a denied code and an unknown one answer alike"
    );
    let through_api = http
        .post(&approve_url)
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"code": denied}))
        .send()
        .await
        .unwrap();
    assert_eq!(through_api.status(), StatusCode::NOT_FOUND);

    // Bob asks again, gets a new code, and is approved as an admin.
    assert_eq!(
        post(&base, &dm(6, BOB, "hi again"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(6).await;
    let second = code_in(&sent[5]);
    assert_ne!(second, denied);
    let (status, out, err) = pairing_cli(&rig, &["approve", &second, "--admin"]).await;
    assert_eq!(status, Some(0), "{err}");
    assert!(
        out.contains(&format!("approved telegram user {BOB} as an admin")),
        "{out}"
    );
    assert_eq!(
        post(&base, &dm(7, BOB, "/skills disable nosuch"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(7).await;
    let as_admin = sent[6]["text"].as_str().unwrap();
    assert!(
        !as_admin.starts_with("Only admins"),
        "an admin's turn: {as_admin}"
    );
    assert_eq!(model.count(), 1, "commands make no model call");

    // Approvals are durable: after a restart Ada still talks.
    serve.kill().await;
    drop(serve);
    let _serve = rig.serve().await;
    assert_eq!(
        post(&base, &dm(8, ADA, "still here"), Some(SECRET)).await,
        StatusCode::OK
    );
    let sent = api.wait_for_sends(8).await;
    assert_eq!(sent[7]["text"], "echo: still here");
}

/// Approves `code` through the running antler's admin-only pairing API.
async fn approve(base: &str, code: &str) {
    let approved = reqwest::Client::new()
        .post(format!("{base}/api/v1/pairing/approve"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"code": code}))
        .send()
        .await
        .unwrap();
    assert_eq!(approved.status(), StatusCode::OK);
}

/// Slack: a DM (`channel_type: "im"`) from an unknown user gets a pairing code and runs
/// nothing; once approved, their next DM is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_slack_user_pairs_from_a_dm() {
    use antler_testkit::slack::{MockSlack, fixture, post_event};
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockSlack::start().await;
    let config = format!(
        "{}[channels.api]\ntoken = \"{ADMIN_TOKEN}\"\n",
        api.config("dm_policy = \"pairing\"\n")
    );
    let app = crate::support::TestApp::spawn(&model, &config).await;
    let dm = fixture("slack_message_im.json");
    assert_eq!(post_event(&app.base, &dm).await, StatusCode::OK);
    let posted = api.wait_for_posts(1).await;
    assert_eq!(posted[0]["channel"], "D0ADA00001", "answered in the DM");
    let text = posted[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("U0ADA00001"),
        "the user learns their id: {text}"
    );
    let code = code_in(&posted[0]);
    assert_eq!(model.count(), 0, "nothing ran");

    approve(&app.base, &code).await;
    let again = dm
        .replace("Ev0OPS0000A2", "Ev0OPS0000A3")
        .replace("1767225700.000300", "1767225710.000400")
        .replace("status payments-api", "hello again");
    assert_eq!(post_event(&app.base, &again).await, StatusCode::OK);
    let posted = api.wait_for_posts(2).await;
    assert_eq!(posted[1]["text"], "echo: hello again");
    app.shutdown().await;
}

/// Feishu: a p2p message from an unknown user gets a pairing code and runs nothing; once
/// approved, their next message is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_feishu_user_pairs_from_a_p2p_chat() {
    use antler_testkit::feishu::{ADA as FEISHU_ADA, MockFeishu, p2p, post};
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockFeishu::start().await;
    let config = format!(
        "{}[channels.api]\ntoken = \"{ADMIN_TOKEN}\"\n",
        api.config("dm_policy = \"pairing\"\n")
    );
    let app = crate::support::TestApp::spawn(&model, &config).await;
    let first = p2p("om_pair_1", "text", &json!({"text": "hello"}));
    assert_eq!(post(&app.base, &first).await, StatusCode::OK);
    let replies = api.wait_for_replies(1).await;
    let shown = antler_testkit::feishu::shown(&replies[0].1);
    assert!(
        shown.contains(FEISHU_ADA),
        "the user learns their id: {shown}"
    );
    let code = code_in(&json!({ "text": shown }));
    assert_eq!(model.count(), 0, "nothing ran");

    approve(&app.base, &code).await;
    let second = p2p("om_pair_2", "text", &json!({"text": "and now?"}));
    assert_eq!(post(&app.base, &second).await, StatusCode::OK);
    let replies = api.wait_for_replies(2).await;
    assert!(
        antler_testkit::feishu::shown(&replies[1].1).contains("echo: and now?"),
        "{replies:?}"
    );
    app.shutdown().await;
}
