//! Long-term memory end to end, through the API channel and the mock model: what user A says
//! is learned by the updater call (debounce 0), the next thread's request for A carries the
//! fact in `<memory>` (in a hidden user-role message, never the system prompt), and nothing
//! of it ever reaches a request made for user B.

use serde_json::{Value, json};

use crate::support::mock_model::Recorded;
use crate::support::{Behaviour, MEMORY_PROMPT, MockModel, TestApp, wait_until};

const FACT: &str = "Ada loves green tea";

fn is_updater(request: &Recorded) -> bool {
    request
        .messages()
        .first()
        .and_then(|m| m["content"].as_str())
        .is_some_and(|s| s.starts_with(MEMORY_PROMPT))
}

fn system_text(request: &Recorded) -> String {
    request
        .messages()
        .first()
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The hidden context message of a chat request: the user-role message just before the
/// turn's own.
fn context_text(request: &Recorded) -> Option<String> {
    let messages = request.messages();
    let last_user = messages.iter().rposition(|m| m["role"] == "user")?;
    let before = messages.get(last_user.checked_sub(1)?)?;
    (before["role"] == "user")
        .then(|| before["content"].as_str().unwrap_or_default().to_owned())
        .filter(|text| text.starts_with("<context>"))
}

async fn say(app: &TestApp, user: &str, conversation: &str, text: &str) -> Value {
    let answer = app
        .post(&json!({"conversation": conversation, "user": user, "text": text, "wait": true}))
        .await;
    assert!(answer.status.is_success(), "{}", answer.text);
    answer.json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_learned_from_one_user_reaches_their_next_thread_and_no_one_else() {
    let mock = MockModel::start(Behaviour::Memory {
        trigger: "green tea".to_owned(),
        fact: FACT.to_owned(),
    })
    .await;
    let app = TestApp::spawn(&mock, "[memory]\nenabled = true\ndebounce_seconds = 0\n").await;

    say(&app, "ada", "ada-1", "I love green tea, remember that").await;
    wait_until("the updater learned the fact", || {
        let learned = mock
            .requests()
            .iter()
            .any(|r| is_updater(r) && r.last_user_text().contains("I love green tea"));
        async move { learned.then_some(()) }
    })
    .await;

    // Ada's next thread carries the fact once the worker stored it (a poll later).
    let mut attempt = 0;
    let (context, ada_system) = wait_until("ada's next thread carries the fact", || {
        attempt += 1;
        let conversation = format!("ada-next-{attempt}");
        let app = &app;
        let mock = &mock;
        async move {
            say(app, "ada", &conversation, "what do I like?").await;
            let requests = mock.requests();
            let request = requests
                .iter()
                .rev()
                .find(|r| !is_updater(r) && r.last_user_text().contains("what do I like?"))?;
            let context = context_text(request)?;
            context
                .contains(FACT)
                .then(|| (context, system_text(request)))
        }
    })
    .await;
    assert!(
        context.contains("<memory>") && context.contains("</memory>"),
        "{context}"
    );
    assert!(
        context.contains(&format!("- [preference | 0.90] {FACT}")),
        "{context}"
    );
    assert!(!ada_system.contains(FACT), "{ada_system}");

    // Bob talks after the fact is learned: his request has no memory block, and no request
    // made for him (chat or updater) holds Ada's fact.
    say(&app, "bob", "bob-1", "bob-marker: what do I like?").await;
    wait_until("bob's conversation reached the updater", || {
        let seen = mock
            .requests()
            .iter()
            .any(|r| is_updater(r) && r.last_user_text().contains("bob-marker"));
        async move { seen.then_some(()) }
    })
    .await;
    let requests = mock.requests();
    let bobs: Vec<&Recorded> = requests
        .iter()
        .filter(|r| r.body.to_string().contains("bob-marker"))
        .collect();
    assert!(bobs.len() >= 2, "bob's chat and updater requests");
    for request in bobs {
        let body = request.body.to_string();
        assert!(
            !body.contains("green tea"),
            "ada's memory leaked into bob's request: {body}"
        );
        if !is_updater(request) {
            // The system prompt is byte-identical for both users.
            assert_eq!(system_text(request), ada_system);
            assert!(
                !context_text(request).is_some_and(|c| c.contains("<memory>")),
                "{body}"
            );
        }
    }
    app.shutdown().await;
}
