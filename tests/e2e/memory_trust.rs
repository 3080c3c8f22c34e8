//! Memory a team can trust, end to end over real HTTP with the scripted mock model: a one-off
//! permission the updater labels `transactional` is never stored (and is counted), each
//! memory update of a thread reads only the messages after the last one the updater saw
//! (the ones before marked `(seen)`), and a user's personal fact never reaches the model
//! request of their group message, while their work fact does and their direct message
//! carries both.

use antler_testkit::telegram::{MockTelegram, SECRET, fixture, post};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::mock_model::Recorded;
use crate::support::{Behaviour, MEMORY_PROMPT, MockModel, TestApp, metric_value, wait_until};

const PERMISSION: &str = "You may delete the staging bucket today";
const TEA: &str = "I love green tea";
const LYON: &str = "I live in Lyon";

fn is_updater(request: &Recorded) -> bool {
    request
        .messages()
        .first()
        .and_then(|m| m["content"].as_str())
        .is_some_and(|s| s.starts_with(MEMORY_PROMPT))
}

/// The conversation part of the updater request whose new messages hold `text`.
fn updater_reading(requests: &[Recorded], text: &str) -> Option<String> {
    requests
        .iter()
        .filter(|r| is_updater(r))
        .map(Recorded::last_user_text)
        .find(|conversation| conversation.contains(&format!("\nUser: {text}")))
}

/// A labelled fact as the updater answers it.
fn fact(content: &str, durability: &str, authority: &str) -> Value {
    json!({"content": content, "category": "context", "confidence": 0.95,
           "scope": "user", "durability": durability, "authority": authority,
           "about": "personal"})
}

async fn say(app: &TestApp, text: &str) {
    let answer = app
        .post(&json!({"conversation": "ada-1", "user": "ada", "text": text, "wait": true}))
        .await;
    assert!(answer.status.is_success(), "{}", answer.text);
}

/// Ada's stored facts, once the document holds at least `min` of them (or exists, for 0).
async fn facts_once(app: &TestApp, min: usize) -> Vec<String> {
    wait_until("the memory document is written", || async move {
        let answer = app.get("/api/v1/memory/api:ada").await;
        if answer.status != StatusCode::OK {
            return None;
        }
        let facts: Vec<String> = answer.json["facts"]
            .as_array()?
            .iter()
            .filter_map(|f| f["content"].as_str().map(str::to_owned))
            .collect();
        (facts.len() >= min).then_some(facts)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_off_permission_is_dropped_and_each_update_reads_only_new_messages() {
    let mock = MockModel::start(Behaviour::MemoryAnswers(vec![
        (
            "staging bucket".to_owned(),
            json!({"newFacts": [fact("may delete the staging bucket today", "temporary", "transactional")]}),
        ),
        (
            "green tea".to_owned(),
            json!({"newFacts": [fact("Ada loves green tea", "durable", "descriptive")]}),
        ),
    ]))
    .await;
    let app = TestApp::spawn(&mock, "[memory]\nenabled = true\ndebounce_seconds = 0\n").await;

    say(&app, PERMISSION).await;
    // The update ran (its document is written) and stored nothing.
    assert_eq!(facts_once(&app, 0).await, Vec::<String>::new());
    // Counted once the document is written: waited for.
    wait_until("the dropped fact is counted", || async {
        let metrics = app.get("/metrics").await.text;
        (metric_value(
            &metrics,
            r#"antler_memory_facts_dropped_total{reason="durability"}"#,
        ) >= Some(1.0))
        .then_some(())
    })
    .await;

    // The second update of the thread: the first turn only as seen context.
    say(&app, TEA).await;
    assert_eq!(facts_once(&app, 1).await, ["Ada loves green tea"]);
    let requests = mock.requests();
    let second = updater_reading(&requests, TEA).expect("the second update");
    assert!(
        second.contains(&format!("(seen) User: {PERMISSION}")),
        "{second}"
    );
    assert!(
        !second.contains(&format!("\nUser: {PERMISSION}")),
        "the first turn is not new to the updater: {second}"
    );

    // The third reads the second turn as context and nothing older.
    say(&app, LYON).await;
    let third = wait_until("the third update ran", || {
        let found = updater_reading(&mock.requests(), LYON);
        async move { found }
    })
    .await;
    assert!(third.contains(&format!("(seen) User: {TEA}")), "{third}");
    assert!(!third.contains("staging bucket"), "{third}");
    assert_eq!(
        mock.requests().iter().filter(|r| is_updater(r)).count(),
        3,
        "one update per turn"
    );
    app.shutdown().await;
}

/// The hidden context message (`<context>…`) of the chat request holding `marker`.
fn context_of(requests: &[Recorded], marker: &str) -> Option<String> {
    let request = requests
        .iter()
        .rev()
        .find(|r| !is_updater(r) && r.last_user_text().contains(marker))?;
    let messages = request.messages();
    let last_user = messages.iter().rposition(|m| m["role"] == "user")?;
    let before = messages.get(last_user.checked_sub(1)?)?;
    let text = before["content"].as_str().unwrap_or_default();
    Some(if text.starts_with("<context>") {
        text.to_owned()
    } else {
        String::new()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_personal_fact_stays_out_of_the_request_of_a_group_message() {
    let model = MockModel::start(Behaviour::Echo).await;
    let api = MockTelegram::start().await;
    let app = TestApp::spawn(&model, &api.config("[memory]\nenabled = true\n")).await;

    // Lin (the author of the group fixture) has a personal and a work fact, and a personal
    // summary.
    let document = json!({
        "version": 1,
        "user": {
            "workContext": {"summary": "Runs the SRE rota."},
            "personalContext": {"summary": "private-summary-marker"}
        },
        "facts": [
            {"id": "f1", "content": "Lin is expecting a baby", "category": "context",
             "confidence": 0.95, "createdAt": "2026-11-30T10:00:00Z", "about": "personal"},
            {"id": "f2", "content": "Lin owns the web-api service", "category": "knowledge",
             "confidence": 0.9, "createdAt": "2026-11-30T10:00:00Z", "about": "work"}
        ]
    });
    let put = app
        .client
        .http
        .put(format!(
            "{}/api/v1/memory/telegram:5550001002",
            app.client.base
        ))
        .json(&document)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);

    assert_eq!(
        post(&app.base, &fixture("tg_group_mention"), Some(SECRET)).await,
        StatusCode::OK
    );
    api.wait_for_sends(1).await;
    let group = context_of(&model.requests(), "restart web-api").expect("the group request");
    assert!(group.contains("Lin owns the web-api service"), "{group}");
    assert!(group.contains("Runs the SRE rota."), "{group}");
    let group_body = model
        .requests()
        .iter()
        .find(|r| r.last_user_text().contains("restart web-api"))
        .map(|r| r.body.to_string())
        .unwrap();
    assert!(!group_body.contains("baby"), "{group_body}");
    assert!(
        !group_body.contains("private-summary-marker"),
        "{group_body}"
    );

    // Lin's direct message carries everything.
    let direct = fixture("tg_private_text")
        .replace("730100001", "730100009")
        .replace("5550001001", "5550001002")
        .replace("status payments-api", "dm-marker status");
    assert_eq!(post(&app.base, &direct, Some(SECRET)).await, StatusCode::OK);
    api.wait_for_sends(2).await;
    let dm = context_of(&model.requests(), "dm-marker").expect("the direct request");
    assert!(dm.contains("Lin is expecting a baby"), "{dm}");
    assert!(dm.contains("private-summary-marker"), "{dm}");
    app.shutdown().await;
}
